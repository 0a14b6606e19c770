#!/usr/bin/env bash
# labels: mpi
# timeout: 600
# --log-every N: per-step rows in OUT/metrics_steps.jsonl and .csv beside the per-epoch files.
#   - 2 ranks, N = 3, 2 epochs of 8 steps: rows at steps 3, 6, 9, 12, 15 with the fraction of
#     epochs done, the rate, samples/s; the CSV holds the JSON rows' figures to 6 digits;
#   - N = 1: the rows of an epoch add up to its epoch row: sum of loss x samples over its steps
#     (the last one shorter: 1000 samples in batches of 128) is the epoch's loss x samples, and
#     the same for the accuracy (double sums of the same float step sums, in another order:
#     1e-12 relative); logging changes nothing else: the epoch rows' loss, accuracy and
#     validation figures and the weights are those of a run without it, bit for bit;
#   - stopped at step 7 and resumed: rows 2, 4, ..., 16 once each; a damaged last line and a row
#     the stopped run wrote after its checkpoint are gone; a new run (--overwrite) starts the
#     files afresh.
# TensorBoard's step scalars: tests/cli/tensorboard.sh. The GPU path: tests/gpu/emu.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/regime.bash"
N=(--data synthetic --synthetic-samples 1024 --batch-size 128 --verbose 0 --epochs 2) # 8 steps an epoch

# 1. Two ranks, every 3 steps.
mpi 2 train "${N[@]}" --log-every 3 --out a >a.log 2>&1 || { bad "2-rank run"; tail -5 a.log; }
if "$PY" - a >a.check 2>&1 <<'PY'; then
import csv, json, sys
import numpy as np
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics_steps.jsonl")]
assert [r["step"] for r in rows] == [3, 6, 9, 12, 15], [r["step"] for r in rows]
# 10 classes: top-5 accuracy too
assert set(rows[0]) == {"step", "epoch", "loss", "acc", "lr", "samples_per_s", "top5_acc"}, rows[0]
for r in rows:
    assert r["epoch"] == r["step"] / 8, r
    assert r["lr"] == float(np.float32(0.001)), r      # Adam's default rate, no schedule
    assert r["samples_per_s"] > 0 and 0 < r["loss"] < 10 and 0 <= r["acc"] <= r["top5_acc"] <= 1, r
c = list(csv.DictReader(open(sys.argv[1] + "/metrics_steps.csv")))
assert list(c[0]) == ["step", "epoch", "loss", "acc", "lr", "samples_per_s", "top5_acc"], list(c[0])
for r, q in zip(rows, c, strict=True):
    assert int(q["step"]) == r["step"]
    for k in ("epoch", "loss", "acc", "lr", "top5_acc"):
        assert float(q[k]) == float(f"{r[k]:.6g}"), (k, q[k], r[k])
print(f"{len(rows)} rows, e.g. {json.dumps(rows[1])}")
PY
  ok "rows every 3 steps on 2 ranks: $(cat a.check)"
else bad "rows every 3 steps: $(tail -3 a.check)"; fi

# 2. Every step, against the epoch rows, and against a run without rows.
N1=(--data synthetic --synthetic-samples 1000 --batch-size 128 --verbose 0 --epochs 2)
"$MGT_BIN" train "${N1[@]}" --log-every 1 --out b >b.log 2>&1 || { bad "every-step run"; tail -5 b.log; }
"$MGT_BIN" train "${N1[@]}" --out c >c.log 2>&1 || { bad "plain run"; tail -5 c.log; }
if "$PY" - b c >b.check 2>&1 <<'PY'; then
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics_steps.jsonl")]
epochs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
plain = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
assert [r["step"] for r in rows] == list(range(1, 17))
n = [128] * 7 + [104]                  # samples of each step of an epoch
for e in epochs:
    mine = rows[(e["epoch"] - 1) * 8:e["epoch"] * 8]
    for key in ("loss", "acc"):
        s = sum(r[key] * k for r, k in zip(mine, n))
        assert abs(s - e[key] * 1000) <= 1e-12 * abs(s), (key, s, e[key] * 1000)
for e, p in zip(epochs, plain, strict=True):
    for key in ("loss", "acc", "val_loss", "val_acc", "lr", "step"):
        assert e[key] == p[key], (key, e[key], p[key])
print("16 rows; each epoch's rows add up to its row; the epoch rows equal a run's without --log-every")
PY
  ok "every step: $(cat b.check)"
else bad "every step: $(tail -3 b.check)"; fi
same "--log-every changes no weight" b/weights.safetensors c/weights.safetensors 0

# 3. Stopped at step 7 (checkpoint there), damaged, resumed.
"$MGT_BIN" train "${N[@]}" --log-every 2 --max-steps 7 --out r >r1.log 2>&1 || { bad "stopped run"; tail -5 r1.log; }
printf '{"step": 8, "epoch": 1, "loss": 9, "acc": 0, "lr": 0, "samples_per_s": 0}\n{"step": 1' >>r/metrics_steps.jsonl
printf '8,1,9,0,0,0\n1' >>r/metrics_steps.csv
"$MGT_BIN" train "${N[@]}" --log-every 2 --resume --out r >r2.log 2>&1 || { bad "resumed run"; tail -5 r2.log; }
if "$PY" - r >r.check 2>&1 <<'PY'; then
import csv, json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics_steps.jsonl")]
c = list(csv.DictReader(open(sys.argv[1] + "/metrics_steps.csv")))
assert [r["step"] for r in rows] == list(range(2, 17, 2)), [r["step"] for r in rows]
assert [int(q["step"]) for q in c] == list(range(2, 17, 2)), [q["step"] for q in c]
assert all(r["loss"] < 9 for r in rows), "the stale row is still there"
print("rows 2, 4, ..., 16 in both files")
PY
  ok "stopped at 7, a stale and a cut row added, resumed: $(cat r.check)"
else bad "resumed rows: $(tail -3 r.check)"; fi
"$MGT_BIN" train "${N[@]}" --log-every 4 --max-steps 8 --overwrite --out r >r3.log 2>&1 || { bad "new run"; tail -5 r3.log; }
[ "$(cut -d, -f1 r/metrics_steps.csv | tr '\n' ' ')" = "step 4 8 " ] \
  && ok "a new run into the folder starts the rows afresh" || bad "rows after a new run: $(cat r/metrics_steps.csv)"
[ ! -e c/metrics_steps.jsonl ] && ok "no step files without --log-every" || bad "step files without --log-every"
finish
