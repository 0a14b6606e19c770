#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# --reproducible: the same weights, bit for bit, on 1, 2, 3 and 4 ranks.
#
# 40 Adam steps of (a) the seed ConvNet's layer list (examples/convnet.cfg: convolutions, a
# synchronised BatchNorm, max pooling, dropout) with fewer filters and units, to keep the test
# to a couple of minutes on two cores, and (b) the seed MLP (examples/mlp.cfg). The global batch
# of 37 leaves a remainder on every world size and a short last chunk (37 = 4 chunks of 8 and
# one of 5); 600 synthetic samples make epochs of 16 batches of 37 and a last batch of 8 (one
# chunk: three of four ranks idle), so the 40 steps cross two epoch ends (after steps 17 and
# 34). The weights files must have the same sha256 on every world size. Negative control:
# without --reproducible the same runs on 1 and 3 ranks differ (if they happened to match, the
# test says so rather than fail: the rounding of the default mode can come out equal by chance,
# it just need not).
#
# (c) A graph model (residual.cfg: a shortcut [add] around a separable convolution, a [concat],
# depthwise convolution, sync BatchNorm read by two layers, global pooling, dropout) with
# gradient accumulation (2 micro-batches of 37) and clipping by the global norm: the same bits
# on 1, 2 and 4 ranks; set by [train] reproducible = true instead of the flag, the same again;
# a run stopped by SIGTERM on one of its 2 ranks and resumed on 3 ends with those bits too (the
# stop vote and the checkpoint); and a checkpoint of the mode resumes only in the mode.
# Settings the mode cannot honour are refused before anything is written.
source "$(dirname "$0")/lib.bash"

sed -e 's/^filters = 32/filters = 8/' -e 's/^filters = 256/filters = 16/' \
  -e 's/^filters = 128/filters = 16/' -e 's/^units = 128/units = 32/' \
  -e 's/^\[batchnorm\]/[batchnorm]\nsync = true/' "$MGT_SRC/examples/convnet.cfg" >convnet.cfg
grep -q "sync = true" convnet.cfg && grep -q "filters = 16" convnet.cfg || bad "convnet.cfg not derived"
run=(--data synthetic --synthetic-samples 600 --batch-size 37 --epochs 3 --max-steps 40
     --optimizer adam --no-validation --no-tensorboard --verbose 2)
sha() { sha256sum <"$1/weights.safetensors" | cut -d' ' -f1; }

for model in convnet mlp; do
  cfg=convnet.cfg; [ $model = mlp ] && cfg="$MGT_SRC/examples/mlp.cfg"
  for np in 1 2 3 4; do
    mpi $np --model "$cfg" "${run[@]}" --reproducible --out $model-r$np >$model-r$np.log 2>&1 \
      && grep -q "Trained 40 steps" $model-r$np.log \
      || { bad "$model, --reproducible, $np ranks"; tail -5 $model-r$np.log; }
  done
  ref=$(sha $model-r1)
  for np in 2 3 4; do
    got=$(sha $model-r$np)
    [ "$got" = "$ref" ] && ok "$model, 40 steps with --reproducible: weights byte-identical on 1 and $np ranks (sha256 ${ref:0:16}...)" \
      || bad "$model, --reproducible: weights of $np ranks ($got) differ from 1 rank's ($ref)"
  done
  for np in 1 3; do
    mpi $np --model "$cfg" "${run[@]}" --out $model-d$np >$model-d$np.log 2>&1 \
      || { bad "$model, default mode, $np ranks"; tail -5 $model-d$np.log; }
  done
  if cmp -s $model-d1/weights.safetensors $model-d3/weights.safetensors; then
    echo "notice: $model without --reproducible: 1 and 3 ranks happened to give the same bytes"
  else
    ok "$model without --reproducible: 1 and 3 ranks differ (the mode is what makes them equal)"
  fi
done

# (c) the graph model, with accumulation and clipping
R="$MGT_SRC/tests/cli/residual.cfg"
gr=(--data synthetic --synthetic-samples 3000 --batch-size 37 --accum-steps 2 --clip-norm 0.5
    --epochs 3 --max-steps 100 --no-validation --no-tensorboard --verbose 2)
