#!/usr/bin/env bash
# labels: mpi
# Frozen layers (trainable = false, --freeze): Keras' layer.trainable = False.
#
# A small graph (convolution, batchnorm, separable and depthwise convolutions, a shortcut, concat,
# dense) with layers frozen in the middle of it, so that gradients still pass through frozen
# layers to trainable ones below: stem_bn by its trainable = false key, sep1 and dw by --freeze.
# 1. One step's gradients of the trainable tensors (MGT_DUMP_GRADIENTS) equal PyTorch's for the
#    same graph with those layers' parameters at requires_grad = False and the frozen batchnorm
#    normalising with its running statistics (tests/tools/torch_graph.py, float64), to 1e-5 of
#    each tensor's largest element (graph_torch.sh says why: float32 sums of up to 4096 terms,
#    about sqrt(K) u = 4e-6 relative, through a few layers); and the dump holds no tensor of a
#    frozen layer (none is computed).
# 2. Training on 2 ranks with many gradient buckets, resumed on 3 ranks with ZeRO-1: every
#    tensor of a frozen layer (the frozen batchnorm's running statistics included) is the same
#    bytes as at the start; the others moved. A resume that would freeze other layers is refused.
# 3. --reproducible with frozen layers: the same bytes on 1 and 2 ranks.
# 4. The GPU backend (the emulated CUDA stack, where it was built), whose convolution leaves out a
#    bias that a batchnorm in training cancels (fuse.c) but must keep it before a frozen one: 3
#    steps give the CPU's weights to 1e-4 (the two sum in other orders, about K u = 4e-6 a step
#    for the K <= 256 terms here: tests/cli/npy_gpu_emu.sh), the frozen tensors bit for bit.
# Cost: about 15 s on 2 cores (8 short runs of a 16x16 model, one PyTorch step).
source "$(dirname "$0")/lib.bash"
PY=/usr/bin/python3
TOOLS=$MGT_SRC/tests/tools
"$PY" -c "import torch, numpy" 2>/dev/null || { bad "PyTorch and numpy are missing (tests/run installs python3-torch)"; finish; exit 1; }

cat >all.cfg <<'CFG'
[input]
shape = 16,16,3
[conv2d]
name = stem
filters = 8
kernel = 3
padding = same
[batchnorm]
name = stem_bn
[activation]
name = stem_act
type = relu
[separable_conv2d]
name = sep1
filters = 16
kernel = 3
padding = same
use_bias = false
[batchnorm]
name = sep1_bn
[activation]
name = sep1_act
type = relu
[maxpool]
name = pool
size = 2
[conv2d]
name = res_conv
input = stem_act
filters = 16
kernel = 1
stride = 2
padding = same
[add]
name = add
inputs = pool, res_conv
[depthwise_conv2d]
name = dw
kernel = 3
padding = same
[concat]
name = cat
inputs = add, dw
[global_avgpool]
name = gap
[dense]
name = fc
units = 5
activation = softmax
[train]
optimizer = adam
loss = sparse_categorical_crossentropy
batch_size = 16
CFG
# stem_bn frozen by its key; sep1 and dw by --freeze
sed '/^name = stem_bn$/a trainable = false' all.cfg >m.cfg
FREEZE=(--freeze 'sep1,dw')
FROZEN="stem_bn sep1 dw"

"$PY" - <<'PY' || bad "writing the data"
import os, numpy as np
r = np.random.default_rng(3)
os.makedirs("d", exist_ok=True)
x, y = r.standard_normal((48, 16, 16, 3)).astype(np.float32), r.integers(0, 5, 48)
for split in ("train", "test"):
    np.save(f"d/{split}_x.npy", x); np.save(f"d/{split}_y.npy", y)
os.makedirs("d16", exist_ok=True)
for split in ("train", "test"):
    np.save(f"d16/{split}_x.npy", x[:16]); np.save(f"d16/{split}_y.npy", y[:16])
PY
C=(--data d --conv-algo direct --no-validation --verbose 0)
# the starting weights: two steps of the model with nothing frozen, so that the batchnorms'
# running statistics are not their initial 0 and 1
"$MGT_BIN" --model all.cfg "${C[@]}" --max-steps 2 --out w0 >w0.log 2>&1 || { bad "initial weights"; tail -3 w0.log; }

# 1. one step's gradients against PyTorch
MGT_DUMP_GRADIENTS=$PWD/g.st "$MGT_BIN" --model m.cfg "${FREEZE[@]}" --data d16 --conv-algo direct \
  --init-weights w0/weights.safetensors --batch-size 16 --max-steps 1 --no-validation --verbose 0 \
  --out g1 >g1.log 2>&1 || { bad "one step with frozen layers"; tail -3 g1.log; }
