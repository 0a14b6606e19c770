#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# Graph models against PyTorch, and across rank counts.
#
# 1. A residual + separable block (every graph layer: separable and depthwise convolutions with
#    and without bias, TensorFlow-"same" max and average pooling, a 1x1 stride-2 shortcut, add,
#    zero padding, concat, global average pooling) and a scaled-down Xception (examples/
#    xception.cfg with 1/8 of the filters, 71x71x3 inputs, 10 classes: the whole graph, 8 middle
#    blocks). mgtrain's forward outputs, summed loss and one step's summed gradients
#    (tests/tools/mgt_graph_grads, and the trainer's own MGT_DUMP_GRADIENTS) against the same
#    graph in PyTorch (tests/tools/torch_graph.py, PyTorch's own operators), which loads
#    mgtrain's saved weights with load_state_dict(strict=True) and runs in float64, so the
#    difference measured is mgtrain's float32 rounding alone. Bound: 1e-5 of each tensor's
#    largest element. Each layer's float32 sums of K terms round by about sqrt(K) u (u = 2^-24,
#    Higham section 2.8) relative to their size: 3e-6 for the largest K here (8 x 35 x 35
#    pixels of block1_conv1's filter gradient); the backward pass through the depth of the
#    network adds such errors layer after layer rather than multiplying them (BatchNorm
#    renormalises every block), so the gradients stay within a few times that, under 1e-5
#    (measured up to 4e-6). Direct convolutions, as PyTorch's CPU convolution computes them.
# 2. Rank counts: the block made smooth (tanh, average pooling) with synchronised BatchNorm gives
#    one step's summed gradients on 2 and 3 ranks equal to 1 rank's within float32 rounding of
#    a sum (tests/tools/gradcmp.py: 2 u sqrt(K)); a smooth model because a ReLU or a max at its
#    threshold would turn a last-bit difference into a different gate, which is not rounding
#    (tests/cli/invariance.sh). And 2 epochs straight on 2 ranks equal 1 epoch on 2 ranks plus 1
#    resumed on 3 ranks to 1e-5 of each tensor (SGD; 8 steps of per-step rounding differences
#    near 1e-7 of the updates, not amplified by a smooth loss).
source "$(dirname "$0")/lib.bash"
PY=/usr/bin/python3
TOOLS=$MGT_SRC/tests/tools
"$PY" -c "import torch, numpy" 2>/dev/null || { bad "PyTorch and numpy are missing (tests/run installs python3-torch)"; finish; exit 1; }

cat >block.cfg <<'CFG'
[input]
shape = 16,16,3
[conv2d]
name = stem
filters = 8
kernel = 3
padding = same
use_bias = false
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
[separable_conv2d]
name = sep2
filters = 16
kernel = 3
padding = same
[maxpool]
name = pool
size = 3
stride = 2
padding = same
[conv2d]
name = res_conv
input = stem_act
filters = 16
kernel = 1
stride = 2
padding = same
use_bias = false
[batchnorm]
name = res_bn
[add]
name = add
inputs = pool, res_bn
[avgpool]
name = avg
size = 3
stride = 1
padding = same
[zeropad]
name = pad
pad = 1,1,2,0
[depthwise_conv2d]
name = dw
kernel = 3
[concat]
name = cat
inputs = avg, dw
[global_avgpool]
name = gap
[dense]
name = fc
units = 5
activation = softmax
[train]
optimizer = sgd
loss = sparse_categorical_crossentropy
batch_size = 16
CFG
# Xception scaled down: 1/8 of the filters, 71x71x3 (the smallest input it takes), 10 classes.
awk '/^filters = /{$3=int($3/8)} /^units = 1000/{$3=10} /^shape = 299/{$3="71,71,3"} {print}' \
  "$MGT_SRC/examples/xception.cfg" >mini.cfg
grep -q "^shape = 71,71,3" mini.cfg && grep -q "^units = 10$" mini.cfg \
  || bad "could not scale examples/xception.cfg down"

"$PY" - <<'PY' || bad "writing the data"
import os, numpy as np
r = np.random.default_rng(3)
for name, shape, classes in (("block", (16, 16, 3), 5), ("mini", (71, 71, 3), 10)):
    n = 16 if name == "block" else 8
    os.makedirs(name, exist_ok=True)
    x, y = r.standard_normal((n,) + shape).astype(np.float32), r.integers(0, classes, n)
    for split in ("train", "test"):
        np.save(f"{name}/{split}_x.npy", x); np.save(f"{name}/{split}_y.npy", y)
PY

# PyTorch's forward and one step's gradients (float64) from mgtrain's saved weights, against
# mgtrain's: prints each tensor's relative difference, exit 1 if one exceeds 1e-5.
cat >cmp.py <<'PY'
import json, struct, sys, numpy as np, torch
sys.path.insert(0, sys.argv[1])
import torch_graph
cfg, data, weights, got = sys.argv[2:6]
def load(path):
    raw = open(path, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], "<f4").reshape(v["shape"])
            for k, v in h.items() if k != "__metadata__"}
