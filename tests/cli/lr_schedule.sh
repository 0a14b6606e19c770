#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# Learning-rate schedules and warm-up, end to end: the rate every step trained with, as
# --log-every 1 logs it (metrics_steps.jsonl, every digit), equals the formula of schedule.h at
# that step for cosine with warm-up, step decay at listed epochs, exponential decay and the
# plateau rule; the same on 2 ranks as on 1; a run stopped mid-epoch and resumed uses the same
# rates and ends with the same weights as an uninterrupted one, for the plateau rule across a
# cut too (its history is in the checkpoint). Epoch rows carry the rate the epoch ended with.
#
# Tolerance of a rate: the trainer computes it in double and rounds once to float32; the
# reference below computes the same formula in double in its own order (error ~1e-16), so the
# two floats are equal or, where the double values straddle a rounding boundary, one float ulp
# apart: 2^-23 relative.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/regime.bash"
N=(--data synthetic --synthetic-samples 1024 --batch-size 128 --verbose 2) # 8 steps an epoch
# check_rates NAME RUN FORMULA: every step row's lr equals FORMULA(t) for the step t it ended
# (t = row step - 1), and the rows are steps 1..the last, once each. FORMULA is a Python
# expression in t (and math).
check_rates() {
  local name=$1 run=$2 formula=$3
  if "$PY" - "$run/metrics_steps.jsonl" "$formula" >"$name.check" 2>&1 <<'PY'; then
import json, math, sys
import numpy as np
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in rows]
assert steps == list(range(1, len(rows) + 1)), f"steps {steps}"
worst = 0.0
for r in rows:
    t = r["step"] - 1
    want = float(np.float32(eval(sys.argv[2], {"math": math, "t": t})))
    err = abs(r["lr"] - want) / abs(want) if want else abs(r["lr"])
    assert err <= 2.0 ** -23, f"step {r['step']}: lr {r['lr']!r}, formula {want!r}"
    worst = max(worst, err)
print(f"{len(rows)} steps, worst relative difference {worst:.2g}")
PY
    ok "$name: every step's rate is the formula's ($(cat "$name.check"))"
  else bad "$name: $(tail -3 "$name.check")"; fi
}
epoch_lr_is_last_step() { # the epoch rows' lr is the rate of each epoch's last step
  "$PY" - "$1" <<'PY'
import json, sys
steps = {json.loads(l)["step"]: json.loads(l)["lr"] for l in open(sys.argv[1] + "/metrics_steps.jsonl")}
for l in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(l)
    assert r["lr"] == steps[r["step"]], (r, steps.get(r["step"]))
PY
}

# 1. Cosine from 0.1 to lr_min 0.001 after a 5-step warm-up, over 3 epochs (24 steps): D = 19.
mlp_cfg cos optimizer=sgd learning_rate=0.1 lr_schedule=cosine lr_min=0.001 warmup_steps=5 epochs=3
"$MGT_BIN" train --model cos.cfg "${N[@]}" --log-every 1 --out cos >cos.log 2>&1 \
  || { bad "cosine run"; tail -5 cos.log; }
check_rates "cosine with warm-up" cos \
  "0.1 * (t + 1) / 5 if t < 5 else 0.001 + (0.1 - 0.001) * 0.5 * (1 + math.cos(math.pi * (t - 5) / 19))"
epoch_lr_is_last_step cos && ok "cosine: each epoch row's lr is its last step's" \
  || bad "cosine: epoch rows' lr"

# The same on 2 ranks: the same rates, bit for bit, and the same weights (to rounding: the
# invariance test's 1e-5).
mpi 2 train --model cos.cfg "${N[@]}" --log-every 1 --out cos2 >cos2.log 2>&1 \
  || { bad "cosine on 2 ranks"; tail -5 cos2.log; }
cmp -s <("$PY" -c 'import json,sys; [print(json.loads(l)["lr"]) for l in open(sys.argv[1])]' cos/metrics_steps.jsonl) \
       <("$PY" -c 'import json,sys; [print(json.loads(l)["lr"]) for l in open(sys.argv[1])]' cos2/metrics_steps.jsonl) \
  && ok "cosine: 2 ranks step with the same rates as 1" || bad "cosine: rates differ between 1 and 2 ranks"
same "cosine: 2 ranks against 1" cos2/weights.safetensors cos/weights.safetensors 1e-5

# Stopped inside the second epoch (step 11) and resumed: the same rates, the same weights.
"$MGT_BIN" train --model cos.cfg "${N[@]}" --log-every 1 --max-steps 11 --out cosr >cosr1.log 2>&1 \
  && "$MGT_BIN" train --model cos.cfg "${N[@]}" --log-every 1 --resume --out cosr >cosr2.log 2>&1 \
  || { bad "cosine stopped and resumed"; tail -n 5 cosr1.log cosr2.log; }
check_rates "cosine, stopped at step 11 and resumed" cosr \
  "0.1 * (t + 1) / 5 if t < 5 else 0.001 + (0.1 - 0.001) * 0.5 * (1 + math.cos(math.pi * (t - 5) / 19))"
same "cosine: resumed run against the uninterrupted one" cosr/weights.safetensors cos/weights.safetensors 0

