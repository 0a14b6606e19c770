#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# Fine-tuning from pretrained weights: a torchvision ResNet-50 made here (torchvision.models.
# resnet50(), random initialisation, its batchnorm statistics gathered over a few random batches
# so that they normalise), saved as safetensors as PyTorch keeps it (num_batches_tracked counters
# included), into examples/resnet50_torchvision.cfg through examples/resnet50_torchvision.map, at
# 64x64 (--input-shape) with batch 2 so that it costs seconds on a CPU.
# 1. predict through the map: mgtrain's logits equal torchvision's (eval mode, float64) on the
#    same inputs to 2e-4 of the largest logit: each of the 53 convolutions (with its batchnorm)
#    rounds its sums of K <= 4608 float32 terms by about sqrt(K) u = 4e-6 relative (u = 2^-24,
#    Higham 2.8); the residual blocks carry those errors forward additively, 53 x 4e-6 = 2e-4.
#    And the same class for every input.
# 2. fine-tuning with a new 10-class head (--init-partial) and every layer but it frozen, on 2
#    ranks: the table says what was loaded (265 of 267 tensors), left (the head, whose shape
#    differs) and unused (torchvision's 1000-class fc) and the 53 counters ignored; every frozen
#    tensor is still the file's bit for bit after training; the step reduces and updates the
#    head alone (1 bucket of 20,490 values, against the whole model's); and the fine-tuned
#    model predicts what torchvision predicts with that head (same bound).
# 3. without --init-partial the new head is an error that names it, after the table.
# 4. timm's Xception (timm.create_model("legacy_xception"), timm from PyPI beside Debian's PyTorch)
#    through examples/xception_timm.map into examples/xception_timm.cfg at 72x72 (even sizes, where
#    its max pooling's padding differs from TensorFlow's): predict equals timm's logits (float64,
#    eval) to 2e-4 of the largest, the bound of 1. (74 convolutions of K <= 2048 terms).
# Cost: about 40 s on 2 cores (torchvision's model made once, the 100 MB weights file written once
# and read 4 times, 6 steps of ResNet-50 at 64x64 on 2 ranks; timm's Xception made once and
# predicted on 3 images). The steps' times with and
# without the frozen backbone are printed (--profile), not checked: bench/ measures speed.
source "$(dirname "$0")/lib.bash"
PY=/usr/bin/python3
TOOLS=$MGT_SRC/tests/tools
CFG=$MGT_SRC/examples/resnet50_torchvision.cfg MAP=$MGT_SRC/examples/resnet50_torchvision.map
"$PY" -c "import torch, torchvision, numpy" 2>/dev/null ||
  { bad "PyTorch, torchvision and numpy are missing (tests/run installs python3-torch and python3-torchvision)"; finish; exit 1; }

# The weights, the data (8 training images, 4 test images, 10 classes), and torchvision's
# logits (eval mode, float64) for the test images, normalised as the model file's [input] says,
# with the features its fc reads (to put a fine-tuned head on).
"$PY" - "$TOOLS" <<'PY' || bad "making torchvision's ResNet-50"
import os, sys, numpy as np, torch, torchvision
sys.path.insert(0, sys.argv[1])
import weights
torch.manual_seed(0)
m = torchvision.models.resnet50()
r = np.random.default_rng(1)
m.train()
for mod in m.modules():
    if isinstance(mod, torch.nn.BatchNorm2d):
        mod.momentum = None  # a plain average over the batches below
with torch.no_grad():
    for _ in range(3):
        m(torch.from_numpy(r.standard_normal((8, 3, 64, 64)).astype(np.float32)))