m = torch_graph.build(cfg).double()
m.load_state_dict({k: torch.from_numpy(v.copy()).double() for k, v in load(weights).items()}, strict=True)
m.train()
x = torch.from_numpy(np.load(data + "/train_x.npy")).double().permute(0, 3, 1, 2)
y = torch.from_numpy(np.load(data + "/train_y.npy")).long()
logits = m(x)
loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum")
loss.backward()
want = {k: p.grad.numpy() for k, p in m.named_parameters()}
want["output"] = torch.softmax(logits, 1).detach().numpy()
want["loss"] = np.array([loss.item()])
g = load(got)
bad, worst = 0, 0.0
for k, w in want.items():
    if k not in g:
        continue
    rel = np.abs(g[k].astype(np.float64) - w).max() / np.abs(w).max()
    worst = max(worst, rel)
    if not rel <= 1e-5:
        bad += 1; print(f"FAIL {k}: relative difference {rel:.3g} > 1e-5")
missing = [k for k in want if k not in g and k not in ("output", "loss")]
if missing:
    bad += 1; print(f"FAIL: no gradient for {missing}")
print(f"{len(want)} tensors, largest relative difference {worst:.3g}")
sys.exit(1 if bad else 0)
PY

for name in block mini; do
  mkdir -p "$name-out"
  if ! "$MGT_GRAPH_GRADS" $name.cfg $name/train_x.npy $name/train_y.npy "$name-out" 1 >$name.log 2>&1; then
    bad "mgt_graph_grads $name"; cat $name.log; continue
  fi
  out=$("$PY" cmp.py "$TOOLS" $name.cfg $name $name-out/weights.safetensors $name-out/grads.safetensors 2>&1) \
    && ok "$name: forward, loss and gradients equal PyTorch's (strict load) to 1e-5: $(tail -1 <<<"$out")" \
    || { bad "$name against PyTorch"; echo "$out"; }
  # the trainer's own step (batch = the whole set, so the gradient sum holds the same samples)
  n=$("$PY" -c "import numpy; print(len(numpy.load('$name/train_y.npy')))")
  MGT_DUMP_GRADIENTS=$PWD/$name-dump.st "$MGT_BIN" --model $name.cfg --data $name \
    --init-weights $name-out/weights.safetensors --conv-algo direct --batch-size $n --max-steps 1 \
    --no-validation --verbose 0 --out run-$name >$name-train.log 2>&1 || { bad "mgtrain $name"; tail -3 $name-train.log; }
  out=$("$PY" cmp.py "$TOOLS" $name.cfg $name $name-out/weights.safetensors $name-dump.st 2>&1) \
    && ok "$name: the trainer's step gradients (MGT_DUMP_GRADIENTS) equal PyTorch's to 1e-5: $(tail -1 <<<"$out")" \
    || { bad "$name trainer step against PyTorch"; echo "$out"; }
done

# 2. rank counts, on the smooth block with synchronised BatchNorm
sed 's/^type = relu/type = tanh/; s/^\[maxpool\]/[avgpool]/; s/^\[batchnorm\]/[batchnorm]\nsync = true/' \
  block.cfg >smooth.cfg
grep -q relu smooth.cfg && bad "could not make the smooth block"
for np_ in 1 2 3; do
  MGT_DUMP_GRADIENTS=$PWD/smooth$np_.st mpi $np_ --model smooth.cfg --data block \
    --init-weights block-out/weights.safetensors --conv-algo direct --batch-size 16 --max-steps 1 \
    --no-validation --verbose 0 --out smooth-run$np_ >s$np_.log 2>&1 || { bad "smooth block on $np_ ranks"; tail -3 s$np_.log; }
done
# addends per element: 16 samples times the output pixels of the layer (16x16; 8x8 for the
# shortcut and the depthwise convolution)
K=(stem=4096 sep1=4096 sep2=4096 res_=1024 dw=1024 fc=16)
for np_ in 2 3; do
  out=$("$PY" "$TOOLS/gradcmp.py" smooth1.st smooth$np_.st "${K[@]}" 2>&1) \
    && ok "smooth block: one step's gradients on $np_ ranks equal 1 rank's within rounding" \
    || { bad "smooth block: $np_ ranks against 1"; echo "$out"; }
done

# resume at another world size: 2 epochs of 4 steps (64 samples, batch 16) straight on 2 ranks, against 1 epoch on 2
# ranks and the second resumed on 3
mkdir -p big && "$PY" -c "
import numpy as np; r = np.random.default_rng(5)
x = r.standard_normal((64, 16, 16, 3)).astype(np.float32); y = r.integers(0, 5, 64)
for s in ('train', 'test'): np.save(f'big/{s}_x.npy', x); np.save(f'big/{s}_y.npy', y)
" || bad "writing the data for resume"
R=(--model smooth.cfg --data big --conv-algo direct --optimizer sgd --lr 0.05 --seed 3 --verbose 2)
mpi 2 "${R[@]}" --epochs 2 --out straight >r1.log 2>&1 || { bad "smooth block straight"; tail -3 r1.log; }
mpi 2 "${R[@]}" --epochs 1 --out split >r2.log 2>&1 || { bad "smooth block first epoch"; tail -3 r2.log; }
mpi 3 "${R[@]}" --epochs 2 --out split --resume >r3.log 2>&1 || { bad "smooth block resumed"; tail -3 r3.log; }
grep -q "resumed from split/checkpoint.safetensors at epoch 2" r3.log && ok "graph model resumed on 3 ranks" \
  || { bad "no resume message"; tail -3 r3.log; }
same "graph model: 2 ranks + resume on 3 ranks" straight/weights.safetensors split/weights.safetensors 1e-5
finish
