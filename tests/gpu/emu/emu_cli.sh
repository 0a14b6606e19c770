#!/usr/bin/env bash
# mgtrain's GPU path end to end on emulated GPUs (MGT_BIN = mgtrain_emu, see emu.h): the trainer
# against the CPU binary, ranks on several GPUs over the NCCL transport, the staged MPI transport,
# placement and its errors, the fault hook with NCCL, and two ranks on one GPU.
source "$MGT_SRC/tests/cli/lib.bash"
: "${MGT_CPU_BIN:?}" "${MGT_NCCL_TEST:?}"
export OPENBLAS_NUM_THREADS=1 # emulated ranks share this machine's cores
SMALL="$MGT_SRC/examples/smallconv.cfg"
run=(--data synthetic --synthetic-samples 768 --batch-size 96 --max-steps 8 --verbose 2
     --no-validation)
emu() { # emu GPUS NP ARGS...
  local g=$1 np=$2; shift 2
  MGT_EMU_GPUS=$g timeout 600 mpirun --oversubscribe --bind-to none -x MGT_EMU_GPUS -np "$np" \
    "$MGT_BIN" "$@"
}

# The smooth ConvNet of tests/cli/smooth.cfg for the comparisons of numbers (the GPU and the
# CPU, or 1 and 2 GPUs, round their sums differently), with RMSprop; direct convolutions on the
# CPU (the emulated cuDNN sums in double).
sed -e 's/^optimizer = sgd/optimizer = rmsprop/' -e 's/^learning_rate = .*/learning_rate = 0.001/' \
  -e 's/^batch_size = .*/batch_size = 96/' "$MGT_SRC/tests/cli/smooth.cfg" >"$T/smooth.cfg"
# addends per gradient element (tests/tools/gradcmp.py): 96 samples, times 26x26 output pixels
# for conv1 and 12x12 for conv2 and the BatchNorm
K=(conv1=$((96 * 26 * 26)) conv2=$((96 * 144)) bn=$((96 * 144)) fc=96)
GRADCMP=(/usr/bin/python3 "$MGT_SRC/tests/tools/gradcmp.py")

# 1. One emulated GPU against the CPU backend (the batches are generated on the device here, the
#    host there): the first step's gradient sums within float32 rounding of a sum, and the
#    weights after 8 RMSprop steps to 1e-5 (the per-step agreement, 2 u sqrt(K) <= 1.3e-5 of the
#    gradient, scaled by RMSprop's bounded step of about lr = 1e-3 per step: differences of
#    ~1e-7 of the weights per step, 1e-5 allowing for their growth over 8 steps).
out=$(MGT_DUMP_GRADIENTS=$T/g1.st emu 1 1 train --model "$T/smooth.cfg" "${run[@]}" --out "$T/g1" 2>&1)
echo "$out" | tail -4
grep -q "backend gpu, transport mpi" <<<"$out" && ok "one rank trains on the emulated GPU" \
  || bad "one rank on the emulated GPU: $(tail -3 <<<"$out")"
MGT_DUMP_GRADIENTS=$T/c1.st "$MGT_CPU_BIN" train --model "$T/smooth.cfg" "${run[@]}" --device cpu \
  --out "$T/c1" >/dev/null 2>&1
out=$("${GRADCMP[@]}" "$T/c1.st" "$T/g1.st" "${K[@]}" 2>&1) \
  && ok "GPU and CPU: one step's gradients (ConvNet, batchnorm, dropout) within rounding" \
  || { bad "GPU and CPU: one step's gradients"; echo "$out"; }
same "GPU and CPU weights after 8 RMSprop steps" "$T/g1/weights.safetensors" \
  "$T/c1/weights.safetensors" 1e-5

# 2. Two ranks on two GPUs over NCCL: the same gradients and weights as one rank.
out=$(MGT_DUMP_GRADIENTS=$T/g2.st emu 2 2 train --model "$T/smooth.cfg" "${run[@]}" --out "$T/g2" 2>&1)
grep -q "backend gpu, transport nccl" <<<"$out" && ok "two ranks use the NCCL transport" \
  || bad "two ranks: $(tail -5 <<<"$out")"
