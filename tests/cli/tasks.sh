#!/usr/bin/env bash
# labels: e2e
# timeout: 600
# cores: 2
# Tasks beyond one label, on the real tabular data scikit-learn ships (Debian's python3-sklearn,
# installed by tests/run): load_diabetes as a regression (mse, mae, huber), load_breast_cancer
# as a binary classification (one sigmoid output, class weights 1 and 2), load_wine's 3 classes
# (softmax cross-entropy, class weights 1, 2, 0.5: PyTorch's weight[y] times each sample's loss,
# averaged over the samples as Keras' class_weight is; the test loss unweighted) and a multi-label set
# of make_multilabel_classification (5 labels, binary cross-entropy from logits), read from .npy
# rows ([input] shape = F) with float and integer targets. Each trains on 2 ranks, full batch,
# SGD with momentum, from the same initial weights as the same model in PyTorch, whose loss after
# the same steps must be within 2% of mgtrain's, training and test. They agree
# far closer (printed: about 2e-7 relative): both compute the same float32 model and differ only in
# the order of their sums, whose rounding (a few units of 2^-24 a step) full-batch steps without
# noise carry forward nearly unchanged over 25 steps. The
# multi-label run's per-label F1 (eval's table) must be scikit-learn's f1_score of its
# predictions to the 4 printed digits, and --reproducible gives the same weights and training
# figures on 1 and 2 ranks; a run resumed in the middle of an epoch ends with the same figures as
# one that was not. About 15 s of CPU on 2 cores (14 runs of mgtrain, the most in process start-ups).
source "$(dirname "$0")/lib.bash"
PY=/usr/bin/python3
"$PY" -c "import torch, numpy, sklearn" 2>/dev/null \
  || { bad "PyTorch, numpy and scikit-learn are missing (tests/run installs python3-torch, python3-sklearn)"; finish; exit 1; }
TOOLS=$(dirname "$0")/../tools
STEPS=25

# The data, the models' initial weights, and PyTorch's losses after each step.
"$PY" - "$TOOLS" "$STEPS" <<'PY' || bad "writing the data, the weights and PyTorch's losses"
import json, os, sys
import numpy as np, torch
from sklearn.datasets import (load_breast_cancer, load_diabetes, load_wine,
                              make_multilabel_classification)
sys.path.insert(0, sys.argv[1])
import weights
steps = int(sys.argv[2])
torch.set_default_dtype(torch.float32)

def save(name, x, y, ntrain, ytype):
    mu, sd = x[:ntrain].mean(0), x[:ntrain].std(0) + 1e-12
    x = ((x - mu) / sd).astype(np.float32)
    os.makedirs(name, exist_ok=True)
    for split, sl in (("train", slice(0, ntrain)), ("test", slice(ntrain, None))):
        np.save(f"{name}/{split}_x.npy", x[sl])
        np.save(f"{name}/{split}_y.npy", y[sl].astype(ytype))
    return x

d = load_diabetes()
yd = (d.target - d.target[:354].mean()) / d.target[:354].std()
xd = save("diab", d.data, yd, 354, np.float32)
b = load_breast_cancer()
xb = save("bc", b.data, b.target, 455, np.int64)          # integer 0/1 targets
xm, ym = make_multilabel_classification(n_samples=400, n_features=20, n_classes=5, n_labels=2,
                                        random_state=3)
xm = save("ml", xm.astype(np.float64), ym, 320, np.float32)
wi = load_wine()
order = np.random.default_rng(5).permutation(len(wi.target))  # the set is sorted by class
xw = save("wine", wi.data[order], wi.target[order], 142, np.int64)
yw = wi.target[order]

rng = np.random.default_rng(11)
def init(path, sizes):
    t = {}
    for i, (a, o) in enumerate(zip(sizes[:-1], sizes[1:])):
        lim = np.sqrt(6 / (a + o))
        t[f"fc{i}.weight"] = rng.uniform(-lim, lim, (o, a)).astype(np.float32)
        t[f"fc{i}.bias"] = rng.uniform(-0.1, 0.1, o).astype(np.float32)
    weights.write(path, t)
    return t

def run(name, x, y, ntrain, t0, loss_fn, lr, test_fn=None):
    w = {k: torch.tensor(v, requires_grad=True) for k, v in t0.items()}
    opt = torch.optim.SGD(list(w.values()), lr=lr, momentum=0.9)
    X, Y = torch.tensor(x), torch.tensor(np.asarray(y, np.float32).reshape(len(x), -1))
    def fwd(xx):
        h = torch.relu(xx @ w["fc0.weight"].T + w["fc0.bias"])
        return h @ w["fc1.weight"].T + w["fc1.bias"]
    losses = []
    for s in range(steps):
        opt.zero_grad()
        l = loss_fn(fwd(X[:ntrain]), Y[:ntrain]).mean(1).mean()
        losses.append(l.item())
        l.backward()
        opt.step()
    with torch.no_grad():
        test = (test_fn or loss_fn)(fwd(X[ntrain:]), Y[ntrain:]).mean(1).mean().item()
    json.dump({"train": losses, "test": test}, open(f"torch_{name}.json", "w"))

