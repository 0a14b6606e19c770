#!/usr/bin/env bash
# Language models on the GPU path (emulated GPUs, MGT_BIN = mgtrain_emu), on a GPT of two blocks
# (tests/cli/lm_tiny.cfg: embeddings, layer norms, fused QKV, causal attention with dropout, GELU,
# residual sums, the tied head) at batch 4 over 32-byte windows: about 25-30 s on 2 busy cores, most
# of it mpirun's start-ups and the emulated kernels.
#
# 1. One step's summed gradients on 2 emulated GPUs against 2 CPU ranks, from the same initial
#    weights and windows (the dropout masks are the same: keyed by each sample's place in the
#    global batch): tests/tools/gradcmp.py's bound, 2 u sqrt(K) of each tensor's largest element
#    for K = 2 x batch x context addends (every position through the tied table's two uses), as
#    tests/cli/lm.sh holds rank counts to: the two backends differ in the order of their sums and
#    in their exponentials (a few units in the last place a term), which is rounding of the same
#    size.
# 2. Four SGD steps: the loss of every step on 2 GPUs as on 2 CPU ranks to 1e-5 relative, and the
#    weights to 1e-5 (SGD, whose update is a continuous function of the gradient, keeps rounding
#    differences at their size; Adam's first steps would turn a gradient of rounding size into a
#    full step of either sign).
# 3. --reproducible with the model's Adam: the same weights, byte for byte, on 1 and 2 GPUs.
# 4. The same with --precision bf16.
# 5. mgtrain generate on the GPU (the key and value cache): the CPU's greedy text.
# 6. CUDA graphs replayed: the same bytes as without.
# 7. cuDNN's fused attention in bf16: the own kernels' losses, and the same bytes with graphs.
source "$MGT_SRC/tests/cli/lib.bash"
: "${MGT_CPU_BIN:?}"
export OPENBLAS_NUM_THREADS=1 # emulated ranks share this machine's cores
GRADCMP=(/usr/bin/python3 "$MGT_SRC/tests/tools/gradcmp.py")
emu() { # emu GPUS NP ARGS...
  local g=$1 np=$2; shift 2
  MGT_EMU_GPUS=$g timeout 600 mpirun --oversubscribe --bind-to none -x MGT_EMU_GPUS \
    -x MGT_DUMP_GRADIENTS -np "$np" "$MGT_BIN" "$@"
}
cpu() { # cpu NP ARGS...
  local np=$1; shift
  timeout 600 mpirun --oversubscribe --bind-to none -x MGT_DUMP_GRADIENTS -np "$np" \
    "$MGT_CPU_BIN" "$@" --device cpu
}
cd "$T" || exit 1
mkdir -p text
for i in $(seq 1 150); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13))"; done >text/a.txt
"$MGT_CPU_BIN" convert --text text tok >conv.log 2>&1 || { bad "convert --text"; cat conv.log; }
B=(--model "$MGT_SRC/tests/cli/lm_tiny.cfg" --data tok --batch-size 4 --no-validation --verbose 0)

# 1. One step's gradients.
MGT_DUMP_GRADIENTS=$PWD/gg.st emu 2 2 train "${B[@]}" --verbose 2 --max-steps 1 --out gg >gg.log 2>&1 ||
  { bad "one step on 2 emulated GPUs"; tail -5 gg.log; }
MGT_DUMP_GRADIENTS=$PWD/gc.st cpu 2 train "${B[@]}" --max-steps 1 --out gc >gc.log 2>&1 ||
  { bad "one step on 2 CPU ranks"; tail -5 gc.log; }
grep -q "backend gpu" gg.log && ok "trains on the emulated GPUs" || bad "not on the GPU: $(head -5 gg.log)"
out=$("${GRADCMP[@]}" gc.st gg.st transformer=256 lm_head=256 2>&1) &&
  ok "one step's gradients, 2 GPUs against 2 CPU ranks: $(sort -t' ' -k5 -g <<<"$out" | tail -1)" ||
  { bad "one step's gradients, 2 GPUs against 2 CPU ranks"; echo "$out"; }

# 2. Four SGD steps, losses and weights.
sed -e 's/^optimizer = adam/optimizer = sgd/' -e 's/^learning_rate = .*/learning_rate = 0.1/' \
  "$MGT_SRC/tests/cli/lm_tiny.cfg" >sgd.cfg
