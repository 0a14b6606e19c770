#!/usr/bin/env bash
# labels: cli
# timeout: 600
# cores: 1
# Label smoothing end to end, for both cross-entropy losses: after training with
# label_smoothing = 0.2, the validation loss the run logged equals Keras' smoothed
# cross-entropy, mean over samples of sum_j t'_j (lse - l_j) with t' = 0.8 * onehot + 0.2 / K,
# computed in double by numpy from the logits `mgtrain predict` writes for the same weights and
# data (a .npy set, so the labels are known), and `mgtrain eval` prints it too; the unsmoothed
# loss of the same logits is far from it, so the key reached the loss. --label-smoothing
# overrides the file. (The ops' loss and gradient: tests/unit/test_smooth_clip.c.)
#
# Tolerance: predict runs the same forward pass on the same batches as validation, so the logits
# are the same; the op forms each sample's loss in double from float exps (within 8 u of the
# exact, u = 2^-24, on a loss ~1.4) and adds a batch's sum in float to the float running sum
# (a rounding of the running sum per batch, 2 batches of 128 here): 1e-6 relative is a few
# times that bound.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/regime.bash"
"$PY" "$MGT_SRC/tests/cli/npy_data.py" data 8 8 1024 256 5 || bad "writing the .npy set"
model() { # model NAME LOSS SMOOTHING
  cat >"$1.cfg" <<CFG
[input]
shape = 8,8,3
[flatten]
[dense]
units = 16
activation = relu
[dense]
units = 4
[train]
optimizer = adam
loss = $2
batch_size = 128
epochs = 2
label_smoothing = $3
CFG
}
check() { # check NAME RUN SMOOTHING: the run's last val_loss against numpy's
  local name=$1 run=$2 s=$3
  "$MGT_BIN" predict --model "$run.cfg" --data data --weights "$run/weights.safetensors" \
    --output "$run.npy" >/dev/null 2>&1 || { bad "$name: predict failed"; return; }
  if "$PY" - "$run" "$s" >"$run.check" 2>&1 <<'PY'; then
import json, sys
import numpy as np
run, s = sys.argv[1], float(np.float32(sys.argv[2]))   # the float the run parsed
l = np.load(run + ".npy").astype(np.float64)
y = np.load("data/test_y.npy")
k = l.shape[1]
lse = l.max(1) + np.log(np.exp(l - l.max(1, keepdims=True)).sum(1))
t = np.eye(k)[y] * (1 - s) + s / k
want = float((t * (lse[:, None] - l)).sum(1).mean())
plain = float((lse - l[np.arange(len(y)), y]).mean())
got = [json.loads(r) for r in open(run + "/metrics.jsonl")][-1]["val_loss"]
print(f"val_loss {got:.9f}, smoothed {want:.9f}, unsmoothed {plain:.6f}")
assert abs(got - want) <= 1e-6 * want and abs(plain - want) > 1e-3 * want
PY
    ok "$name: $(cat "$run.check")"
  else bad "$name: $(tail -3 "$run.check")"; fi
}

model sparse sparse_categorical_crossentropy 0.2
"$MGT_BIN" train --model sparse.cfg --data data --verbose 2 --out sparse >sparse.log 2>&1 \
  || { bad "sparse run"; tail -5 sparse.log; }
check "sparse_categorical_crossentropy, label_smoothing 0.2" sparse 0.2
ev=$("$MGT_BIN" eval --model sparse.cfg --data data --weights sparse/weights.safetensors 2>&1 | grep -o 'loss: [0-9.]*' | grep -o '[0-9.]*$')
want=$("$PY" -c "import json; print('%.4f' % [json.loads(r) for r in open('sparse/metrics.jsonl')][-1]['val_loss'])")
[ "$ev" = "$want" ] && ok "eval prints the smoothed loss too ($ev)" || bad "eval loss $ev, want $want"

model dense categorical_crossentropy 0
"$MGT_BIN" train --model dense.cfg --data data --verbose 2 --label-smoothing 0.1 --out dense >dense.log 2>&1 \
  || { bad "dense run"; tail -5 dense.log; }
sed -i 's/^label_smoothing = 0$/label_smoothing = 0.1/' dense.cfg # what the run trained with
check "categorical_crossentropy, --label-smoothing 0.1 over the file's 0" dense 0.1

expect_fail "label smoothing above 1" "--label-smoothing 1.5: expected a number from 0 \(off\) to 1" \
  "$MGT_BIN" train --model dense.cfg --data data --label-smoothing 1.5 --out bad
finish
