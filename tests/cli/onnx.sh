#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# mgtrain export --format onnx, for every model in examples/ (the tabular ones: an input of rows,
# [batch, F], and a sigmoid or a regression's output): each is trained one step (batch 2,
# synthetic data; ResNet-50 at 64x64 and Xception at 71x71, the smallest input it takes, so that
# a step costs seconds: every layer and every tensor is the model file's all the same), exported
# with its batchnorms folded and, for the graph models, kept; ONNX's own checker accepts each file
# (onnx.checker.check_model, full_check = True: the schema, every node against its operator at
# opset 21, shape inference) and ONNX Runtime's outputs equal `mgtrain predict`'s on the same 3
# inputs, run as one batch of 3 and as 3 batches of 1 (the batch dimension is dynamic), to 1e-5 of
# the largest output. Both compute in float32, so they differ by the rounding of their sums: about
# sqrt(K) u (u = 2^-24, K <= 4608 terms: 4e-6) per layer, which over layers adds as a random walk
# would (the errors are independent, each block normalised), ~1e-5 for ResNet-50's 53; folding a
# batchnorm into a convolution rounds its weights once more (u each). predict runs with
# --conv-algo direct, as ONNX Runtime's convolution computes (Winograd's transforms round more).
# Models with layer types that no export has been written for yet (the sequence layers) are named
# and left out; any other failure to export fails the test.
# Cost: about 60 s on 2 cores (9 models, the largest two of them twice, onnx and onnxruntime
# installed once into the build folder).
source "$(dirname "$0")/lib.bash"
OPY=$("$MGT_SRC/tests/tools/onnx-python") || { bad "cannot install onnx and onnxruntime from PyPI"; finish; exit 1; }
NOT_YET="embedding|layernorm|attention|repeat"

cat >check.py <<'PY'
import sys, numpy as np, onnx, onnxruntime as ort
path, data, want = sys.argv[1:4]
onnx.checker.check_model(onnx.load(path), full_check=True)
s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
x, want = np.load(data + "/test_x.npy"), np.load(want).astype(np.float64)
if x.dtype == np.uint8:
    x = x.astype(np.float32) / 255
x = x.astype(np.float32)
one = np.concatenate([s.run(None, {"input": x[i:i + 1]})[0] for i in range(len(x))])
whole = s.run(None, {"input": x})[0]
worst = max(np.abs(y.astype(np.float64) - want).max() for y in (one, whole)) / np.abs(want).max()
print(f"checker accepts it; {len(x)} inputs as 1 batch and as {len(x)}: {worst:.3g} of the largest output")
sys.exit(0 if worst <= 1e-5 and one.shape == want.shape else 1)
PY

for cfg in "$MGT_SRC"/examples/*.cfg; do
  name=$(basename "$cfg" .cfg)
  shape=() keep=0
  case $name in
    resnet50*) shape=(--input-shape 64,64,3) keep=1 ;;
    xception*) shape=(--input-shape 71,71,3) keep=1 ;;
    resnet_small) keep=1 ;;
  esac
  if types=$(grep -oE "^\[($NOT_YET)\]" "$cfg"); then
    echo "not exported yet: $name ($(sort -u <<<"$types" | tr '\n' ' '))"
    continue
  fi
  S=(--model "$cfg" "${shape[@]}" --conv-algo direct)
  "$MGT_BIN" train "${S[@]}" --data synthetic --synthetic-samples 2 --batch-size 2 --max-steps 1 \
    --no-validation --verbose 0 --out "run-$name" >"$name.log" 2>&1 || { bad "$name: one step of training"; tail -3 "$name.log"; continue; }
  # 3 inputs of the model's shape, on the 0-1 scale
  hwc=$(awk -F'[=,]' '/^shape *=/{gsub(/ /,""); print $2","$3","$4; exit}' "$cfg")
  [ ${#shape[@]} -gt 0 ] && hwc=${shape[1]}
  "$OPY" -c "
import numpy as np, os, sys
dims = [int(v) for v in '$hwc'.split(',') if v]  # H, W, C, or F for rows of values
os.makedirs('d-$name', exist_ok=True)
r = np.random.default_rng(7)
np.save('d-$name/test_x.npy', r.uniform(0, 1, (3, *dims)).astype(np.float32))
np.save('d-$name/test_y.npy', np.zeros(3, np.int64))
np.save('d-$name/train_x.npy', r.uniform(0, 1, (3, *dims)).astype(np.float32))
np.save('d-$name/train_y.npy', np.zeros(3, np.int64))" || { bad "$name: data"; continue; }
  "$MGT_BIN" predict --run "run-$name" "${shape[@]}" --conv-algo direct --data "d-$name" --output "want-$name.npy" \
    >>"$name.log" 2>&1 || { bad "$name: predict"; tail -3 "$name.log"; continue; }
  for bn in fold keep; do
    [ $bn = keep ] && [ $keep -eq 0 ] && continue
    out=$("$MGT_BIN" export --run "run-$name" "${shape[@]}" --format onnx --batchnorm $bn --output "$name-$bn.onnx" 2>&1) \
      || { bad "$name: export --batchnorm $bn: $out"; continue; }
    res=$("$OPY" check.py "$name-$bn.onnx" "d-$name" "want-$name.npy" 2>&1) \
      && ok "$name (batchnorm $bn): $res" || { bad "$name (batchnorm $bn): $res"; }
  done
done
expect_fail "export without --output" "export needs --output FILE.onnx" "$MGT_BIN" export --run run-mlp
finish
