"""tb_check.py: reads an OUT/tb folder with TensorBoard's own reader and checks every scalar.

    tb_check.py TB_DIR --jsonl A.jsonl [B.jsonl ...] [--lr X [--lr X ...]]
                [--steps S.jsonl ...] [--profile STEP LOG ...] [--no-val]

The expected epoch rows are the metrics.jsonl files' rows, in order (one file per run that wrote
into the folder and is still shown); --lr gives each file's learning rate (one for all, or one
per file; without it, each row's own "lr", the rate its epoch ended with). For each tag epoch/loss, epoch/accuracy, epoch/val_loss, epoch/val_accuracy (not
with --no-val), epoch/samples_per_s and epoch/learning_rate, TensorBoard's EventAccumulator must
hold exactly one event per row, at the row's step, whose value is the row's figure rounded to
float32: metrics.jsonl holds each double with all its digits and the event file the same double
as float32, so they agree exactly (no tolerance).

--profile STEP LOG: the profile table that run printed into LOG; profile/<phase>_ms and
profile/step_ms at STEP must be the mean over the table's ranks of each mean column. The table
prints 3 decimals (rounding error up to 0.0005 ms for each entry, so for their mean too), and
the event holds float32 (relative error 2^-24): tolerance 0.0005 ms + 1e-6 relative.

--steps: the per-step rows (--log-every, metrics_steps.jsonl) the folder must show: step/loss,
step/accuracy, step/learning_rate and step/samples_per_s, one event per row at its step, each
the row's figure in float32, exactly.

Rows with top5_acc (a model of more than 5 classes) add epoch/top5_accuracy and
epoch/val_top5_accuracy (val_top5_acc), and step/top5_accuracy for the per-step rows, checked
alike.

No other scalar tag may be present. Prints one line per check; exit status 1 if any failed. """
import argparse
import json
import re
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator as ea

PHASES = ["data", "forward", "backward", "allreduce", "update"]
EPOCH = [("epoch/loss", "loss"), ("epoch/accuracy", "acc"), ("epoch/val_loss", "val_loss"),
         ("epoch/val_accuracy", "val_acc"), ("epoch/samples_per_s", "samples_per_s"),
         ("epoch/learning_rate", "lr")]
STEP = [("step/loss", "loss"), ("step/accuracy", "acc"), ("step/learning_rate", "lr"),
        ("step/samples_per_s", "samples_per_s")]
EPOCH_TOP5 = [("epoch/top5_accuracy", "top5_acc"), ("epoch/val_top5_accuracy", "val_top5_acc")]
STEP_TOP5 = [("step/top5_accuracy", "top5_acc")]

failed = 0


def check(ok, what):
    global failed
    print(("ok: " if ok else "FAIL: ") + what)
    failed += 0 if ok else 1


def profile_means(log):
    """Each rank's row of the profile table in LOG: [5 phase means..., step]."""
    rows, inside = [], False
    for line in open(log):
        if line.startswith("Profile (ms per step"):
            inside, rows = True, []
            continue
        if inside:
            if line.startswith("rank"):
                continue
            if not re.match(r"^\d+\s", line):
                inside = False
                continue
            t = line.replace("/", " ").split()
            rows.append([float(t[1 + 2 * i]) for i in range(len(PHASES))] + [float(t[11])])
    return np.array(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tb_dir")
    ap.add_argument("--jsonl", nargs="+", required=True)
    ap.add_argument("--lr", type=float, action="append", default=[])
    ap.add_argument("--steps", nargs="+", default=[])
    ap.add_argument("--profile", nargs=2, action="append", default=[], metavar=("STEP", "LOG"))
    ap.add_argument("--no-val", action="store_true")
    a = ap.parse_args()
    lrs = a.lr * len(a.jsonl) if len(a.lr) == 1 else a.lr or [None] * len(a.jsonl)
    rows = []
    for path, lr in zip(a.jsonl, lrs):
        for line in open(path):
            r = json.loads(line)
            if lr is not None:
                r["lr"] = lr
            rows.append(r)
    step_rows = [json.loads(line) for path in a.steps for line in open(path)]
    epoch_table, step_table = list(EPOCH), list(STEP)
    if rows and "top5_acc" in rows[0]:
        epoch_table += EPOCH_TOP5
    if step_rows and "top5_acc" in step_rows[0]:
        step_table += STEP_TOP5

    acc = ea.EventAccumulator(a.tb_dir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    # A tag whose every event TensorBoard dropped (an older run's) still has an empty series.
    tags = {t for t in acc.Tags()["scalars"] if acc.Scalars(t)}
    want = {t for t, k in epoch_table if not (a.no_val and k.startswith("val_"))}
    if a.profile:
        want |= {f"profile/{p}_ms" for p in PHASES + ["step"]}
    if step_rows:
        want |= {t for t, _ in step_table}
    check(tags == want, f"scalar tags {sorted(tags)}" +
          ("" if tags == want else f", expected {sorted(want)}"))

    for table, series in ((epoch_table, rows), (step_table, step_rows)):
        for tag, key in table:
            if tag not in want or tag not in tags:
                continue
            ev = acc.Scalars(tag)
            steps = [e.step for e in ev]
            check(steps == [r["step"] for r in series],
                  f"{tag}: steps {steps} (rows' {[r['step'] for r in series]})")
            got = np.array([e.value for e in ev], dtype=np.float32)
            exp = np.array([r[key] for r in series], dtype=np.float32)
            same = len(got) == len(exp) and bool(np.all(got == exp))
            check(same, f"{tag}: values {got.tolist()} equal metrics' in float32 {exp.tolist()}")

    for i, p in enumerate(PHASES + ["step"]):
        tag = f"profile/{p}_ms"
        if tag not in tags:
            continue
        ev = acc.Scalars(tag)
        check([e.step for e in ev] == [int(s) for s, _ in a.profile],
              f"{tag}: steps {[e.step for e in ev]}")
        for e, (step, log) in zip(ev, a.profile):
            table = profile_means(log)
            if len(table) == 0:
                check(False, f"{tag}: no profile table in {log}")
                continue
            mean = float(table[:, i].mean())
            tol = 0.0005 + 1e-6 * abs(mean)
            check(abs(e.value - mean) <= tol,
                  f"{tag} at step {step}: {e.value:.6f} ms, the table's mean over "
                  f"{len(table)} ranks {mean:.4f} (tolerance {tol:.6f})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