grep -q "rank 1: .*local rank 1, GPU 1: Emulated GPU 1, PCI 00000000:19:00.0" <<<"$out" \
  && ok "the start-up block shows each rank's GPU and bus id" \
  || bad "start-up block: $(grep -i 'gpu' <<<"$out" | head -4)"
out=$("${GRADCMP[@]}" "$T/g1.st" "$T/g2.st" "${K[@]}" 2>&1) \
  && ok "2 ranks (NCCL) against 1 rank: one step's gradients within rounding" \
  || { bad "2 ranks (NCCL) against 1 rank: one step's gradients"; echo "$out"; }
same "2 ranks (NCCL) against 1 rank: weights after 8 steps" "$T/g2/weights.safetensors" \
  "$T/g1/weights.safetensors" 1e-5

# 3. The staged MPI transport gives the same result.
out=$(emu 2 2 train --model "$T/smooth.cfg" "${run[@]}" --transport mpi --out "$T/g2m" 2>&1)
grep -q "transport mpi-staged" <<<"$out" && ok "--transport mpi on GPUs stages through the host" \
  || bad "--transport mpi: $(tail -5 <<<"$out")"
same "2 ranks (staged MPI) against 2 ranks (NCCL)" "$T/g2m/weights.safetensors" \
  "$T/g2/weights.safetensors" 1e-6

# 4. --transport nccl on one rank runs the all-reduce (timed by --profile), same weights.
out=$(emu 1 1 train --model "$T/smooth.cfg" "${run[@]}" --transport nccl --profile --out "$T/g1n" 2>&1)
grep -q "transport nccl" <<<"$out" && grep -q "^Profile" <<<"$out" \
  && ok "--transport nccl on one rank, with the device-timed profile" \
  || bad "--transport nccl, one rank: $(tail -5 <<<"$out")"
# The profile's algorithm log: each convolution direction's cuDNN algorithm, math type, layout,
# workspace, how it was chosen (measured: cuDNN's Find, on the emulator's timing model),
# determinism and measured time: five lines, as the first convolution's input needs no gradient
# (no backward-data).
n_algo=$(grep -cE "^cuDNN conv n=[0-9]+ [0-9x]+ -> [0-9x]+ k=3x3 s=[12] --conv-algo direct, (forward|backward-data|backward-filter): [A-Z_0-9]+, FMA_MATH, N(HW|CH)C, workspace [0-9]+ bytes, measured, (non-)?deterministic; [0-9.]+ ms$" <<<"$out")
[ "$n_algo" -eq 5 ] && ok "--profile logs the cuDNN algorithm of both convolutions in each direction" \
  || bad "--profile's algorithm log has $n_algo of 5 lines: $(grep -E "^(GPU|cuDNN)" <<<"$out")"
same "one rank with the NCCL all-reduce against without" "$T/g1n/weights.safetensors" \
  "$T/g1/weights.safetensors" 0

# 5. Real data on 2 GPUs against the CPU: batches gathered on the device from the training set
#    kept there, and (--device-data off) gathered on the host into pinned buffers and copied.
if [ -f "$DATA/train-images-idx3-ubyte.gz" ] || [ -f "$DATA/train-images-idx3-ubyte" ]; then
  mlp=(--data "$DATA" --batch-size 128 --max-steps 12 --verbose 2 --no-validation)
  MGT_DUMP_GRADIENTS=$T/r2.st emu 2 2 train "${mlp[@]}" --out "$T/r2" >/dev/null 2>&1
  emu 2 2 train "${mlp[@]}" --device-data off --out "$T/r2h" >/dev/null 2>&1
  MGT_DUMP_GRADIENTS=$T/rc.st "$MGT_CPU_BIN" train "${mlp[@]}" --device cpu --out "$T/rc" >/dev/null 2>&1
  # The first step's gradients, 128 addends each: from the same weights and data the two
  # forward passes differ by rounding only, and a ReLU gate flips only where a pre-activation
  # lies within that rounding (~1e-7 of its scale) of zero: for these 64K gates, odds well
  # under 1% (an all-zero input row, which gives exact zeros, cannot occur in a dense layer).
  out=$("${GRADCMP[@]}" "$T/rc.st" "$T/r2.st" dense_=128 2>&1) \
    && ok "Fashion-MNIST MLP, 2 emulated GPUs (data on the GPUs) against the CPU: one step's gradients within rounding" \
    || { bad "Fashion-MNIST MLP on 2 emulated GPUs against the CPU"; echo "$out"; }
  same "... and with the batches copied from the host: the same 12 steps" "$T/r2h/weights.safetensors" \
    "$T/r2/weights.safetensors" 0