F = torch.nn.functional
wd = init("w_diab.safetensors", [10, 32, 1])
run("mse", xd, yd, 354, wd, lambda p, t: (p - t) ** 2, 0.05)
run("mae", xd, yd, 354, wd, lambda p, t: (p - t).abs(), 0.05)
run("huber", xd, yd, 354, wd, lambda p, t: F.huber_loss(p, t, delta=1.0, reduction="none"), 0.05)
wb = init("w_bc.safetensors", [30, 16, 1])
bce = lambda p, t: F.binary_cross_entropy_with_logits(p, t, reduction="none")
# class weights on the training loss only, as Keras' fit(class_weight): the test loss is plain
run("bc", xb, b.target, 455, wb, lambda p, t: torch.where(t > 0.5, 2.0, 1.0) * bce(p, t), 0.05, bce)
ww = init("w_wine.safetensors", [13, 16, 3])
cww = torch.tensor([1.0, 2.0, 0.5])
ce = lambda p, t: F.cross_entropy(p, t[:, 0].long(), reduction="none")[:, None]
run("wine", xw, yw, 142, ww, lambda p, t: cww[t[:, 0].long()][:, None] * ce(p, t), 0.05, ce)
wm = init("w_ml.safetensors", [20, 32, 5])
run("ml", xm, ym, 320, wm, lambda p, t: F.binary_cross_entropy_with_logits(p, t, reduction="none"), 0.1)
PY

model() { # model FILE INPUTS HIDDEN OUTPUTS LAST_ACTIVATION LOSS BATCH LR [TRAIN_KEY...]
  local f=$1 in=$2 hid=$3 out=$4 act=$5 loss=$6 batch=$7 lr=$8; shift 8
  { printf '[input]\nshape = %s\n[dense]\nname = fc0\nunits = %s\nactivation = relu\n' "$in" "$hid"
    printf '[dense]\nname = fc1\nunits = %s\nactivation = %s\n' "$out" "$act"
    printf '[train]\noptimizer = sgd\nmomentum = 0.9\nlearning_rate = %s\nloss = %s\n' "$lr" "$loss"
    printf 'batch_size = %s\nepochs = %s\n' "$batch" "$STEPS"
    for k in "$@"; do printf '%s\n' "$k"; done; } >"$f"
}
model mse.cfg 10 32 1 none mse 354 0.05
model mae.cfg 10 32 1 none mae 354 0.05
model huber.cfg 10 32 1 none huber 354 0.05 "huber_delta = 1"
model bc.cfg 30 16 1 sigmoid binary_crossentropy 455 0.05 "class_weight = 1, 2"
model ml.cfg 20 32 5 none binary_crossentropy 320 0.1
model wine.cfg 13 16 3 softmax sparse_categorical_crossentropy 142 0.05 "class_weight = 1, 2, 0.5"

# compare NAME RUN: mgtrain's per-epoch losses (one full-batch step each) and the test loss after
# the last against PyTorch's: within 2%.
compare() {
  "$PY" - "$1" "$2" <<'PY'
import json, sys
name, run = sys.argv[1], sys.argv[2]
ref = json.load(open(f"torch_{name}.json"))
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
worst = max(abs(r["loss"] - t) / abs(t) for r, t in zip(rows, ref["train"]))
test = abs(rows[-1]["val_loss"] - ref["test"]) / abs(ref["test"])
print(f"{name}: loss {ref['train'][0]:.4f} -> {rows[-1]['loss']:.4f} (PyTorch {ref['train'][-1]:.4f}), "
      f"test {rows[-1]['val_loss']:.4f} (PyTorch {ref['test']:.4f}); largest relative difference "
      f"{max(worst, test):.2e}")
ok = len(rows) == len(ref["train"]) and worst < 0.02 and test < 0.02
ok = ok and rows[-1]["loss"] < 0.8 * ref["train"][0] # it trains
sys.exit(0 if ok else 1)
PY
}
for name in mse mae huber; do
  out=$(mpi 2 --model "$name.cfg" --data diab --init-weights w_diab.safetensors --out "r_$name" --verbose 2 2>&1) \
    && res=$(compare "$name" "r_$name") && ok "diabetes, $res" || { bad "diabetes with $name: $res"; tail -5 <<<"$out"; }
done
grep -q ' - mae: .* - rmse: .* - val_loss: .* - val_mae: .* - val_rmse: ' <<<"$out" \
  && ! grep -q ' acc: ' <<<"$out" && ok "a regression's epoch lines show mae and rmse, no accuracy" \
  || { bad "a regression's epoch lines"; tail -3 <<<"$out"; }