for np in 1 2 4; do
  mpi $np --model "$R" "${gr[@]}" --reproducible --out res-r$np >res-r$np.log 2>&1 \
    && grep -q "Trained 100 steps" res-r$np.log || { bad "residual, $np ranks"; tail -5 res-r$np.log; }
done
ref=$(sha res-r1)
for np in 2 4; do
  [ "$(sha res-r$np)" = "$ref" ] && ok "residual graph, accumulation, clip_norm: byte-identical on 1 and $np ranks" \
    || bad "residual graph: $np ranks' weights differ from 1 rank's"
done
mkdir key # the same file name: the model's name is in the weights file
sed 's/^\[train\]$/[train]\nreproducible = true\nrepro_chunk = 8/' "$R" >key/residual.cfg
mpi 3 --model key/residual.cfg "${gr[@]}" --out res-key >res-key.log 2>&1 || { bad "[train] reproducible = true"; tail -5 res-key.log; }
[ "$(sha res-key)" = "$ref" ] && ok "[train] reproducible = true, 3 ranks: the same bytes as the flag" \
  || bad "[train] reproducible = true gave other weights than --reproducible"

# SIGTERM to one rank of two: both stop at one step and save it (the stop vote is an exact sum
# too); resumed on 3 ranks, the run ends with the uninterrupted run's bits.
mpirun --oversubscribe --bind-to none -np 2 "$MGT_BIN" --model "$R" "${gr[@]}" --reproducible \
  --save-every 5 --out res-sig >res-sig.log 2>&1 &
MP=$!
for _ in $(seq 600); do [ -e res-sig/checkpoint.safetensors ] && break; sleep 0.1; done
kill -TERM "$(pgrep -P $MP | head -1)"
wait $MP
rc=$?
[ $rc -eq 143 ] && grep -qE "interrupted at epoch [0-9]+ step [0-9]+ \(SIGTERM\)" res-sig.log \
  && ok "SIGTERM to one rank: every rank stopped at one step ($(grep -oE 'step [0-9]+' res-sig.log | head -1)), exit 143" \
  || { bad "SIGTERM under --reproducible (exit $rc)"; tail -5 res-sig.log; }
expect_fail "a resume with another chunk is refused" "--repro-chunk 16 \(the run: the default\)" \
  mpi 2 --model "$R" "${gr[@]}" --reproducible --repro-chunk 16 --resume --out res-sig
mpi 3 --model "$R" "${gr[@]}" --reproducible --resume --out res-sig >res-sig2.log 2>&1 \
  || { bad "resume on 3 ranks"; tail -5 res-sig2.log; }
[ "$(sha res-sig)" = "$ref" ] && ok "stopped on 2 ranks, resumed on 3: the uninterrupted run's bytes" \
  || bad "stopped and resumed: weights differ from the uninterrupted run's"

# Refused before the output folder is made: an unsynchronised BatchNorm (its statistics would
# depend on the rank count), too many chunks, --repro-chunk alone, ZeRO-1, early stopping.
expect_fail "--reproducible with a per-rank BatchNorm is refused" \
  "batchnorm layer 'batchnorm_1' .*set sync = true" \
  mpi 2 --model "$MGT_SRC/examples/convnet.cfg" --data synthetic --reproducible --out nosync
[ -e nosync ] && bad "a refused run left its output folder"
expect_fail "--reproducible with more chunks than an exact sum takes is refused" \
  "makes 40000 chunks of 1, more than the 32767 .* raise --repro-chunk to at least 2" \
  "$MGT_BIN" --data synthetic --reproducible --repro-chunk 1 --batch-size 40000 --out many
expect_fail "--repro-chunk without --reproducible is refused" "add reproducible = true \(--reproducible\)" \
  "$MGT_BIN" --data synthetic --repro-chunk 4 --out alone
expect_fail "--reproducible with --zero 1 is refused" "--reproducible and --zero 1 exclude each other" \
  mpi 2 --data synthetic --reproducible --zero 1 --out zero
expect_fail "--reproducible with early stopping is refused" "does not go with early stopping" \
  "$MGT_BIN" --data synthetic --reproducible --early-stop 2 --out early
for d in many alone zero early; do [ -e $d ] && bad "refused run left its output folder $d"; done
finish
