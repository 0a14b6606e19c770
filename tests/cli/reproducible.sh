#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# --reproducible: the same weights, bit for bit, on 1, 2, 3 and 4 ranks.
#
# 200 Adam steps of (a) the seed ConvNet's layer list (examples/convnet.cfg: convolutions, a
# synchronised BatchNorm, max pooling, dropout) with fewer filters and units, to keep the test
# to a couple of minutes on two cores, and (b) the seed MLP (examples/mlp.cfg). The global batch
# of 37 leaves a remainder on every world size and a short last chunk (37 = 4 chunks of 8 and
# one of 5); 3000 synthetic samples make epochs of 81 batches of 37 and a last batch of 3 (one
# chunk: three of four ranks idle), so the 200 steps cross two epoch ends. The weights files
# must have the same sha256 on every world size. Negative control: without --reproducible the
# same runs on 1 and 3 ranks differ (if they happened to match, the test says so rather than
# fail: the rounding of the default mode can come out equal by chance, it just need not).
# Settings the mode cannot honour are refused before anything is written.
source "$(dirname "$0")/lib.bash"

sed -e 's/^filters = 32/filters = 8/' -e 's/^filters = 256/filters = 16/' \
  -e 's/^filters = 128/filters = 16/' -e 's/^units = 128/units = 32/' \
  -e 's/^\[batchnorm\]/[batchnorm]\nsync = true/' "$MGT_SRC/examples/convnet.cfg" >convnet.cfg
grep -q "sync = true" convnet.cfg && grep -q "filters = 16" convnet.cfg || bad "convnet.cfg not derived"
run=(--data synthetic --synthetic-samples 3000 --batch-size 37 --epochs 3 --max-steps 200
     --optimizer adam --no-validation --no-tensorboard --verbose 0)

for model in convnet mlp; do
  cfg=convnet.cfg; [ $model = mlp ] && cfg="$MGT_SRC/examples/mlp.cfg"
  for np in 1 2 3 4; do
    mpi $np --model "$cfg" "${run[@]}" --reproducible --out $model-r$np >$model-r$np.log 2>&1 \
      && grep -q "Trained 200 steps" $model-r$np.log \
      || { bad "$model, --reproducible, $np ranks"; tail -5 $model-r$np.log; }
  done
  ref=$(sha256sum <$model-r1/weights.safetensors | cut -d' ' -f1)
  for np in 2 3 4; do
    got=$(sha256sum <$model-r$np/weights.safetensors | cut -d' ' -f1)
    [ "$got" = "$ref" ] && ok "$model, 200 steps with --reproducible: weights byte-identical on 1 and $np ranks (sha256 ${ref:0:16}...)" \
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

# Refused before the output folder is made: an unsynchronised BatchNorm (its statistics would
# depend on the rank count), too many chunks, --repro-chunk alone.
expect_fail "--reproducible with a per-rank BatchNorm is refused" \
  "batchnorm layer 'batchnorm_1' .*set sync = true" \
  mpi 2 --model "$MGT_SRC/examples/convnet.cfg" --data synthetic --reproducible --out nosync
[ -e nosync ] && bad "a refused run left its output folder"
expect_fail "--reproducible with more chunks than an exact sum takes is refused" \
  "makes 40000 chunks of 1, more than the 32767 .* raise --repro-chunk to at least 2" \
  "$MGT_BIN" --data synthetic --reproducible --repro-chunk 1 --batch-size 40000 --out many
expect_fail "--repro-chunk without --reproducible is refused" "add --reproducible" \
  "$MGT_BIN" --data synthetic --repro-chunk 4 --out alone
finish
