#!/usr/bin/env bash
# --reproducible on the GPU path (emulated GPUs, MGT_BIN = mgtrain_emu): the weights after
# several steps are the same bytes on 1, 2 and 3 GPUs. A ConvNet with ReLU, max pooling,
# synchronised BatchNorm and dropout (where a rounding difference would flip a gate, so only
# identical arithmetic passes), with Adam; the MLP with --precision bf16; a run stopped on 2 GPUs
# and resumed on 3. The chunks run on whichever rank holds them with the same shapes, so the
# same cuBLAS calls and the same cuDNN algorithms (deterministic ones, chosen by shape alone);
# the exact sums (cuda/gpu_exact.cu) then make the all-reduce independent of the rank count.
source "$MGT_SRC/tests/cli/lib.bash"
export OPENBLAS_NUM_THREADS=1 # emulated ranks share this machine's cores
sed -e 's/^optimizer = sgd/optimizer = adam/' -e 's/^learning_rate = .*/learning_rate = 0.001/' \
  -e 's/activation = tanh/activation = relu/' -e 's/^\[avgpool\]/[maxpool]/' -e '/^algo = direct/d' \
  "$MGT_SRC/tests/cli/smooth.cfg" >"$T/relu.cfg"
grep -q "sync = true" "$T/relu.cfg" && grep -q "^\[maxpool\]" "$T/relu.cfg" || bad "relu.cfg not derived"
cnn=(--model "$T/relu.cfg" --data synthetic --synthetic-samples 600 --verbose 2 --no-validation
     --reproducible --repro-chunk 16)
emu() { # emu GPUS NP ARGS...
  local g=$1 np=$2; shift 2
  MGT_EMU_GPUS=$g timeout 600 mpirun --oversubscribe --bind-to none -x MGT_EMU_GPUS -np "$np" \
    "$MGT_BIN" "$@"
}
hash_of() { sha256sum "$1" 2>/dev/null | cut -c1-16; }
# same_as_one PREFIX WHAT: the weights of the runs PREFIX2 and PREFIX3 (2 and 3 GPUs) are PREFIX1's
same_as_one() {
  local h1 h np
  h1=$(hash_of "${1}1/weights.safetensors")
  for np in 2 3; do
    h=$(hash_of "$1$np/weights.safetensors")
    [ -n "$h1" ] && [ "$h" = "$h1" ] && ok "$2: $np GPUs = 1 GPU, byte for byte ($h)" \
      || bad "$2 on $np GPUs: weights $h, on 1 GPU $h1"
  done
}

# 1. The ConvNet, 10 Adam steps, on 1, 2 and 3 GPUs (100 samples in 7 chunks: 7, 4+3, 3+2+2).
for np in 1 2 3; do
  out=$(emu 3 $np train "${cnn[@]}" --max-steps 10 --profile --out "$T/c$np" 2>&1) \
    || { bad "ConvNet on $np GPUs: $(tail -3 <<<"$out")"; continue; }
  [ $np = 1 ] && one=$out
done
grep -q "reproducible: 7 chunks of 16 samples" <<<"$one" && grep -q "backend gpu" <<<"$one" \
  && ok "--reproducible on the GPU backend: the start-up block says so" \
  || bad "start-up block: $(grep -E 'backend|reproducible' <<<"$one")"
n_det=$(grep -cE "^cuDNN conv .*, deterministic$" <<<"$one")
n_all=$(grep -cE "^cuDNN conv " <<<"$one")
[ "$n_all" -gt 0 ] && [ "$n_det" = "$n_all" ] \
  && ok "every convolution direction runs a deterministic cuDNN algorithm ($n_det lines)" \
  || bad "cuDNN algorithms under --reproducible: $(grep -E '^cuDNN' <<<"$one")"
same_as_one "$T/c" "ConvNet (ReLU, max pooling, sync BatchNorm, dropout), 10 Adam steps"

# 2. The MLP with --precision bf16, 12 steps of 100 samples in 13 chunks of 8, on 1 and 3 GPUs.
for np in 1 3; do
  emu 3 $np train --data synthetic --synthetic-samples 1200 --batch-size 100 --max-steps 12 \
    --no-validation --reproducible --precision bf16 --verbose 0 --out "$T/m$np" >"$T/m$np.log" 2>&1 \
    || { bad "MLP bf16 on $np GPUs"; tail -3 "$T/m$np.log"; }
