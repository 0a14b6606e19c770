#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# Early stopping and the best weights, on crafted runs:
#   - a rate too small to change a float weight (1e-30) keeps val_loss exactly constant: with
#     --early-stop 2 the run stops after epoch 3 (epoch 1 is the best, 2 and 3 do not improve),
#     whatever the epochs asked for;
#   - a rate that overfits a small training set (Adam 0.003, 512 samples): val_loss falls, then
#     rises; Keras' EarlyStopping replayed on the logged val_loss stops at the same epoch, the best
#     epoch is its lowest val_loss, best.safetensors holds that epoch's weights (its step in the
#     file's metadata) and with restore_best_weights the run ends with them: weights.safetensors
#     is best.safetensors, and the final test loss is the best epoch's val_loss (validation is the
#     test split here);
#   - on 2 ranks, and stopped after 2 epochs then resumed, the run stops at the same epoch with
#     the same weights (the history is in the checkpoint); resuming a stopped run trains nothing;
#   - monitor = val_acc (higher is better); --early-stop without validation is refused.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/regime.bash"
N=(--data synthetic --synthetic-samples 512 --batch-size 64 --verbose 2) # 8 steps an epoch
rows() { wc -l <"$1/metrics.jsonl"; }

# 1. Constant val_loss: stops after epoch 3.
"$MGT_BIN" train "${N[@]}" --optimizer sgd --lr 1e-30 --epochs 10 --early-stop 2 --out flat >flat.log 2>&1 \
  || { bad "constant run"; tail -5 flat.log; }
[ "$(rows flat)" = 3 ] && grep -q '^Epoch 3: early stopping: val_loss has not improved for 2 epochs (best [0-9.]* at epoch 1)' flat.log \
  && ok "constant val_loss, --early-stop 2: stops after epoch 3 of 10, and says why" \
  || { bad "constant val_loss: $(rows flat) epochs"; grep -i 'epoch' flat.log; }
grep -q "Trained 24 steps" flat.log && [ -s flat/best.safetensors ] \
  && ok "24 steps trained; best.safetensors written" || bad "steps or best.safetensors: $(ls flat)"

# 2. Val_loss that falls, then rises; the best weights restored.
mlp_cfg over learning_rate=0.003 epochs=15 early_stop_patience=2 restore_best_weights=true
"$MGT_BIN" train --model over.cfg "${N[@]}" --out over >over.log 2>&1 || { bad "overfitting run"; tail -5 over.log; }
replay() { # replay RUN PATIENCE METRIC: Keras' EarlyStopping on the logged rows -> "stop best"
  "$PY" - "$1/metrics.jsonl" "$2" "$3" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
patience, key = int(sys.argv[2]), sys.argv[3]
sign = -1 if key == "val_acc" else 1
best, best_epoch, wait, stop = float("inf"), 0, 0, 0
for r in rows:
    v = sign * r[key]
    wait += 1
    if v < best:
        best, best_epoch, wait = v, r["epoch"], 0
    elif wait >= patience and r["epoch"] > 1:
        stop = r["epoch"]
        break
print(stop, best_epoch)
PY
}
read -r stop best < <(replay over 2 val_loss)
n=$(rows over)
if [ "$stop" != 0 ] && [ "$n" = "$stop" ] && [ "$n" -lt 15 ]; then
  ok "overfitting run: stopped after epoch $n of 15, where Keras' rule stops (best epoch $best)"
else bad "overfitting run: $n epochs, Keras' rule stops at '$stop'"; grep '^Epoch' over.log; fi
meta_step() { "$PY" -c 'import sys, weights; print(weights.load(sys.argv[1])[1]["step"])' "$1"; }
[ "$(meta_step over/best.safetensors)" = $((best * 8)) ] \
  && ok "best.safetensors holds epoch $best's weights (step $((best * 8)))" \
  || bad "best.safetensors is from step $(meta_step over/best.safetensors), want $((best * 8))"
grep -q "^Restored the weights of the best epoch, $best (val_loss " over.log \
  && same "restore_best_weights: weights.safetensors is best.safetensors" over/weights.safetensors over/best.safetensors 0 \
  || bad "no restore message: $(tail -4 over.log)"
want=$("$PY" -c "import json,sys; print('%.4f' % [json.loads(l) for l in open('over/metrics.jsonl')][$best - 1]['val_loss'])")
grep -q "^Test loss: $want " over.log && ok "the final test loss is the best epoch's val_loss ($want)" \
  || bad "test loss: $(grep 'Test loss' over.log), want $want"

# 3. On 2 ranks; and stopped after 2 epochs, then resumed: the same stop, the same weights.
mpi 2 train --model over.cfg "${N[@]}" --out over2 >over2.log 2>&1 || { bad "2 ranks"; tail -5 over2.log; }
# (Adam's weights on 2 ranks differ from 1 rank's by rounding that its division by sqrt(v)
# amplifies, 1e-5 after these 40 steps; the decisions, made on val_loss, are the same.)
[ "$(rows over2)" = "$n" ] && [ "$(meta_step over2/best.safetensors)" = $((best * 8)) ] \
  && ok "2 ranks stop after the same epoch ($n), with the same best epoch ($best)" \
  || bad "2 ranks: $(rows over2) epochs, best at step $(meta_step over2/best.safetensors)"
"$MGT_BIN" train --model over.cfg "${N[@]}" --max-steps 16 --out overr >overr1.log 2>&1 \
  && "$MGT_BIN" train --model over.cfg "${N[@]}" --resume --out overr >overr2.log 2>&1 \
  || { bad "stopped and resumed"; tail -n 5 overr1.log overr2.log; }
grep -q "^Epoch $n: early stopping" overr2.log && ok "resumed after epoch 2: stops after epoch $n too" \
  || bad "resumed run: $(grep '^Epoch' overr2.log | tail -3)"
same "resumed: the same final weights" overr/weights.safetensors over/weights.safetensors 0
"$MGT_BIN" train --model over.cfg "${N[@]}" --resume --out overr >overr3.log 2>&1
grep -q "Early stopping ended this run: val_loss has not improved for 2 epochs since epoch $best; nothing to train" overr3.log \
  && grep -q "Trained 0 steps" overr3.log && ok "resuming a stopped run trains nothing and says why" \
  || bad "resuming a stopped run: $(tail -4 overr3.log)"

# 4. monitor = val_acc.
mlp_cfg acc learning_rate=0.003 epochs=15 early_stop_patience=2 monitor=val_acc
"$MGT_BIN" train --model acc.cfg "${N[@]}" --out acc >acc.log 2>&1 || { bad "val_acc run"; tail -5 acc.log; }
read -r stop best < <(replay acc 2 val_acc)
[ "$(rows acc)" = "${stop/#0/15}" ] && ok "monitor = val_acc: $(rows acc) epochs, as Keras' rule (best epoch $best)" \
  || bad "monitor = val_acc: $(rows acc) epochs, Keras' rule stops at $stop"
[ "$(meta_step acc/best.safetensors)" = $((best * 8)) ] && ok "... best.safetensors from its best epoch by accuracy" \
  || bad "val_acc best.safetensors at step $(meta_step acc/best.safetensors), want $((best * 8))"

# 5. Without validation there is nothing to watch.
expect_fail "--early-stop with --no-validation" "early stopping watches val_loss.*--no-validation" \
  "$MGT_BIN" train "${N[@]}" --early-stop 3 --no-validation --out bad
[ ! -e bad ] && ok "... refused before any work" || bad "bad/ was created"
finish
