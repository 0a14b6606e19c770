#!/usr/bin/env bash
# labels: mpi
# timeout: 600
# Language models end to end, on a GPT of two blocks (tests/cli/lm_tiny.cfg, 34k parameters,
# context 32): 16 short runs, about 35 s of CPU, 2 minutes of wall time on a busy 2-core machine
# (mostly mpirun's start-ups).
#
# 1. convert --text: text files into llm.c shards of bytes (magic, version 1, the count, uint16
#    tokens; each file's last tenth, from a line start, in val.bin); binary files left out, a
#    file's second name (a link) read once; an existing shard never replaced.
# 2. Shards read in both formats (llm.c's and nanoGPT's raw uint16), training whose loss falls
#    (with perplexity and bits per byte beside it);
#    synthetic tokens; the errors of a token set that does not fit the model.
# 3. Rank counts: one step's summed gradients on 2 and 3 ranks equal 1 rank's within float32
#    rounding of a sum, 2 u sqrt(K) of each tensor's largest element (tests/tools/gradcmp.py) for
#    K = 2 x batch x context addends (every position of every sample, through the tied table's
#    two uses); dropout (embedding and attention weights) on, its masks keyed by each sample's
#    place in the global batch. And --reproducible: the same weights, byte for byte, on 1, 2 and
#    3 ranks, and resumed on 3 ranks after 2.
# 4. GPT-2 124M's model file: Hugging Face's parameter count.
source "$(dirname "$0")/lib.bash"
GRADCMP=(/usr/bin/python3 "$MGT_SRC/tests/tools/gradcmp.py")
TINY=$MGT_SRC/tests/cli/lm_tiny.cfg

# 1. Text into shards: three files of text and one binary, generated.
mkdir -p text
for f in a b c; do
  for i in $(seq 1 200); do echo "$f line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13))"; done >text/$f.txt
done
printf 'bin\0ary' >text/d.dat
ln -s a.txt text/e.u8 # a second name of a.txt (Debian's fortunes has NAME.u8 -> NAME): read once
"$MGT_BIN" convert --text text tok >conv.log 2>&1 && ok "convert --text: $(tail -1 conv.log)" ||
  { bad "convert --text"; cat conv.log; }
grep -q "from 3 files (binary files and links to a file read already left out)" conv.log &&
  ok "a file reached by two names is read once" || bad "a link read again: $(tail -1 conv.log)"
grep -q "left out text/d.dat" conv.log && ok "the binary file is left out and named" ||
  bad "binary file not named: $(cat conv.log)"
/usr/bin/python3 - <<'PY' && ok "shards: llm.c's header, uint16 bytes, each file's last tenth in val.bin" || bad "shard contents"
import struct
def read(p):
    raw = open(p, "rb").read()
    magic, ver, n = struct.unpack("<3i", raw[:12])
    assert magic == 20240520 and ver == 1 and len(raw) == 1024 + 2 * n, (magic, ver, n, len(raw))
    return bytes(struct.unpack(f"<{n}H", raw[1024:]))
train, val = read("tok/train.bin"), read("tok/val.bin")
want_t, want_v = b"", b""
for f in "abc":
    t = open(f"text/{f}.txt", "rb").read()
    cut = len(t) - int(len(t) * 0.1)
    while cut < len(t) and t[cut - 1:cut] != b"\n":
        cut += 1
    want_t, want_v = want_t + t[:cut], want_v + t[cut:]
assert train == want_t and val == want_v, (len(train), len(want_t), len(val), len(want_v))
PY
expect_fail "an existing shard is not replaced" "tok/train.bin already exists" \
  "$MGT_BIN" convert --text text tok

# 2. Training from the shards: the loss falls over 3 epochs (48 steps).
mpi 1 --model "$TINY" --data tok --epochs 3 --verbose 2 --out run1 >run1.log 2>&1 ||
  { bad "training on the shards"; tail -5 run1.log; }
first=$(grep -m1 -oE "^Epoch 1/3.* loss: [0-9.]+" run1.log | grep -oE "[0-9.]+$")
last=$(grep -m1 -oE "^Epoch 3/3.* loss: [0-9.]+" run1.log | grep -oE "[0-9.]+$")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' &&
  ok "the loss falls: $first -> $last (bytes, vocab 256)" || bad "the loss did not fall: $first -> $last"