fi

# 6. Memory: no allocation inside the step loop (an 8-step run makes as many as a 4-step one),
#    TF32 changes the numbers only slightly, and running out of memory says what to do.
for s in 4 8; do
  MGT_EMU_STATS="$T/stats$s" emu 1 1 train --model "$SMALL" "${run[@]}" --synthetic-samples 3072 \
    --max-steps $s --out "$T/m$s" >/dev/null 2>&1
done
a=$(cat "$T/stats4" 2>/dev/null); b=$(cat "$T/stats8" 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] \
  && ok "no device or pinned allocation inside the step loop ($a, for 4 and for 8 steps)" \
  || bad "allocations differ between 4 and 8 steps: '$a' / '$b'"
out=$(emu 1 1 train --model "$SMALL" "${run[@]}" --tf32 --out "$T/tf" 2>&1)
l32=$(sed -n 's/.* - loss: \([0-9.]*\).*/\1/p' <<<"$(emu 1 1 train --model "$SMALL" "${run[@]}" --out "$T/f32" 2>&1)")
near_fp32() { # near_fp32 FLAG RUN_DIR OUTPUT: other weights than FP32's, a loss within 2% of it
  local l
  l=$(sed -n 's/.* - loss: \([0-9.]*\).*/\1/p' <<<"$3")
  if "$MGT_COMPARE" "$2/weights.safetensors" "$T/f32/weights.safetensors" 0 >/dev/null; then
    bad "$1 gave bit-identical weights: it changed no arithmetic"
  elif awk -v a="$l32" -v b="$l" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d < 0.02 * a) }'; then
    ok "$1 changes the weights, and the training loss only slightly ($l32 -> $l)"
  else
    bad "$1: training loss $l against $l32 in FP32"
  fi
}
near_fp32 --tf32 "$T/tf" "$out"
# --precision bf16: activations stored in bfloat16 between layers, GEMMs and convolutions on them
# with float accumulation. The weights change; the loss after 8 steps stays within 2% of FP32's:
# each stored activation is rounded once, to nearest even (at most 2^-8 relative, unbiased), and
# smallconv stores 7 of them between its input and its logits, so a logit moves by at most
# 7 x 2^-8 (2.7%) of the magnitudes it sums where every rounding adds up, and by about
# sqrt(7/3) x 2^-8 (0.6%) with independent roundings; the loss, a mean over the batch of a
# function whose slope in each logit is at most 1, moves by about that, and the steps are
# RMSprop's bounded ones. The profile says so, per convolution too; and the step loop allocates
# nothing (the workspace grows by the bfloat16 weights at the first step only).
out=$(emu 1 1 train --model "$SMALL" "${run[@]}" --precision bf16 \
  --profile --out "$T/bf" 2>&1)
near_fp32 "--precision bf16" "$T/bf" "$out"
# conv2 (16 -> 32 channels) meets cuDNN's documented requirements for tensor-op math; conv1 (1 ->
# 16) would not, where the emulated cuDNN chooses default math forward and backward-filter
# (emu_cudnn.cpp), as cuDNN 9.19 did on an H100: its one input channel is padded to 8 for it, and
# it runs on the tensor cores too.
grep -q "^GPU arithmetic: bf16 mixed precision: dense layers and convolutions on bfloat16 inputs with fp32 accumulation" <<<"$out" \
  && [ "$(grep -cE "^cuDNN conv .*: [A-Z_0-9]+, TENSOR_OP_MATH, NHWC( with 1 channels padded to 8)?, workspace [0-9]+ bytes, measured, deterministic, bfloat16 data; [0-9.]+ ms$" <<<"$out")" -eq 5 ] \
  && [ "$(grep -cE "^cuDNN conv n=[0-9]+ 14x14x16 -> 14x14x32 .*: [A-Z_0-9]+, TENSOR_OP_MATH, NHWC, .*, bfloat16 data; [0-9.]+ ms$" <<<"$out")" -eq 3 ] \
  && [ "$(grep -cE "^cuDNN conv n=[0-9]+ 28x28x1 -> 28x28x16 .*: [A-Z_0-9]+, TENSOR_OP_MATH, NHWC with 1 channels padded to 8, .*, bfloat16 data; [0-9.]+ ms$" <<<"$out")" -eq 2 ] \
  && ok "--profile names bf16 arithmetic and each convolution's bfloat16 algorithm and math (tensor-op everywhere, a first layer's channel padded to 8)" \
  || bad "--precision bf16 profile: $(grep -E "^(GPU|cuDNN)" <<<"$out")"