sd = {k: v.numpy() for k, v in m.state_dict().items()}
assert sd["layer1.0.bn1.num_batches_tracked"].dtype == np.int64
weights.write("tv.safetensors", sd)
os.makedirs("d", exist_ok=True)
x = r.uniform(0, 1, (12, 64, 64, 3)).astype(np.float32)
y = r.integers(0, 10, 12)
np.save("d/train_x.npy", x[:8]); np.save("d/train_y.npy", y[:8])
np.save("d/test_x.npy", x[8:]); np.save("d/test_y.npy", y[8:])
m = m.double().eval()
x = (x[8:] - np.float32([0.485, 0.456, 0.406])) / np.float32([0.229, 0.224, 0.225])
feats = {}
m.fc.register_forward_hook(lambda mod, i, o: feats.update(x=i[0]))
with torch.no_grad():
    np.save("want.npy", m(torch.from_numpy(x).double().permute(0, 3, 1, 2)).numpy())
np.save("feats.npy", feats["x"].numpy())
PY
cat >cmp.py <<'PY'
import sys, numpy as np
got, want = np.load(sys.argv[1]).astype(np.float64), np.load(sys.argv[2])
rel = np.abs(got - want).max() / np.abs(want).max()
same = (got.argmax(1) == want.argmax(1)).all()
print(f"{got.shape[0]} x {got.shape[1]} logits, largest difference {rel:.3g} of the largest, "
      f"classes {'the same' if same else 'DIFFER'}")
sys.exit(0 if rel <= 2e-4 and same and got.shape == want.shape else 1)
PY

# 1. predict through the map
S=(--input-shape 64,64,3 --conv-algo direct --data d)
"$MGT_BIN" predict --model "$CFG" "${S[@]}" --weights tv.safetensors --name-map "$MAP" --output got.npy \
  >p1.log 2>&1 || { bad "predict through the map"; tail -5 p1.log; }
grep -qE "loaded +267 of the model's 267 tensors" p1.log && grep -qE "ignored in the file +53 \(0 by the name map, 53 batchnorm step counters\)" p1.log \
  && ok "predict: every tensor loaded through the map, the 53 counters ignored" || { bad "predict's table"; cat p1.log; }
out=$("$PY" cmp.py got.npy want.npy) && ok "predict through the map equals torchvision: $out" || bad "predict against torchvision: $out"

# 2. fine-tuning: a new 10-class head, everything else frozen, 2 ranks
sed 's/^units = 1000$/units = 10/' "$CFG" >ft.cfg
F=(--model ft.cfg "${S[@]}" --init-weights tv.safetensors --name-map "$MAP" --batch-size 2 --no-validation --verbose 2)
mpi 2 "${F[@]}" --init-partial --freeze '*,!predictions' --max-steps 4 --out ft --profile >ft.log 2>&1 \
  || { bad "fine-tuning"; tail -5 ft.log; }
grep -qE "loaded +265 of the model's 267 tensors" ft.log &&
  grep -qF "predictions.weight [10,2048]: the file's is [1000,2048]" ft.log &&
  grep -qE "unused in the file +2 of the file's 320 tensors" ft.log && grep -qF "fc.weight [1000,2048] (as predictions.weight)" ft.log \
  && ok "fine-tuning: the table names the new head and torchvision's unused fc" || { bad "the table"; head -30 ft.log; }
grep -qF "model: 20490 trainable parameters (23508032 more in 106 frozen layers)" ft.log &&
  grep -qE "step: 1 gradient bucket" ft.log && ok "fine-tuning: the head's 20,490 values alone are reduced and updated" \
  || { bad "the frozen step"; grep -E "model:|step:" ft.log; }
out=$("$PY" - "$TOOLS" "$MAP" ft/weights.safetensors <<'PY'
import fnmatch, json, struct, sys, numpy as np
sys.path.insert(0, sys.argv[1])
import weights
def raw(path):  # name -> the tensor's bytes, as stored
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()
            if k != "__metadata__" and v["dtype"] == "F32"}
rules = [l.split() for l in open(sys.argv[2]) if l.strip() and not l.startswith("#")]
def rename(n):
    for a, b in rules:
        if fnmatch.fnmatchcase(n, a):
            return b[:-1] + n[len(a) - 1:]
    return n