# 2. Step decay at epochs 1 and 2 (rate 0.5), after a half-epoch (4-step) warm-up, by flags.
mlp_cfg stp optimizer=sgd learning_rate=0.08 lr_decay_epochs=1,2 lr_decay_rate=0.5 epochs=3
"$MGT_BIN" train --model stp.cfg "${N[@]}" --lr-schedule step --warmup-epochs 0.5 --log-every 1 \
  --out stp >stp.log 2>&1 || { bad "step run"; tail -5 stp.log; }
check_rates "step decay at epochs 1, 2 with warm-up" stp \
  "0.08 * 0.5 ** ((t >= 8) + (t >= 16)) * min(1, (t + 1) / 4)"

# 3. Exponential: 0.5 per 2 epochs (16 steps), every step, floored at lr_min.
mlp_cfg exp optimizer=adam learning_rate=0.01 lr_schedule=exponential lr_decay_epochs=2 lr_decay_rate=0.5 lr_min=0.006 epochs=3
"$MGT_BIN" train --model exp.cfg "${N[@]}" --log-every 1 --out exp >exp.log 2>&1 \
  || { bad "exponential run"; tail -5 exp.log; }
check_rates "exponential with a floor" exp "max(0.006, 0.01 * 0.5 ** (t / 16))"

# 4. Plateau: with a rate too small to change a float weight (1e-30), val_loss stays exactly
#    the same, so with patience 1 and factor 0.5 ReduceLROnPlateau cuts after epochs 2, 3, 4 (and 5):
#    epochs 1-2 at the rate, epoch 3 at half, epoch 4 at a quarter, epoch 5 at an eighth.
mlp_cfg plat optimizer=sgd learning_rate=1e-30 lr_schedule=plateau lr_plateau_patience=1 lr_plateau_factor=0.5 epochs=5
"$MGT_BIN" train --model plat.cfg "${N[@]}" --log-every 1 --out plat >plat.log 2>&1 \
  || { bad "plateau run"; tail -5 plat.log; }
check_rates "plateau: cuts after epochs 2, 3, 4" plat "1e-30 * 0.5 ** max(0, t // 8 - 1)"
[ "$(grep -c 'val_loss has not improved for 1 epochs; learning rate cut to' plat.log)" = 4 ] \
  && ok "plateau: four cuts announced (after epochs 2 to 5)" || { bad "plateau: cut messages"; grep -i cut plat.log; }
# Stopped at the end of epoch 3 (after one cut) and resumed: the history comes back from the
# checkpoint and the rates go on as before.
"$MGT_BIN" train --model plat.cfg "${N[@]}" --log-every 1 --epochs 3 --out platr >platr1.log 2>&1 \
  && "$MGT_BIN" train --model plat.cfg "${N[@]}" --log-every 1 --resume --out platr >platr2.log 2>&1 \
  || { bad "plateau stopped and resumed"; tail -n 5 platr1.log platr2.log; }
check_rates "plateau, resumed after epoch 3" platr "1e-30 * 0.5 ** max(0, t // 8 - 1)"

# A real run: Keras' ReduceLROnPlateau replayed on the logged val_loss predicts every epoch's
# rate (SGD at a rate that overshoots, so the loss does not fall every epoch).
mlp_cfg plat2 optimizer=sgd learning_rate=0.5 lr_schedule=plateau lr_plateau_patience=1 lr_plateau_factor=0.5 lr_plateau_min_delta=0.01 epochs=6
"$MGT_BIN" train --model plat2.cfg "${N[@]}" --out plat2 >plat2.log 2>&1 \
  || { bad "plateau run 2"; tail -5 plat2.log; }
if "$PY" - plat2/metrics.jsonl >plat2.check 2>&1 <<'PY'; then
import json, sys
import numpy as np
rows = [json.loads(l) for l in open(sys.argv[1])]
lr, best, wait, cuts = 0.5, float("inf"), 0, 0
for r in rows:
    assert r["lr"] == float(np.float32(lr)), f"epoch {r['epoch']}: lr {r['lr']}, Keras' rule {lr}"
    # ReduceLROnPlateau(patience=1, factor=0.5, min_delta=0.01, cooldown=0), after the epoch
    if r["val_loss"] < best - np.float32(0.01):
        best, wait = r["val_loss"], 0
    else:
        wait += 1
        if wait >= 1:
            lr, wait, cuts = lr * 0.5, 0, cuts + 1
print(f"{len(rows)} epochs, {cuts} cuts")
PY
  ok "plateau on a real run: every epoch's rate is Keras' rule's ($(cat plat2.check))"
else bad "plateau on a real run: $(tail -3 plat2.check)"; fi

# 5. Bad combinations: one message before any work, nothing written.
mlp_cfg bad1 lr_schedule=step
expect_fail "a step schedule without lr_decay_epochs" \
  "lr_schedule = step needs lr_decay_epochs.*e.g. lr_decay_epochs = 30" \
  "$MGT_BIN" train --model bad1.cfg "${N[@]}" --out bad1
[ ! -e bad1 ] && ok "... and no output folder" || bad "bad1/ was created"
expect_fail "plateau without validation" "plateau.*--no-validation" \
  "$MGT_BIN" train --model plat.cfg "${N[@]}" --no-validation --out bad2
expect_fail "a schedule name with a typo" "--lr-schedule cosin: unknown \(did you mean cosine\?\)" \
  "$MGT_BIN" train "${N[@]}" --lr-schedule cosin --out bad3
finish