S=(--model sgd.cfg --data tok --batch-size 4 --no-validation --verbose 0 --max-steps 4 --log-every 1)
emu 2 2 train "${S[@]}" --out sg >sg.log 2>&1 || { bad "SGD on 2 emulated GPUs"; tail -5 sg.log; }
cpu 2 train "${S[@]}" --out sc >sc.log 2>&1 || { bad "SGD on 2 CPU ranks"; tail -5 sc.log; }
/usr/bin/python3 - sg/metrics_steps.jsonl sc/metrics_steps.jsonl <<'PY' &&
import json, sys
g = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
c = [json.loads(l)["loss"] for l in open(sys.argv[2]) if '"loss"' in l]
assert len(g) == len(c) == 4, (g, c)
worst = max(abs(a - b) / abs(b) for a, b in zip(g, c))
print(f"{worst:.2g}", " ".join(f"{a:.6f}" for a in g))
sys.exit(0 if worst <= 1e-5 else 1)
PY
  ok "4 SGD steps: every step's loss on 2 GPUs is the CPU's to 1e-5" ||
  bad "4 SGD steps: the losses differ: $(cat sg/metrics_steps.jsonl sc/metrics_steps.jsonl)"
same "4 SGD steps: weights, 2 GPUs against 2 CPU ranks" sg/weights.safetensors sc/weights.safetensors 1e-5

# 3. --reproducible.
R=("${B[@]}" --max-steps 3 --reproducible --repro-chunk 2)
for np in 1 2; do
  emu 2 $np train "${R[@]}" --out r$np >r$np.log 2>&1 || { bad "--reproducible on $np GPUs"; tail -5 r$np.log; }
done
h1=$(sha256sum r1/weights.safetensors 2>/dev/null | cut -c1-16)
h2=$(sha256sum r2/weights.safetensors 2>/dev/null | cut -c1-16)
[ -n "$h1" ] && [ "$h1" = "$h2" ] &&
  ok "--reproducible, 3 Adam steps: 2 GPUs = 1 GPU, byte for byte ($h1)" ||
  bad "--reproducible: 2 GPUs $h2, 1 GPU $h1"

# 4. --precision bf16 (bfloat16 activations, float arithmetic: test_gpu_seq checks each op):
#    trains, and --reproducible gives the same bytes on 1 and 2 GPUs there too.
for np in 1 2; do
  emu 2 $np train "${R[@]}" --precision bf16 --out b$np >b$np.log 2>&1 || { bad "bf16 on $np GPUs"; tail -5 b$np.log; }
done
h1=$(sha256sum b1/weights.safetensors 2>/dev/null | cut -c1-16)
h2=$(sha256sum b2/weights.safetensors 2>/dev/null | cut -c1-16)
[ -n "$h1" ] && [ "$h1" = "$h2" ] && [ "$h1" != "$(sha256sum r1/weights.safetensors | cut -c1-16)" ] &&
  ok "--precision bf16 --reproducible, 3 Adam steps: 2 GPUs = 1 GPU, byte for byte ($h1), not the float run's" ||
  bad "bf16 --reproducible: 2 GPUs $h2, 1 GPU $h1"
# 5. Generation (mgtrain generate, attn_decode with the key and value cache): greedy decoding
#    (--temperature 0) of 40 bytes from a model trained 120 steps on the CPU (3 s; it has learned
#    the text's lines, so that the attention decides what comes: a wrong scale of its scores
#    changes the text) gives the CPU's text on the emulated GPU, whose decoding kernel ran.
cpu 1 train --model "$MGT_SRC/tests/cli/lm_tiny.cfg" --data tok --batch-size 12 --epochs 100 \
  --max-steps 120 --no-validation --verbose 0 --out gen >gen.log 2>&1 || { bad "the model to generate from"; tail -3 gen.log; }
G=(generate --run gen --prompt "line 1" --max-new-tokens 40 --temperature 0)
"$MGT_CPU_BIN" "${G[@]}" >gen-cpu.txt 2>&1 || { bad "generate on the CPU"; tail -3 gen-cpu.txt; }
MGT_EMU_KERNELS=$PWD/gen-kernels.txt MGT_EMU_GPUS=1 timeout 300 "$MGT_BIN" "${G[@]}" >gen-gpu.txt 2>&1 ||
  { bad "generate on the emulated GPU"; tail -3 gen-gpu.txt; }