out=$("$PY" - "$TOOLS" m.cfg d16 w0/weights.safetensors g.st $FROZEN <<'PY' 2>&1
import sys, numpy as np, torch
sys.path.insert(0, sys.argv[1])
import torch_graph, weights
cfg, data, w0, got = sys.argv[2:6]
frozen = sys.argv[6:]
m = torch_graph.build(cfg).double()
m.load_state_dict({k: torch.from_numpy(v) for k, v in weights.load(w0)[0].items()}, strict=True)
m.freeze(frozen)
m.train()
x = torch.from_numpy(np.load(data + "/train_x.npy")).double().permute(0, 3, 1, 2)
y = torch.from_numpy(np.load(data + "/train_y.npy")).long()
torch.nn.functional.cross_entropy(m(x), y, reduction="sum").backward()
g = weights.load(got)[0]
bad = 0
for k, p in m.named_parameters():
    layer = k.split(".")[0]
    if layer in frozen:
        if k in g or p.grad is not None:
            bad += 1; print(f"FAIL {k}: a frozen tensor has a gradient")
        continue
    rel = np.abs(g[k] - p.grad.numpy()).max() / np.abs(p.grad.numpy()).max()
    if not rel <= 1e-5:
        bad += 1; print(f"FAIL {k}: relative difference {rel:.3g} > 1e-5")
print(f"{len(g)} gradients compared, {len(frozen)} frozen layers without any")
sys.exit(1 if bad else 0)
PY
) && ok "one step with frozen layers: the trainable gradients equal PyTorch's, none for frozen layers: $(tail -1 <<<"$out")" \
  || { bad "frozen layers against PyTorch"; echo "$out"; }

# Frozen tensors the same bytes as in FROM, the others changed (ARGS: FROM TO).
unchanged() {
  "$PY" - "$TOOLS" "$1" "$2" $FROZEN <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import weights
a, b = weights.load(sys.argv[2])[0], weights.load(sys.argv[3])[0]
frozen = sys.argv[4:]
bad = [k for k in a if k.split(".")[0] in frozen and a[k].tobytes() != b[k].tobytes()]
moved = [k for k in a if k.split(".")[0] not in frozen and a[k].tobytes() != b[k].tobytes()]
print(f"{sum(k.split('.')[0] in frozen for k in a)} frozen tensors, changed: {bad}; "
      f"{len(moved)} of {sum(k.split('.')[0] not in frozen for k in a)} others moved")
sys.exit(1 if bad or len(moved) < sum(k.split('.')[0] not in frozen for k in a) else 0)
PY
}

# 2. 2 ranks with buckets of 512 bytes (a bucket per tensor or so), then resumed on 3 with ZeRO-1
R=(--model m.cfg "${FREEZE[@]}" "${C[@]}" --init-weights w0/weights.safetensors --batch-size 12)
mpi 2 "${R[@]}" --epochs 1 --bucket-mb 0.0005 --out a >a1.log 2>&1 || { bad "2 ranks with frozen layers"; tail -3 a1.log; }
out=$(unchanged w0/weights.safetensors a/weights.safetensors) \
  && ok "2 ranks, many buckets: $out" || { bad "2 ranks, many buckets: $out"; }
mpi 3 --model m.cfg "${FREEZE[@]}" "${C[@]}" --batch-size 12 --epochs 2 --zero 1 --resume --out a >a2.log 2>&1 \
  || { bad "resumed on 3 ranks with ZeRO-1"; tail -3 a2.log; }
out=$(unchanged w0/weights.safetensors a/weights.safetensors) \
  && ok "resumed on 3 ranks with ZeRO-1: $out" || { bad "resumed with ZeRO-1: $out"; }
expect_fail "a resume freezing other layers is refused" \
  "a resumed run continues it as it was: --freeze sep1 \(the run: " \
  "$MGT_BIN" --model m.cfg --freeze sep1 "${C[@]}" --batch-size 12 --epochs 3 --resume --out a
expect_fail "--freeze naming no layer" "--freeze sep9: 'sep9' names no layer of model m" \
  "$MGT_BIN" --model m.cfg --freeze sep9 "${C[@]}" --out bad

# 3. --reproducible: the non-frozen batchnorm synchronised, as the mode asks
sed '/^name = sep1_bn$/a sync = true' m.cfg >r.cfg
for n in 1 2; do
  mpi $n --model r.cfg "${FREEZE[@]}" "${C[@]}" --init-weights w0/weights.safetensors --batch-size 12 \
    --max-steps 3 --reproducible --repro-chunk 2 --out r$n >r$n.log 2>&1 || { bad "--reproducible on $n ranks"; tail -3 r$n.log; }
done
cmp -s r1/weights.safetensors r2/weights.safetensors && ok "--reproducible with frozen layers: the same bytes on 1 and 2 ranks" \
  || bad "--reproducible with frozen layers differs between 1 and 2 ranks"
out=$(unchanged w0/weights.safetensors r2/weights.safetensors) \
  && ok "--reproducible: $out" || { bad "--reproducible: $out"; }

# 4. the GPU backend over the emulated CUDA stack
EMU="${MGT_BUILD:-}/tests/gpu/emu/mgtrain_emu"
if [ -x "$EMU" ]; then
  G=(--model m.cfg "${FREEZE[@]}" --init-weights w0/weights.safetensors --data d --batch-size 12 --max-steps 3 --no-validation --verbose 0)
  OPENBLAS_NUM_THREADS=1 timeout 600 "$EMU" "${G[@]}" --device gpu --out gpu >gpu.log 2>&1 || { bad "the GPU backend with frozen layers"; tail -3 gpu.log; }
  "$MGT_BIN" "${G[@]}" --conv-algo direct --out cpu >cpu.log 2>&1 || { bad "the CPU backend with frozen layers"; tail -3 cpu.log; }
  same "the GPU backend with frozen layers against the CPU" gpu/weights.safetensors cpu/weights.safetensors 1e-4
  out=$(unchanged w0/weights.safetensors gpu/weights.safetensors) && ok "the GPU backend: $out" || bad "the GPU backend: $out"
else
  echo "the GPU backend: not checked (no emulated GPU build)"
fi
finish