out=$(mpi 2 --model bc.cfg --data bc --init-weights w_bc.safetensors --out r_bc --verbose 2 2>&1) \
  && res=$(compare bc r_bc) && ok "breast cancer, class weights 1, 2: $res" || { bad "breast cancer: $res"; tail -5 <<<"$out"; }
grep -q ' - acc: .* - precision: .* - recall: .* - f1: .* - val_f1: ' <<<"$out" \
  && ok "a binary model's epoch lines show accuracy, precision, recall and F1" || bad "binary epoch lines"
out=$(mpi 2 --model wine.cfg --data wine --init-weights w_wine.safetensors --out r_wine --verbose 2 2>&1) \
  && res=$(compare wine r_wine) && ok "wine, 3 classes, class weights 1, 2, 0.5: $res" || { bad "wine: $res"; tail -5 <<<"$out"; }
out=$(mpi 2 --model ml.cfg --data ml --init-weights w_ml.safetensors --out r_ml --verbose 2 2>&1) \
  && res=$(compare ml r_ml) && ok "multi-label: $res" || { bad "multi-label: $res"; tail -5 <<<"$out"; }

# The multi-label run's per-label F1: eval's table against scikit-learn's on its predictions.
mpi 2 eval --run r_ml --data ml >eval.txt 2>&1 && mpi 2 predict --run r_ml --data ml --output p.npy >/dev/null 2>&1 \
  && "$PY" - <<'PY' && ok "per-label F1, precision and recall of eval are scikit-learn's" || { bad "per-label figures"; cat eval.txt; }
import numpy as np, sys
from sklearn.metrics import f1_score, precision_score, recall_score
y, p = np.load("ml/test_y.npy"), np.load("p.npy") > 0   # logits: positive where p > 0.5
rows = {l.split()[0]: l.split()[1:] for l in open("eval.txt")
        if len(l.split()) == 5 and l.split()[0].isdigit()}  # label precision recall f1 support
want = [precision_score(y, p, average=None, zero_division=0), recall_score(y, p, average=None, zero_division=0),
        f1_score(y, p, average=None, zero_division=0)]
got = np.array([[float(rows[str(j)][i]) for j in range(5)] for i in range(3)])
print("per-label F1:", " ".join(f"{v:.4f}" for v in want[2]), "| eval:", " ".join(rows[str(j)][2] for j in range(5)))
sys.exit(0 if np.abs(got - np.array(want)).max() <= 5.01e-5 and "5" not in rows else 1)
PY

# --reproducible: mini-batches of 64 on 1 and 2 ranks, the same weights and training figures
# (validation is not computed in chunks: repro.h).
for np in 1 2; do
  mpi "$np" --model ml.cfg --data ml --init-weights w_ml.safetensors --batch-size 64 --epochs 2 \
    --reproducible --out "rep$np" --verbose 0 >/dev/null 2>&1 || bad "--reproducible on $np ranks"
done
train_figs() { "$PY" -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print([r[k] for k in ("loss", "acc", "precision", "recall", "f1", "f1_per_label")])' "$1"; }
cmp -s rep1/weights.safetensors rep2/weights.safetensors \
  && [ -n "$(train_figs rep1/metrics.jsonl)" ] && [ "$(train_figs rep1/metrics.jsonl)" = "$(train_figs rep2/metrics.jsonl)" ] \
  && ok "--reproducible: binary cross-entropy's weights and figures the same bytes on 1 and 2 ranks" \
  || bad "--reproducible differs between 1 and 2 ranks"

# Resumed in the middle of an epoch: the task's sums come back with the checkpoint.
mpi 2 --model ml.cfg --data ml --init-weights w_ml.safetensors --batch-size 64 --epochs 2 --out whole --verbose 0 >/dev/null 2>&1
mpi 2 --model ml.cfg --data ml --init-weights w_ml.safetensors --batch-size 64 --epochs 2 --max-steps 7 --out part --verbose 0 >/dev/null 2>&1
mpi 2 --model ml.cfg --data ml --batch-size 64 --epochs 2 --resume --out part --verbose 0 >/dev/null 2>&1
field() { grep -o "\"$1\": [^,]*" "$2" | tail -1; }
[ -n "$(field f1 whole/metrics.jsonl)" ] && [ "$(field f1 whole/metrics.jsonl)" = "$(field f1 part/metrics.jsonl)" ] \
  && [ "$(field loss whole/metrics.jsonl)" = "$(field loss part/metrics.jsonl)" ] \
  && ok "resumed mid-epoch: the epoch's loss and F1 as without the stop" \
  || bad "resumed mid-epoch: $(field f1 whole/metrics.jsonl) vs $(field f1 part/metrics.jsonl)"
finish
