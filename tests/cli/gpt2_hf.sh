#!/usr/bin/env bash
# labels: e2e
# timeout: 900
# cores: 1
# mgtrain's GPT against Hugging Face's GPT2LMHeadModel (transformers from PyPI, on Debian's
# PyTorch: tests/tools/transformers-python), the same weights, on a GPT-2 of 2 blocks, 4 heads,
# 32 channels, context 16 and bytes (tests/tools/gpt2_hf.py says how each bound follows from
# rounding):
#   - mgtrain's weights load into GPT2LMHeadModel with load_model(strict=True); saved by
#     transformers (save_pretrained, safetensors) they load back, and mgtrain predicts from that
#     file: the same logits;
#   - logits against float64 within the rounding bound; one step's loss and the summed gradient
#     of every tensor likewise;
#   - greedy generation with the key/value cache: the tokens of float64 greedy decoding;
#   - three AdamW steps (weight decay on the matrices) as close to a float64 run as PyTorch's
#     float32 run is (0.87 to 0.95 times its distance at this batch; gpt2_hf.py: the scatter
#     allowed).
# About 30 s after the environment exists (its first making downloads transformers, ~10 MB).
source "$(dirname "$0")/lib.bash"
PY=$("$MGT_SRC/tests/tools/transformers-python") || { bad "no Python with transformers"; finish; exit 1; }
HF=("$PY" "$MGT_SRC/tests/tools/gpt2_hf.py")
hf() { # hf NAME ARGS... : gpt2_hf.py NAME ARGS... must pass
  local name=$1
  if "${HF[@]}" "$@" >"$name.log" 2>&1; then ok "$name: $(grep -c '^ok' "$name.log") checks"; grep '^ok' "$name.log"
  else bad "$name:"; tail -20 "$name.log"; fi
}

B=6 T=16
cat >cfg.json <<JSON
{"vocab": 256, "context": $T, "channels": 32, "layers": 2, "heads": 4}
JSON
sed -e "s/^context = 32/context = $T/" -e 's/^rate = 0.1/rate = 0.0/' -e 's/^dropout = 0.1/dropout = 0.0/' \
  "$MGT_SRC/tests/cli/lm_tiny.cfg" >hf.cfg
# a training split of exactly B windows (B T + 1 bytes: each step reads them all) and a
# validation split of a few more
mkdir -p text data
head -c $((B * T + 1 + 900)) "$MGT_SRC/README.md" >text/readme.txt
"$MGT_BIN" convert --text text data --val-fraction 0.45 >conv.log 2>&1 || { bad "convert"; cat conv.log; }
/usr/bin/python3 - "$B" "$T" <<'PY' || bad "the training split"
import struct, sys
b, t = int(sys.argv[1]), int(sys.argv[2])
raw = open("data/train.bin", "rb").read()
n = b * t + 1
head = struct.pack("<3i", 20240520, 1, n) + bytes(1012)
open("data/train.bin.new", "wb").write(head + raw[1024:1024 + 2 * n])
PY
mv data/train.bin.new data/train.bin

# Weights to start from (one Adam step from mgtrain's initial ones, so that no tensor is at its
# initial constant), then one step from them with its loss and summed gradients dumped.
mpi 1 --model hf.cfg --data data --batch-size $B --max-steps 1 --no-validation --verbose 0 \
  --out w0 >w0.log 2>&1 || { bad "weights to start from"; tail -5 w0.log; }
W0=w0/weights.safetensors
MGT_DUMP_GRADIENTS=$PWD/g.st mpi 1 --model hf.cfg --data data --batch-size $B --optimizer sgd \
  --init-weights $W0 --max-steps 1 --no-validation --verbose 2 --out step >step.log 2>&1 ||
  { bad "one step"; tail -5 step.log; }
loss=$("$PY" -c "import json; print(json.loads(open('step/metrics.jsonl').readlines()[-1])['loss'])")
"$MGT_BIN" predict --model hf.cfg --weights $W0 --data data --output l.npy >pred.log 2>&1 ||
  { bad "predict"; cat pred.log; }
hf weights cfg.json $W0 l.npy data/val.bin hf
hf step cfg.json $W0 g.st data/train.bin "$loss"
# The file transformers wrote, into mgtrain: the same logits as its own weights gave.
"$MGT_BIN" predict --model hf.cfg --weights hf/model.safetensors --data data --output l2.npy \
  >pred2.log 2>&1 || { bad "predict from transformers' model.safetensors"; cat pred2.log; }
cmp -s l.npy l2.npy && ok "transformers' model.safetensors loads into mgtrain: the same logits" ||
  bad "logits from transformers' file differ"

# Greedy generation with the key/value cache, past the context (16) so that the cache is rebuilt.
"$MGT_BIN" generate --model hf.cfg --weights $W0 --prompt "The model" --max-new-tokens 24 \
  --temperature 0 >gen.bin 2>gen.log || { bad "generate"; cat gen.log; }
hf generate cfg.json $W0 "The model" gen.bin 24
expect_fail "generate: a prompt of token ids for a byte-level model is text" \
  "generate needs --prompt" "$MGT_BIN" generate --model hf.cfg --weights $W0

# Three AdamW steps.
{ cat hf.cfg; printf 'weight_decay = 0.1\nepsilon = 1e-8\n'; } >aw.cfg
mpi 1 --model aw.cfg --data data --batch-size $B --optimizer adamw --lr 0.003 --epochs 3 \
  --no-validation --verbose 0 --init-weights $W0 --out aw >aw.log 2>&1 ||
  { bad "AdamW"; tail -5 aw.log; }
hf adamw cfg.json $W0 aw/weights.safetensors data/train.bin 0.003 0.1 1e-8
finish