MGT_EMU_STATS="$T/stats_bf8" emu 1 1 train --model "$SMALL" "${run[@]}" --precision bf16 \
  --synthetic-samples 3072 --max-steps 8 --out "$T/bf8" >/dev/null 2>&1
MGT_EMU_STATS="$T/stats_bf4" emu 1 1 train --model "$SMALL" "${run[@]}" --precision bf16 \
  --synthetic-samples 3072 --max-steps 4 --out "$T/bf4" >/dev/null 2>&1
a=$(cat "$T/stats_bf4" 2>/dev/null); b=$(cat "$T/stats_bf8" 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] \
  && ok "--precision bf16: no allocation inside the step loop ($a, for 4 and for 8 steps)" \
  || bad "--precision bf16: allocations differ between 4 and 8 steps: '$a' / '$b'"
expect_fail "out of GPU memory names the sizes and a smaller batch" \
  "cudaMalloc of [0-9.]+ MiB for .* failed: [0-9.]+ MiB free of 64.0 MiB on this GPU; a smaller per-GPU batch" \
  env MGT_EMU_MEM_MB=64 bash -c "$(declare -f emu); emu 1 1 train --model $MGT_SRC/examples/convnet.cfg --data synthetic --batch-size 512 --max-steps 2 --out $T/oom"

# 7. Placement errors, before any work.
expect_fail "more ranks than GPUs" \
  "rank [01] on node .*: 2 ranks on this node but only 1 GPUs are visible \(CUDA_VISIBLE_DEVICES=unset\); start fewer ranks or list more GPUs" \
  emu 1 2 train "${run[@]}" --out "$T/p1"
expect_fail "a --gpus id that does not exist" "--gpus 0,7: device 7 does not exist on .*: 2 GPUs" \
  emu 2 2 train "${run[@]}" --gpus 0,7 --out "$T/p2"
expect_fail "more ranks than --gpus ids" "3 ranks on this node but only 2 GPUs are listed in --gpus" \
  emu 4 3 train "${run[@]}" --gpus 3,1 --out "$T/p3"
out=$(emu 4 2 train --model "$SMALL" "${run[@]}" --gpus 3,1 --max-steps 2 --out "$T/p4" 2>&1)
grep -q "rank 0: .*GPU 3: Emulated GPU 3" <<<"$out" && grep -q "rank 1: .*GPU 1: Emulated GPU 1" <<<"$out" \
  && ok "--gpus 3,1 maps local rank i to the i-th listed GPU" \
  || bad "--gpus 3,1: $(grep -i gpu <<<"$out" | head -4)"
out=$(CUDA_VISIBLE_DEVICES=2 emu 4 1 train --model "$SMALL" "${run[@]}" --max-steps 2 \
      --out "$T/p5" 2>&1)
grep -q "GPU 0: Emulated GPU 2, PCI 00000000:1A:00.0" <<<"$out" \
  && ok "CUDA_VISIBLE_DEVICES is honoured (visible GPU 0 is the machine's GPU 2)" \
  || bad "CUDA_VISIBLE_DEVICES=2: $(grep -i gpu <<<"$out" | head -3)"
expect_fail "--transport nccl with --device cpu" "--transport nccl needs the GPU backend" \
  "$MGT_BIN" train "${run[@]}" --device cpu --transport nccl --out "$T/p6"