tv, ft = raw("tv.safetensors"), raw(sys.argv[3])
changed = [n for n in tv if not n.startswith("fc.") and tv[n] != ft[rename(n)]]
print(f"{len(tv) - 2} frozen tensors, changed: {changed[:5]}")
# torchvision with the fine-tuned head: its features through the head, in float64
h = weights.load(sys.argv[3])[0]
np.save("want_ft.npy", np.load("feats.npy") @ h["predictions.weight"].T + h["predictions.bias"])
sys.exit(1 if changed else 0)
PY
) && ok "fine-tuning: $out" || bad "fine-tuning moved frozen tensors: $out"
"$MGT_BIN" predict --run ft "${S[@]}" --output ft.npy >p2.log 2>&1 || { bad "predict --run ft"; tail -3 p2.log; }
out=$("$PY" cmp.py ft.npy want_ft.npy) && ok "the fine-tuned model predicts what torchvision does with its head: $out" \
  || bad "fine-tuned against torchvision: $out"
mpi 2 "${F[@]}" --init-partial --max-steps 2 --out full --profile >full.log 2>&1 || { bad "training every layer"; tail -3 full.log; }
echo "step phases, every layer trained (ms):"; grep -A3 "^Profile" full.log
echo "step phases, all but the head frozen (ms):"; grep -A3 "^Profile" ft.log

# 3. the new head without --init-partial
expect_fail "a new head without --init-partial" \
  "tv.safetensors: tensor 'predictions.weight' has shape \[1000,2048\] but model ft needs \[10,2048\] \(and 3 more: see the table above\); pass --init-partial" \
  "$MGT_BIN" "${F[@]}" --max-steps 1 --out strict
[ ! -e strict/weights.safetensors ] && ok "nothing trained from a partial match without --init-partial" || bad "strict run wrote weights"

# 4. timm's Xception
if TPY=$("$MGT_SRC/tests/tools/timm-python"); then
  "$TPY" - "$TOOLS" <<'PY' || bad "making timm's Xception"
import os, sys, numpy as np, torch, timm
sys.path.insert(0, sys.argv[1])
import weights
torch.manual_seed(0)
m = timm.create_model("legacy_xception")
r = np.random.default_rng(2)
m.train()
for mod in m.modules():
    if isinstance(mod, torch.nn.BatchNorm2d):
        mod.momentum = None
with torch.no_grad():
    for _ in range(2):
        m(torch.from_numpy(r.standard_normal((4, 3, 72, 72)).astype(np.float32)))
weights.write("xc.safetensors", {k: v.numpy() for k, v in m.state_dict().items()})
os.makedirs("dx", exist_ok=True)
x = r.uniform(0, 1, (3, 72, 72, 3)).astype(np.float32)
for s in ("train", "test"):
    np.save(f"dx/{s}_x.npy", x); np.save(f"dx/{s}_y.npy", np.zeros(3, np.int64))
m = m.double().eval()
with torch.no_grad():
    np.save("want_xc.npy", m(torch.from_numpy((x - 0.5) / 0.5).double().permute(0, 3, 1, 2)).numpy())
PY
  "$MGT_BIN" predict --model "$MGT_SRC/examples/xception_timm.cfg" --input-shape 72,72,3 --conv-algo direct \
    --data dx --weights xc.safetensors --name-map "$MGT_SRC/examples/xception_timm.map" --output xc.npy \
    >p3.log 2>&1 || { bad "predict timm's Xception"; tail -5 p3.log; }
  grep -qE "loaded +236 of the model's 236 tensors" p3.log && ok "timm's Xception: every tensor loaded through the map" \
    || { bad "timm's Xception's table"; cat p3.log; }
  out=$("$PY" cmp.py xc.npy want_xc.npy) && ok "timm's Xception through the map equals timm: $out" || bad "timm's Xception: $out"
else
  bad "cannot install timm from PyPI beside Debian's PyTorch"
fi
finish