done
a=$(hash_of "$T/m1/weights.safetensors"); b=$(hash_of "$T/m3/weights.safetensors")
[ -n "$a" ] && [ "$a" = "$b" ] \
  && ok "MLP with --precision bf16, 12 steps: 3 GPUs = 1 GPU, byte for byte ($a)" \
  || bad "MLP bf16: 3 GPUs $b, 1 GPU $a"
# The control: without --reproducible the rank count changes the order of the sums, and the bytes.
for np in 1 3; do
  emu 3 $np train --data synthetic --synthetic-samples 1200 --batch-size 100 --max-steps 12 \
    --no-validation --precision bf16 --verbose 0 --out "$T/d$np" >"$T/d$np.log" 2>&1 \
    || { bad "MLP bf16 (default mode) on $np GPUs"; tail -3 "$T/d$np.log"; }
done
a=$(hash_of "$T/d1/weights.safetensors"); b=$(hash_of "$T/d3/weights.safetensors")
[ -n "$a" ] && [ -n "$b" ] && [ "$a" != "$b" ] \
  && ok "... while without --reproducible 3 GPUs and 1 GPU differ ($b, $a)" \
  || bad "without --reproducible: 3 GPUs $b, 1 GPU $a (the comparison cannot tell)"

# 3. A graph model of fusion groups (model.h: a batchnorm with its ReLU, with a residual sum and
#    its ReLU, two batchnorms summed; convolution biases the batchnorms cancel), a stand-alone
#    ReLU adding into a gradient, an add lending its gradient to an input, separable and
#    depthwise convolutions: 8 Adam steps on 1, 2 and 3 GPUs, the same bytes.
cat >"$T/fused.cfg" <<'CFG'
[input]
shape = 12,12,3
[conv2d]
name = stem
filters = 8
kernel = 3
padding = same
[batchnorm]
name = stem_bn
sync = true
[activation]
name = stem_relu
type = relu
[separable_conv2d]
name = sep
filters = 8
kernel = 3
padding = same
use_bias = false
[batchnorm]
name = sep_bn
sync = true
[add]
name = res1
inputs = sep_bn, stem_relu
[activation]
name = res1_relu
type = relu
[conv2d]
name = sc
filters = 8
kernel = 1
stride = 2
[batchnorm]
name = sc_bn
sync = true
[depthwise_conv2d]
name = dw
input = res1_relu
kernel = 3
stride = 2
padding = same
use_bias = false
[batchnorm]
name = dw_bn
sync = true
[add]
name = res2
inputs = sc_bn, dw_bn
[activation]
name = act2
input = res2
type = relu
[conv2d]
name = c3
filters = 8
kernel = 3
padding = same
activation = tanh
[add]
name = res3
inputs = c3, res2
[global_avgpool]
[dense]
units = 10
activation = softmax
[train]
optimizer = adam
learning_rate = 0.001
loss = sparse_categorical_crossentropy
batch_size = 24
CFG
for np in 1 2 3; do
  emu 3 $np train --model "$T/fused.cfg" --data synthetic --synthetic-samples 240 --max-steps 8 \
    --no-validation --reproducible --repro-chunk 4 --verbose 0 --out "$T/f$np" >"$T/f$np.log" 2>&1 \
    || { bad "fusion groups on $np GPUs"; tail -3 "$T/f$np.log"; }
done
same_as_one "$T/f" "fusion groups, cancelled biases, depthwise"

# 4. Stopped after 6 steps on 2 GPUs (--max-steps, then --resume to 10) and resumed on 3: the
#    weights of the uninterrupted 10 steps.
emu 3 2 train "${cnn[@]}" --max-steps 6 --out "$T/r" >"$T/r1.log" 2>&1 || { bad "first part"; tail -3 "$T/r1.log"; }
emu 3 3 train "${cnn[@]}" --max-steps 10 --resume --out "$T/r" >"$T/r2.log" 2>&1 \
  || { bad "resumed part"; tail -3 "$T/r2.log"; }
h=$(hash_of "$T/r/weights.safetensors") h1=$(hash_of "$T/c1/weights.safetensors")
[ -n "$h1" ] && [ "$h" = "$h1" ] \
  && ok "6 steps on 2 GPUs, resumed on 3 to step 10: the uninterrupted run's bytes ($h)" \
  || bad "stopped and resumed: $h, uninterrupted $h1"
finish