# perplexity and bits per byte beside the losses: e^loss and loss / ln 2 (to the 4 decimals shown)
awk '/^Epoch 3\/3/ { for (i = 1; i <= NF; i++) v[$i] = $(i + 1)
  ok = v["val_loss:"] > 0 && sqrt((v["val_bpb:"] - v["val_loss:"] / log(2)) ^ 2) < 2e-4 &&
       sqrt((v["val_ppl:"] / exp(v["val_loss:"]) - 1) ^ 2) < 2e-4 }
  END { exit !ok }' run1.log && ok "validation perplexity and bits per byte: $(grep -oE 'val_ppl: [0-9.]+ - val_bpb: [0-9.]+' run1.log | tail -1)" ||
  bad "perplexity and bits per byte: $(grep '^Epoch 3' run1.log)"
# nanoGPT's format: the same tokens as raw uint16 train.bin / val.bin give the same run
mkdir -p raw
for s in train val; do tail -c +1025 tok/$s.bin >raw/$s.bin; done
mpi 1 --model "$TINY" --data raw --epochs 1 --verbose 0 --out run2 >run2.log 2>&1 ||
  { bad "raw uint16 shards"; tail -5 run2.log; }
mpi 1 --model "$TINY" --data tok --epochs 1 --verbose 0 --out run3 >run3.log 2>&1
cmp -s run2/weights.safetensors run3/weights.safetensors &&
  ok "nanoGPT's raw uint16 shards train as llm.c's do (the same weights)" || bad "raw shards differ"
mpi 1 --model "$TINY" --data synthetic --synthetic-samples 48 --epochs 1 --verbose 0 --out syn \
  >syn.log 2>&1 && ok "synthetic tokens" || { bad "synthetic tokens"; tail -3 syn.log; }
# errors: each names the file or the model and what to do
sed 's/^vocab = 256/vocab = 64/; s/^units = 256/units = 64/' "$TINY" >v64.cfg
expect_fail "a token beyond the vocabulary" "tok/train.bin holds token [0-9]+ .* vocab is 64" \
  mpi 1 --model v64.cfg --data tok --epochs 1 --out bad1
expect_fail "an image model on token shards" "holds token shards, which a language model reads" \
  mpi 1 --model "$MGT_SRC/examples/mlp.cfg" --data tok --epochs 1 --out bad2
mkdir -p cut && head -c 2000 tok/train.bin >cut/train.bin
expect_fail "a shard cut short" "cut/train.bin: its header says [0-9]+ tokens .* cut short" \
  mpi 1 --model "$TINY" --data cut --epochs 1 --no-validation --out bad3
expect_fail "a token model on image data" "reads token ids, but .* holds no token shards" \
  mpi 1 --model "$TINY" --data text --epochs 1 --out bad4

# 3. Rank counts.
for np in 1 2 3; do
  MGT_DUMP_GRADIENTS=$PWD/g$np.st mpi $np --model "$TINY" --data tok --max-steps 1 \
    --no-validation --verbose 0 --out g$np >g$np.log 2>&1 || { bad "gradients on $np ranks"; tail -3 g$np.log; }
done
for np in 2 3; do
  out=$("${GRADCMP[@]}" g1.st g$np.st transformer=768 lm_head=768 2>&1) &&
    ok "one step's gradients, 1 vs $np ranks: $(sort -t' ' -k5 -g <<<"$out" | tail -1)" ||
    { bad "one step's gradients, 1 vs $np ranks"; echo "$out"; }
done
R=(--model "$TINY" --data tok --epochs 2 --reproducible --no-validation --verbose 0)
for np in 1 2 3; do mpi $np "${R[@]}" --out r$np >r$np.log 2>&1 || { bad "--reproducible, $np ranks"; tail -3 r$np.log; }; done
mpi 2 "${R[@]}" --max-steps 20 --out rs >rs.log 2>&1 && mpi 3 "${R[@]}" --resume --out rs >>rs.log 2>&1 ||
  { bad "--reproducible, stopped and resumed"; tail -3 rs.log; }
if cmp -s r1/weights.safetensors r2/weights.safetensors && cmp -s r1/weights.safetensors r3/weights.safetensors &&
  cmp -s r1/weights.safetensors rs/weights.safetensors; then
  ok "--reproducible: the same weights on 1, 2 and 3 ranks, and resumed on 3 after 2"
else bad "--reproducible weights differ: $(sha256sum r1/w* r2/w* r3/w* rs/w* | cut -c1-16)"; fi

# 4. GPT-2 124M.
"$MGT_BIN" summary --model "$MGT_SRC/examples/gpt2-124m.cfg" >sum.log 2>&1
grep -q "^Trainable params: 124,439,808$" sum.log && ok "GPT-2 124M: 124,439,808 parameters" ||
  bad "GPT-2 124M: $(grep params sum.log)"
finish
