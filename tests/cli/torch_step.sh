#!/usr/bin/env bash
# labels: e2e
# timeout: 600
# cores: 1
# One SGD step's gradients against PyTorch, from the same weights on the same 64 Fashion-MNIST
# images: a one-convolution model (conv 8x3x3 relu -> flatten -> dense 10) whose summed gradients
# (MGT_DUMP_GRADIENTS) must equal PyTorch's (loss summed over the batch, as mgtrain's arena holds
# sums) within float32 rounding of a sum of K terms, 2 u sqrt(K) of each tensor's largest element
# (tests/tools/gradcmp.py), with the direct convolution. Winograd's rounding residue where a
# window is all zero (the images' background) opens ReLU gates that PyTorch keeps shut, which is
# not rounding: comparisons with PyTorch use algo = direct, and the figure for Winograd is printed.
source "$(dirname "$0")/lib.bash"
PY=/usr/bin/python3
"$PY" -c "import torch, numpy" 2>/dev/null || { bad "PyTorch and numpy are missing (tests/run installs python3-torch)"; finish; exit 1; }
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || [ -f "$DATA/train-images-idx3-ubyte" ] \
  || { bad "Fashion-MNIST is not installed (tests/run installs dataset-fashion-mnist)"; finish; exit 1; }

# 64 training images (the whole set is one batch, so the batch holds exactly these, in any order)
# and the same weights for both, written by numpy in mgtrain's layouts (conv OIHW, dense [out][in]).
"$PY" - "$DATA" <<'PY' || bad "writing the data and weights"
import gzip, json, os, struct, sys, numpy as np
d = sys.argv[1]
def idx(name):
    p = os.path.join(d, name)
    return gzip.open(p + ".gz").read() if os.path.exists(p + ".gz") else open(p, "rb").read()
x = np.frombuffer(idx("train-images-idx3-ubyte"), np.uint8, offset=16).reshape(-1, 28, 28)[:64]
y = np.frombuffer(idx("train-labels-idx1-ubyte"), np.uint8, offset=8)[:64]
os.makedirs("d", exist_ok=True)
for split in ("train", "t10k"):
    open(f"d/{split}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, 64, 28, 28) + x.tobytes())
    open(f"d/{split}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, 64) + y.tobytes())
rng = np.random.default_rng(7)
t = {"conv.weight": rng.uniform(-0.3, 0.3, (8, 1, 3, 3)), "conv.bias": np.zeros(8),
     "fc.weight": rng.uniform(-0.02, 0.02, (10, 8 * 26 * 26)), "fc.bias": rng.uniform(-0.1, 0.1, 10)}
hdr, blob = {}, b""
for k, v in t.items():
    b = v.astype("<f4").tobytes()
    hdr[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [len(blob), len(blob) + len(b)]}
    blob += b
h = json.dumps(hdr).encode()
open("w0.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + blob)
PY
cat >one.cfg <<'CFG'
[input]
shape = 28,28,1
[conv2d]
name = conv
filters = 8
kernel = 3
activation = relu
[flatten]
[dense]
name = fc
units = 10
[train]
optimizer = sgd
loss = sparse_categorical_crossentropy
batch_size = 64
CFG
for algo in direct winograd; do
  MGT_DUMP_GRADIENTS=$PWD/$algo.st "$MGT_BIN" --model one.cfg --data d --init-weights w0.safetensors \
    --conv-algo $algo --max-steps 1 --no-validation --verbose 0 --out run-$algo >$algo.log 2>&1 \
    || { bad "mgtrain, algo $algo"; tail -3 $algo.log; }
done
"$PY" - <<'PY' || bad "PyTorch's gradients"
import json, struct, numpy as np, torch, torch.nn as nn
raw = open("w0.safetensors", "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
sd = {k: torch.from_numpy(np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], "<f4").reshape(v["shape"]).copy())
      for k, v in hdr.items()}
m = nn.Sequential()
m.add_module("conv", nn.Conv2d(1, 8, 3)); m.add_module("relu", nn.ReLU()); m.add_module("flat", nn.Flatten())
m.add_module("fc", nn.Linear(8 * 26 * 26, 10))
m.load_state_dict(sd, strict=True)
x = np.frombuffer(open("d/train-images-idx3-ubyte", "rb").read(), np.uint8, offset=16).reshape(64, 1, 28, 28)
y = np.frombuffer(open("d/train-labels-idx1-ubyte", "rb").read(), np.uint8, offset=8)
loss = nn.functional.cross_entropy(m(torch.from_numpy(x.astype(np.float32) / 255)), torch.from_numpy(y.astype(np.int64)), reduction="sum")
loss.backward()
g = {k: p.grad.numpy().astype("<f4") for k, p in m.named_parameters()}
hdr, blob = {}, b""
for k, v in g.items():
    b = v.tobytes(); hdr[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [len(blob), len(blob) + len(b)]}; blob += b
h = json.dumps(hdr).encode()
open("torch.st", "wb").write(struct.pack("<Q", len(h)) + h + blob)
PY
# addends: 64 samples, times the 26x26 output pixels for the convolution
K=(conv=$((64 * 26 * 26)) fc=64)
out=$("$PY" "$MGT_SRC/tests/tools/gradcmp.py" torch.st direct.st "${K[@]}" 2>&1) \
  && ok "algo = direct: one step's gradients equal PyTorch's within rounding" \
  || { bad "algo = direct against PyTorch"; }
echo "$out"
echo "algo = winograd against PyTorch (not asserted):"
"$PY" "$MGT_SRC/tests/tools/gradcmp.py" torch.st winograd.st "${K[@]}" 2>&1 | sed 's/^FAIL/    /; s/^ok  /    /'
finish
