#!/usr/bin/env bash
# labels: e2e
# timeout: 900
# cores: 1
# TensorBoard event files in OUT/tb, read back by the `tensorboard` package from PyPI
# (tests/tools/tb_check.py, EventAccumulator): every epoch scalar at the right step with the value
# metrics.jsonl holds (exactly, in float32), the learning rate, the --profile phase means; a
# resumed run adds a file and leaves the earlier one's bytes alone, and TensorBoard shows both
# runs as one; a new run into the same folder hides the old one's scalars; a run stopped inside
# an epoch and resumed; --no-validation writes no validation scalars; per-step scalars with
# --log-every and a schedule's rates; --no-tensorboard no files.
source "$(dirname "$0")/lib.bash"
PY=$("$MGT_SRC/tests/tools/tensorboard-python") || { bad "no Python with the tensorboard package"; finish; exit 1; }
CHECK=("$PY" "$MGT_SRC/tests/tools/tb_check.py")
tb_ok() { # tb_ok NAME ARGS... : tb_check.py must pass
  local name=$1; shift
  if "${CHECK[@]}" "$@" >check.log 2>&1; then ok "$name ($(grep -c '^ok' check.log) checks)"
  else bad "$name:"; grep -v '^ok' check.log | tail -20; fi
}
N="--data synthetic --synthetic-samples 2048 --batch-size 256 --verbose 0" # 8 steps an epoch
names() { ls "$1" | sort; }

# Two ranks, two epochs, --profile.
mpi 2 $N --epochs 2 --profile --out run >a.log 2>&1 || { bad "first run"; cat a.log; }
cp run/metrics.jsonl a.jsonl
files=$(names run/tb)
[ "$(wc -l <<<"$files")" = 1 ] && grep -qxE "events\.out\.tfevents\.[0-9]{10}\.$(hostname)" <<<"$files" \
  && ok "one event file named events.out.tfevents.<time>.<host>: $files" || bad "event files: $files"
lr=$("$PY" -c "import json; print(json.load(open('run/run.json'))['learning_rate'])")
tb_ok "2 ranks, 2 epochs, --profile" run/tb --jsonl a.jsonl --lr "$lr" --profile 16 a.log
sum_a=$(sha256sum run/tb/events.*)

# Resumed on one rank for a third epoch: a second file; the first one untouched; one run in
# TensorBoard with the three epochs and both profiles.
mpi 1 $N --epochs 3 --profile --resume --out run >b.log 2>&1 || { bad "resumed run"; cat b.log; }
cp run/metrics.jsonl b.jsonl
[ "$(names run/tb | wc -l)" = 2 ] && [ "$(names run/tb | head -1)" = "$files" ] \
  && ok "the resumed run adds a second file, sorted after the first" || bad "files after resume: $(names run/tb)"
sha256sum -c --quiet <<<"$sum_a" && ok "the first file's bytes are unchanged" || bad "the first event file changed"
# b.jsonl holds the whole history: the resumed run keeps the rows up to its checkpoint.
tb_ok "first run and resumed run" run/tb --jsonl b.jsonl --lr "$lr" --profile 16 a.log --profile 24 b.log

# A new run (not resumed) into the same folder, at once: a third file, and TensorBoard shows
# only this run (its SessionLog START drops the older runs' scalars).
mpi 1 $N --epochs 1 --lr 0.0125 --out run --overwrite >c.log 2>&1 || { bad "new run"; cat c.log; }
[ "$(names run/tb | wc -l)" = 3 ] && ok "a new run adds a third file" || bad "files: $(names run/tb)"
tb_ok "a new run into the folder hides the older runs" run/tb --jsonl run/metrics.jsonl --lr 0.0125

# Stopped inside the first epoch (step 3), resumed to its end: both rows, no validation scalars.
mpi 2 $N --epochs 1 --max-steps 3 --no-validation --out part >d.log 2>&1 || { bad "partial run"; cat d.log; }
mpi 2 $N --epochs 1 --no-validation --resume --out part >e.log 2>&1 || { bad "resumed partial run"; cat e.log; }
grep -q '"step": 3,' part/metrics.jsonl && ok "the resumed run keeps the row where the first stopped" ||
  bad "the row at step 3 is gone: $(cat part/metrics.jsonl)"
tb_ok "stopped at step 3, resumed to step 8, --no-validation" part/tb --jsonl part/metrics.jsonl \
  --lr "$lr" --no-val

# Per-step scalars (--log-every 3) and a schedule's rates: 2 ranks, cosine with warm-up, stopped
# at step 10 and resumed; the epoch rows' rates are their own (the rate each epoch ended with).
mpi 2 $N --epochs 3 --log-every 3 --lr-schedule cosine --warmup-steps 4 --max-steps 10 --out sched \
  >g.log 2>&1 || { bad "scheduled run"; cat g.log; }
mpi 2 $N --epochs 3 --log-every 3 --lr-schedule cosine --warmup-steps 4 --resume --out sched \
  >h.log 2>&1 || { bad "resumed scheduled run"; cat h.log; }
tb_ok "per-step scalars and scheduled rates, stopped at step 10 and resumed" sched/tb \
  --jsonl sched/metrics.jsonl --steps sched/metrics_steps.jsonl
[ "$(wc -l <sched/metrics_steps.jsonl)" = 8 ] && ok "rows at steps 3, 6, ..., 24" \
  || bad "step rows: $(cut -c1-20 sched/metrics_steps.jsonl)"

mpi 1 $N --max-steps 2 --no-tensorboard --out none >f.log 2>&1 || { bad "--no-tensorboard run"; cat f.log; }
[ -s none/weights.safetensors ] && [ ! -e none/tb ] && ok "--no-tensorboard: no tb folder" || bad "--no-tensorboard: $(ls none)"

# An OUT/tb that cannot be a folder: one message naming it, before any training.
mkdir bad && touch bad/tb
expect_fail "OUT/tb is a file" "cannot create the TensorBoard folder bad/tb.*--no-tensorboard" \
  mpi 2 $N --max-steps 2 --out bad
[ ! -e bad/weights.safetensors ] && ok "and nothing was trained or saved" || bad "weights written despite the error"
finish