# 8. Faults with NCCL: a rank that dies, and a rank that stops (its peer's next host wait times
#    out, aborts the communicator and ends the job).
t0=$(date +%s)
MGT_FAULT=1:3:exit emu 2 2 train "${run[@]}" --max-steps 50 --out "$T/f1" >f1.log 2>&1; rc=$?
t1=$(date +%s)
[ $rc -ne 0 ] && [ $((t1 - t0)) -lt 60 ] \
  && ok "a rank that exits at step 3 ends the job (exit $rc, $((t1 - t0)) s)" \
  || { bad "a dead rank: exit $rc after $((t1 - t0)) s"; tail -5 f1.log; }
t0=$(date +%s)
MGT_FAULT=1:3:sleep emu 2 2 train "${run[@]}" --max-steps 50 --comm-timeout 4 --out "$T/f2" \
  >f2.log 2>&1; rc=$?
t1=$(date +%s)
[ $rc -ne 0 ] && [ $((t1 - t0)) -lt 60 ] && grep -q "did not complete within 4 s" f2.log \
  && ok "a rank that stops at step 3: the job ends after the 4 s timeout ($((t1 - t0)) s)" \
  || { bad "a stopped rank: exit $rc after $((t1 - t0)) s"; tail -5 f2.log; }
grep -q "NCCL all-reduce of [0-9]* floats did not complete" f2.log \
  && ok "... and the NCCL transport's watch names the all-reduce" \
  || bad "no NCCL timeout message: $(grep -i 'rank' f2.log | head -3)"
MGT_FAULT=0:2:nan emu 1 1 train "${run[@]}" --out "$T/f3" >f3.log 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "the loss became NaN at step" f3.log \
  && ok "a NaN loss on the GPU stops with the step named" \
  || { bad "NaN on the GPU: exit $rc"; tail -3 f3.log; }

# 9. Two ranks on ONE GPU through NCCL, which NCCL's user guide calls unsupported: refused as a
#    duplicate GPU unless each rank names a different host through NCCL_HOSTID (undocumented; in
#    NCCL 2.28, which the emulator follows, it replaces the host hash); the transport test then
#    sums across ranks. NCCL 2.30's documented route is NCCL_MULTI_RANK_GPU_ENABLE=1.
expect_fail "two ranks on one GPU without NCCL_HOSTID" "Duplicate GPU|two ranks on one GPU" \
  env MGT_EMU_GPUS=1 timeout 300 mpirun --oversubscribe -x MGT_EMU_GPUS -np 2 "$MGT_NCCL_TEST"
out=$(MGT_EMU_GPUS=1 timeout 300 mpirun --oversubscribe -x MGT_EMU_GPUS -np 2 \
      bash -c 'NCCL_HOSTID=host$OMPI_COMM_WORLD_RANK exec "$0"' "$MGT_NCCL_TEST" 2>&1)
rc=$?
[ $rc -eq 0 ] && grep -q "checks passed" <<<"$out" \
  && ok "two ranks on one GPU with distinct NCCL_HOSTID: all-reduces sum across ranks" \
  || bad "two ranks on one GPU with NCCL_HOSTID (exit $rc): $(tail -5 <<<"$out")"
# A tensor freed while an all-reduce waits for a peer that stopped: cudaFree would wait for the
# collective forever; the backend drains every stream by polled waits first, so NCCL's timeout
# (3 s) ends the job, naming it.
t0=$SECONDS
out=$(MGT_EMU_GPUS=1 timeout 120 mpirun --oversubscribe -x MGT_EMU_GPUS -np 2 \
      bash -c 'NCCL_HOSTID=host$OMPI_COMM_WORLD_RANK exec "$0" "$@"' "$MGT_NCCL_TEST" \
      --free-behind-a-stopped-peer 2>&1)
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $((SECONDS - t0)) -lt 60 ] \
  && grep -q "NCCL all-reduce of 1000 floats did not complete within 3 s" <<<"$out" \
  && ok "a free behind a collective whose peer stopped: the job ends in $((SECONDS - t0)) s with NCCL's timeout" \
  || bad "a free behind a stopped peer (exit $rc after $((SECONDS - t0)) s): $(tail -3 <<<"$out")"
finish
