#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# mgtrain export --format onnx, for every model in examples/ (the tabular ones: an input of rows,
# [batch, F], and a sigmoid or a regression's output): each is trained one step (batch 2,
# synthetic data, plain SGD: no optimizer state to write, which for GPT-2 124M would be 1 GB;
# ResNet-50 at 64x64 and Xception at 71x71, the smallest input it takes, so that a step costs
# seconds: every layer and every tensor is the model file's all the same), exported
# with its batchnorms folded and, for the graph models, kept; ONNX's own checker accepts each file
# (onnx.checker.check_model, full_check = True: the schema, every node against its operator at
# opset 21, shape inference) and ONNX Runtime's outputs equal `mgtrain predict`'s on the same 3
# inputs, run as one batch of 3 and as 3 batches of 1 (the batch dimension is dynamic), to 1e-5 of
# the largest output. Both compute in float32, so they differ by the rounding of their sums: about
# sqrt(K) u (u = 2^-24, K <= 4608 terms: 4e-6) per layer, which over layers adds as a random walk
# would (the errors are independent, each block normalised), ~1e-5 for ResNet-50's 53; folding a
# batchnorm into a convolution rounds its weights once more (u each). predict runs with
# --conv-algo direct, as ONNX Runtime's convolution computes (Winograd's transforms round more).
# The language models (token ids in, [batch, sequence, vocab] logits out) are cut to a context of
# 16 and checked on 3 windows of a val.bin, and on their first 8 positions alone (the sequence
# length is dynamic and the attention causal, so those logits are the same); attention's sums
# are d = 64 terms long, GPT-2 124M's matrix products up to 3072, within the same bound.
# Cost: about 60 s on 2 cores (9 models, the largest two of them twice, onnx and onnxruntime
# installed once into the build folder).
source "$(dirname "$0")/lib.bash"
OPY=$("$MGT_SRC/tests/tools/onnx-python") || { bad "cannot install onnx and onnxruntime from PyPI"; finish; exit 1; }

cat >check.py <<'PY'
import sys, numpy as np, onnx, onnxruntime as ort
path, data, want = sys.argv[1:4]
onnx.checker.check_model(onnx.load(path), full_check=True)
s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
want = np.load(want).astype(np.float64)
if want.ndim == 3:  # a language model: the validation windows of val.bin, T token ids each
    T = want.shape[1]
    tok = np.fromfile(data + "/val.bin", np.uint16).astype(np.int64)
    x = np.stack([tok[i * T:i * T + T] for i in range(len(want))])
else:
    x = np.load(data + "/test_x.npy")
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255
    x = x.astype(np.float32)
one = np.concatenate([s.run(None, {"input": x[i:i + 1]})[0] for i in range(len(x))])
whole = s.run(None, {"input": x})[0]
worst = max(np.abs(y.astype(np.float64) - want).max() for y in (one, whole)) / np.abs(want).max()
extra = ""
if want.ndim == 3:  # a shorter sequence: causal, so its logits are the first positions'
    short = s.run(None, {"input": x[:, :T // 2]})[0]
    worst = max(worst, np.abs(short - want[:, :T // 2]).max() / np.abs(want).max())
    extra = f", and their first {T // 2} positions alone"
print(f"checker accepts it; {len(x)} inputs as 1 batch and as {len(x)}{extra}: {worst:.3g} of the largest output")
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
  if grep -q '^vocab *=' "$cfg"; then # a language model: its context cut to 16 tokens, as the
    # image models' inputs are cut; every layer and every tensor is the model file's all the same
    sed -E 's/^context *= *[0-9]+/context = 16/' "$cfg" >"$name.cfg" && cfg=$PWD/$name.cfg
  fi
  S=(--model "$cfg" "${shape[@]}" --conv-algo direct)
  "$MGT_BIN" train "${S[@]}" --data synthetic --synthetic-samples 2 --batch-size 2 --max-steps 1 \
    --optimizer sgd --no-validation --verbose 0 --out "run-$name" >"$name.log" 2>&1 || { bad "$name: one step of training"; tail -3 "$name.log"; continue; }
  # 3 inputs of the model's shape, on the 0-1 scale; a language model's, 3 windows of tokens
  hwc=$(awk -F'[=,]' '/^shape *=/{gsub(/ /,""); print $2","$3","$4; exit}' "$cfg")
  [ ${#shape[@]} -gt 0 ] && hwc=${shape[1]}
  vocab=$(awk -F'= *' '/^vocab *=/{print $2; exit}' "$cfg")
  if [ -n "$vocab" ]; then
    "$OPY" -c "
import numpy as np, os
os.makedirs('d-$name', exist_ok=True)
r = np.random.default_rng(7)
r.integers(0, $vocab, 3 * 16 + 1).astype(np.uint16).tofile('d-$name/val.bin')
r.integers(0, $vocab, 3 * 16 + 1).astype(np.uint16).tofile('d-$name/train.bin')" || { bad "$name: data"; continue; }
  else "$OPY" -c "
import numpy as np, os, sys
dims = [int(v) for v in '$hwc'.split(',') if v]  # H, W, C, or F for rows of values
os.makedirs('d-$name', exist_ok=True)
r = np.random.default_rng(7)
np.save('d-$name/test_x.npy', r.uniform(0, 1, (3, *dims)).astype(np.float32))
np.save('d-$name/test_y.npy', np.zeros(3, np.int64))
np.save('d-$name/train_x.npy', r.uniform(0, 1, (3, *dims)).astype(np.float32))
np.save('d-$name/train_y.npy', np.zeros(3, np.int64))" || { bad "$name: data"; continue; }
  fi
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