grep -q "^k_attn_decode" gen-kernels.txt && [ "$(wc -c <gen-cpu.txt)" -gt 40 ] && cmp -s gen-cpu.txt gen-gpu.txt &&
  ok "generate, greedy, 40 bytes on the GPU's decoding kernel: the CPU's text ($(head -c 46 gen-gpu.txt | tr '\n' ' '))" ||
  bad "generate: GPU '$(cat gen-gpu.txt)', CPU '$(cat gen-cpu.txt)'; kernels: $(grep -c attn gen-kernels.txt)"
# 6. CUDA graphs: the model without dropout (whose masks change each step) has its forward and
#    backward captured and replayed (cuBLAS and the sequence kernels inside a capture, the
#    attention's scratch reserved before it), and 10 steps give the same bytes as launching every
#    op each step.
sed -e '/^\[dropout\]/,/^rate/d' -e 's/^dropout = 0.1/dropout = 0/' "$MGT_SRC/tests/cli/lm_tiny.cfg" >nodrop.cfg
for g in on off; do
  MGT_EMU_READS=$PWD/$g.reads emu 1 1 train --model nodrop.cfg --data tok --batch-size 4 --max-steps 10 \
    --no-validation --verbose 2 --profile --cuda-graph $g --out cg$g >cg$g.log 2>&1 || { bad "graphs $g"; tail -3 cg$g.log; }
done
grep -q "^CUDA graphs: forward and backward replayed .* replayed (4)" cgon.log && [ "$(sed -n 's/^graphs //p' on.reads)" -gt 0 ] &&
  cmp -s cgon/weights.safetensors cgoff/weights.safetensors &&
  ok "CUDA graphs: replayed ($(sed -n 's/^graphs //p' on.reads) graph launches in 10 steps), the same weights as without" ||
  bad "CUDA graphs: $(grep '^CUDA graphs' cgon.log); launches $(sed -n 's/^graphs //p' on.reads)"
# 7. cuDNN's fused attention (cuda/gpu_sdpa.c, the emulated cuDNN's graph API): the model without
#    dropout in bf16, 4 SGD steps with it (MGT_GPU_ATTENTION=cudnn: a refusal would end the run)
#    and with the own kernels: the two differ by one bfloat16 rounding more of the weights P and
#    of dS (u = 2^-8 relative), through 4 steps of a smooth loss: every step's loss within 8 u;
#    and with CUDA graphs, its plans executed inside the capture and replayed: the same bytes as
#    without.
sed -e 's/^optimizer = adam/optimizer = sgd/' -e 's/^learning_rate = .*/learning_rate = 0.1/' nodrop.cfg >fsgd.cfg
F=(--model fsgd.cfg --data tok --batch-size 4 --max-steps 4 --log-every 1 --no-validation --verbose 2 --precision bf16)
for a in cudnn own; do
  MGT_GPU_ATTENTION=$a emu 1 1 train "${F[@]}" --cuda-graph off --out fa$a >fa$a.log 2>&1 || { bad "bf16 attention $a"; tail -3 fa$a.log; }
done
for g in on off; do
  MGT_GPU_ATTENTION=cudnn emu 1 1 train "${F[@]}" --max-steps 10 --profile --cuda-graph $g --out fg$g >fg$g.log 2>&1 ||
    { bad "bf16 fused attention, graphs $g"; tail -3 fg$g.log; }
done
/usr/bin/python3 - faown/metrics_steps.jsonl facudnn/metrics_steps.jsonl <<'PY' &&
import json, sys
o = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
f = [json.loads(l)["loss"] for l in open(sys.argv[2]) if '"loss"' in l]
assert len(o) == len(f) == 4, (o, f)
worst = max(abs(a - b) / abs(b) for a, b in zip(f, o))
print(f"{worst:.2g}")
sys.exit(0 if worst <= 8 * 2 ** -8 else 1)
PY
  ok "bf16, cuDNN's fused attention against the own kernels: 4 SGD steps' losses within 8 u" ||
  bad "fused attention: losses $(cat facudnn/metrics_steps.jsonl faown/metrics_steps.jsonl)"
! cmp -s facudnn/weights.safetensors faown/weights.safetensors &&
  grep -q "^CUDA graphs: forward and backward replayed .* replayed (4)" fgon.log &&
  cmp -s fgon/weights.safetensors fgoff/weights.safetensors &&
  ok "fused attention inside CUDA graphs: replayed, 10 steps' weights the same as launched op by op; the own kernels' bytes differ" ||
  bad "fused attention and graphs: $(grep '^CUDA graphs' fgon.log)"
finish
