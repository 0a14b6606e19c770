#!/usr/bin/env bash
# Data-parallel training with several ranks sharing one GPU (--share-gpu, a route for tests:
# NCCL 2.30's NCCL_MULTI_RANK_GPU_ENABLE, or a host id per rank before it). The same script runs
# on emulated GPUs in CI (tests/gpu/emu: MGT_BIN = mgtrain_emu, small models) and on a real GPU
# (tests/gpu/on-device: the seed ConvNet and examples/resnet_small.cfg).
#
#   share_gpu.sh SECTION...      route, pipeline, compare, repro, refuse, kill (default: all)
#
#   route     2 ranks of the built-in MLP: the start-up notice names the route this NCCL takes
#             (NCCL_MULTI_RANK_GPU_ENABLE=1 from 2.30, else NCCL_HOSTID and sockets over lo)
#   pipeline  2 and 3 ranks of each model in MGT_SHARE_MODELS, with gradient buckets reduced
#             while backward runs, 2 micro-batches per step and ZeRO-1: the start-up block shows
#             the ranks on the one GPU over NCCL with that pipeline, --debug-check 1 compares
#             the ranks' weights after every step (the run fails if they differ), every step's
#             loss is finite
#   compare   tests/cli/smooth.cfg (tanh, average pooling: no gate flips on rounding) with
#             RMSprop, 8 steps on 1, 2 and 3 ranks with the same pipeline: the weights within 1e-5
#             (the per-step agreement of the gradient sums, 2 u sqrt(K) <= 1.3e-5 for K = 96 x
#             26 x 26 addends, scaled by RMSprop's bounded step of about lr = 1e-3, over 8 steps,
#             as tests/gpu/emu/emu_cli.sh argues for 1 against 2 GPUs)
#   repro     --reproducible: MGT_SHARE_REPRO_MODEL (its BatchNorm synchronised, as the mode
#             needs) on 1, 2 and 3 ranks gives the same bytes; a run stopped on 2 ranks and
#             resumed on 3 gives the uninterrupted run's bytes
#   refuse    2 ranks on one GPU without --share-gpu are refused naming it; an NCCL start-up
#             error (the route undone: one NCCL_HOSTID for all, NCCL_MULTI_RANK_GPU_ENABLE=0)
#             is reported in one line naming the rank, and the job ends
#   kill      a rank killed with SIGKILL while the job trains ends every rank within
#             --comm-timeout, and the output names that rank
#
# Environment: MGT_BIN, MGT_SRC, MGT_COMPARE (as tests/cli/lib.bash wants); MGT_SHARE_MODELS
# (default examples/convnet.cfg examples/resnet_small.cfg), MGT_SHARE_REPRO_MODEL (default
# examples/convnet.cfg), MGT_SHARE_STEPS (optimizer steps of the pipeline runs, default 20),
# MGT_SHARE_BUCKET_MB (default 1), MGT_SHARE_SAMPLES (synthetic samples, default 4096),
# MGT_SHARE_BATCH (global batch, default 128), MGT_SHARE_COMM_TIMEOUT (default 20 s),
# MGT_SHARE_ARGS (more arguments for every training run: --algo-cache FILE on a real GPU).
source "$MGT_SRC/tests/cli/lib.bash"
# shellcheck disable=SC2206 # a list of paths, split on blanks
MODELS=(${MGT_SHARE_MODELS:-$MGT_SRC/examples/convnet.cfg $MGT_SRC/examples/resnet_small.cfg})
REPRO_MODEL=${MGT_SHARE_REPRO_MODEL:-$MGT_SRC/examples/convnet.cfg}
STEPS=${MGT_SHARE_STEPS:-20}
BUCKET=${MGT_SHARE_BUCKET_MB:-1}
SAMPLES=${MGT_SHARE_SAMPLES:-4096}
BATCH=${MGT_SHARE_BATCH:-128}
CT=${MGT_SHARE_COMM_TIMEOUT:-20}
SECTIONS=("$@")
[ ${#SECTIONS[@]} -gt 0 ] || SECTIONS=(route pipeline compare repro refuse kill)
export OPENBLAS_NUM_THREADS=1 # ranks share this machine's cores

share() { # share NP ARGS...: mgtrain train on NP ranks of this machine, on the GPU
  local np=$1
  shift
  # shellcheck disable=SC2086 # MGT_SHARE_ARGS: arguments, split on blanks
  timeout 600 mpirun --oversubscribe --bind-to none -np "$np" "$MGT_BIN" train --device gpu \
    ${MGT_SHARE_ARGS:-} "$@"
}
hash_of() { sha256sum "$1" 2>/dev/null | cut -c1-16; }
# sync_bn CFG OUT: CFG with every BatchNorm layer synchronised (--reproducible needs it)
sync_bn() { sed -e '/^sync *=/d' -e 's/^\[batchnorm\]$/[batchnorm]\nsync = true/' "$1" >"$2"; }
# The pipeline under test: buckets reduced while backward runs, 2 micro-batches, ZeRO-1.
PIPE=(--bucket-mb "$BUCKET" --accum-steps 2 --zero 1)
# pipeline_ok NAME NP OUT LOG: what every pipeline run must show
pipeline_ok() {
  local name=$1 np=$2 out=$3 log=$4 k nonfinite
  grep -q "world: $np ranks on 1 node, up to $np per node; backend gpu, transport nccl" "$log" \
    && [ "$(grep -cE "^  rank [0-9]+: .*, GPU [0-9]+: " "$log")" -eq "$np" ] \
    && [ "$(grep -oE "^  rank [0-9]+: .*, GPU [0-9]+: " "$log" | grep -oE "GPU [0-9]+" | sort -u | wc -l)" -lt "$np" ] \
    && grep -q "^notice: --share-gpu (for tests): ranks share GPUs, up to $np on one; NCCL " "$log" \
    && ok "$name on $np ranks: the ranks share the GPU over NCCL" \
    || bad "$name on $np ranks: start-up block: $(grep -E '^(notice|  world|  rank)' "$log" | head -5)"
  k=$(sed -n 's/^  step: \([0-9]*\) gradient buckets .* reduced to their owners while backward runs; 2 micro-batches of .*(ZeRO-1: .*/\1/p' "$log")
  [ -n "$k" ] && [ "$k" -ge 2 ] \
    && ok "$name on $np ranks: $k gradient buckets reduced while backward runs, 2 micro-batches a step, ZeRO-1" \
    || bad "$name on $np ranks: the step line: $(grep '^  step:' "$log")"
  nonfinite=$(python3 -c 'import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
bad = [r["step"] for r in rows if not math.isfinite(r["loss"])]
print(len(rows), bad[0] if bad else "")' "$out/metrics_steps.jsonl" 2>&1)
  grep -q "^Trained $STEPS steps" "$log" && [ "$nonfinite" = "$STEPS " ] \
    && ok "$name on $np ranks: $STEPS steps, every loss finite, the ranks' weights equal after every step (--debug-check 1)" \
    || bad "$name on $np ranks: $(grep -E '^(Trained|rank|mgtrain|NCCL)' "$log" | head -3); steps/loss: $nonfinite"
}

section_pipeline() {
  local m name np
  for m in "${MODELS[@]}"; do
    name=$(basename "$m" .cfg)
    for np in 2 3; do
      share "$np" --share-gpu --model "$m" --data synthetic --synthetic-samples "$SAMPLES" \
        --batch-size "$BATCH" --max-steps "$STEPS" "${PIPE[@]}" --debug-check 1 --log-every 1 \
        --verbose 2 --no-validation --out "$T/p-$name-$np" >"$T/p-$name-$np.log" 2>&1
      pipeline_ok "$name" "$np" "$T/p-$name-$np" "$T/p-$name-$np.log"
    done
  done
}

section_compare() {
  sed -e 's/^optimizer = sgd/optimizer = rmsprop/' -e 's/^learning_rate = .*/learning_rate = 0.001/' \
    "$MGT_SRC/tests/cli/smooth.cfg" >"$T/smooth.cfg"
  local run=(--model "$T/smooth.cfg" --data synthetic --synthetic-samples 768 --batch-size 96
    --max-steps 8 "${PIPE[@]}" --bucket-mb 0.01 --verbose 2 --no-validation) np
  share 1 "${run[@]}" --out "$T/c1" >"$T/c1.log" 2>&1 || bad "smooth on 1 rank: $(tail -3 "$T/c1.log")"
  for np in 2 3; do
    share "$np" --share-gpu "${run[@]}" --out "$T/c$np" >"$T/c$np.log" 2>&1 \
      || { bad "smooth on $np ranks: $(tail -3 "$T/c$np.log")"; continue; }
    same "smooth, 8 RMSprop steps with buckets, 2 micro-batches and ZeRO-1: $np ranks on one GPU against 1" \
      "$T/c$np/weights.safetensors" "$T/c1/weights.safetensors" 1e-5
  done
}

section_route() {
  local notice
  share 2 --share-gpu "${FAULT_RUN[@]}" --max-steps 2 --out "$T/route" >"$T/route.log" 2>&1 \
    || bad "the built-in MLP on 2 ranks: $(tail -3 "$T/route.log")"
  notice=$(grep -m1 '^notice: --share-gpu' "$T/route.log")
  if grep -qE "NCCL 2\.(2[0-9]|1[0-9])\.[0-9]+, before 2\.30's NCCL_MULTI_RANK_GPU_ENABLE: a host id per rank \(NCCL_HOSTID\), sockets over lo$|NCCL (2\.[3-9][0-9]|[3-9])\.[0-9.]+: NCCL_MULTI_RANK_GPU_ENABLE=1$" <<<"$notice"; then
    ok "the route for this NCCL: ${notice#*; }"
  else
    bad "the route: '$notice'"
  fi
}

section_repro() {
  sync_bn "$REPRO_MODEL" "$T/repro.cfg"
  local run=(--model "$T/repro.cfg" --data synthetic --synthetic-samples "$SAMPLES"
    --batch-size "$BATCH" --bucket-mb "$BUCKET" --accum-steps 2 --verbose 2 --no-validation
    --reproducible) np h h1=""
  for np in 1 2 3; do
    share "$np" --share-gpu "${run[@]}" --max-steps "$STEPS" --out "$T/r$np" >"$T/r$np.log" 2>&1 \
      || { bad "--reproducible on $np ranks: $(tail -3 "$T/r$np.log")"; continue; }
    h=$(hash_of "$T/r$np/weights.safetensors")
    if [ "$np" = 1 ]; then
      h1=$h
      grep -q "reproducible on any rank count" "$T/r1.log" && ok "--reproducible on the GPU backend ($h)" \
        || bad "the start-up block does not say --reproducible: $(grep '  batch' "$T/r1.log")"
    else
      [ -n "$h1" ] && [ "$h" = "$h1" ] \
        && ok "$(basename "$REPRO_MODEL" .cfg), --reproducible, $STEPS steps: $np ranks on one GPU = 1 rank, byte for byte ($h)" \
        || bad "--reproducible: $np ranks $h, 1 rank $h1"
    fi
  done
  share 2 --share-gpu "${run[@]}" --max-steps $((STEPS / 2)) --out "$T/rs" >"$T/rs1.log" 2>&1 \
    || bad "the first half on 2 ranks: $(tail -3 "$T/rs1.log")"
  share 3 --share-gpu "${run[@]}" --max-steps "$STEPS" --resume --out "$T/rs" >"$T/rs2.log" 2>&1 \
    || bad "resumed on 3 ranks: $(tail -3 "$T/rs2.log")"
  h=$(hash_of "$T/rs/weights.safetensors")
  [ -n "$h1" ] && [ "$h" = "$h1" ] \
    && ok "stopped after $((STEPS / 2)) steps on 2 ranks, resumed on 3 to step $STEPS: the uninterrupted run's bytes ($h)" \
    || bad "stopped and resumed: $h, uninterrupted $h1"
}

# The built-in MLP, for the faults
FAULT_RUN=(--data synthetic --synthetic-samples "$SAMPLES" --batch-size "$BATCH" --verbose 2
  --no-validation --comm-timeout "$CT")

section_refuse() {
  local run=("${FAULT_RUN[@]}") out rc t0 dt lines
  # Without --share-gpu: refused (one GPU visible).
  expect_fail "2 ranks on one GPU without --share-gpu are refused, naming it" \
    "2 ranks on this node but only 1 GPUs are visible .*\(tests may share GPUs: --share-gpu\)" \
    env CUDA_VISIBLE_DEVICES=0 bash -c "$(declare -f share); share 2 \"\$@\"" _ "${run[@]}" \
    --max-steps 2 --out "$T/f0"
  # The route undone: NCCL sees two ranks on one GPU of one host and refuses.
  t0=$SECONDS
  out=$(env -u NCCL_DEBUG NCCL_HOSTID=mgt-one-host NCCL_MULTI_RANK_GPU_ENABLE=0 \
    bash -c "$(declare -f share); share 2 \"\$@\"" _ --share-gpu "${run[@]}" --max-steps 2 \
    --out "$T/f1" 2>&1)
  rc=$? dt=$((SECONDS - t0))
  lines=$(grep -E "^(mgtrain|rank [0-9]+): " <<<"$out")
  if [ $rc -ne 0 ] && [ "$dt" -le $((CT + 30)) ] && [ "$(wc -l <<<"$lines")" -eq 1 ] &&
    grep -qE "^mgtrain: NCCL start-up failed on rank [01] of 2( \(and on 1 more\))?: ncclCommInitRankConfig on GPU [0-9]+: invalid usage" <<<"$lines"; then
    ok "an NCCL start-up error: one line, the job ended in $dt s: $(cut -c1-160 <<<"$lines")"
  else
    bad "an NCCL start-up error (exit $rc, $dt s): $lines"
    tail -20 <<<"$out"
  fi
}

section_kill() {
  local run=("${FAULT_RUN[@]}") rc t0 dt tok="mgt-share-$$-$RANDOM" pid="" i
  MGT_SHARE_RUN=$tok share 2 --share-gpu "${run[@]}" --epochs 1000000 --max-steps 1000000 --log-every 1 \
    --out "$T/f2" >"$T/f2.log" 2>&1 &
  local job=$!
  for ((i = 0; i < 600; i++)); do # up to 300 s for 3 steps (emulated GPUs are slow)
    [ "$(wc -l 2>/dev/null <"$T/f2/metrics_steps.jsonl" || echo 0)" -ge 3 ] && break
    kill -0 $job 2>/dev/null || break
    sleep 0.5
  done
  pid=$(grep -lz "^MGT_SHARE_RUN=$tok$" /proc/[0-9]*/environ 2>/dev/null | while read -r e; do
    grep -qz "^OMPI_COMM_WORLD_RANK=1$" "$e" && basename "$(dirname "$e")"
  done | head -n1)
  if [ -z "$pid" ]; then
    bad "no rank 1 to kill: $(tail -5 "$T/f2.log")"
    kill $job 2>/dev/null
  else
    t0=$SECONDS
    kill -KILL "$pid"
    wait $job
    rc=$? dt=$((SECONDS - t0))
    local left
    left=$(grep -lz "^MGT_SHARE_RUN=$tok$" /proc/[0-9]*/environ 2>/dev/null | wc -l)
    [ $rc -ne 0 ] && [ "$dt" -le "$CT" ] && [ "$left" -eq 0 ] \
      && ok "rank 1 killed after $(wc -l <"$T/f2/metrics_steps.jsonl") steps: every rank ended $dt s later (--comm-timeout $CT)" \
      || bad "rank 1 killed: exit $rc after $dt s, $left processes left: $(tail -5 "$T/f2.log")"
    grep -qE "process rank 1 .*(exited on signal 9|Killed)|rank 1: .*(died|killed|signal)" "$T/f2.log" \
      && ok "... and the output names rank 1: $(grep -m1 -E "rank 1 " "$T/f2.log")" \
      || bad "the output does not name rank 1: $(tail -8 "$T/f2.log")"
  fi
}

# A GPU, or nothing: one step on one rank with the flags the sections use (mgtrain checks them
# before it looks for a GPU), which on a machine without one ends the script as SKIPPED
# (on-device's dry run).
probe=$("$MGT_BIN" train --device gpu --share-gpu --model "${MODELS[0]}" --data synthetic \
  --synthetic-samples 64 --batch-size 32 --max-steps 1 "${PIPE[@]}" --debug-check 1 \
  --log-every 1 --comm-timeout "$CT" --verbose 2 --no-validation --out "$T/probe" 2>&1)
if grep -q "no usable GPU" <<<"$probe"; then
  echo "SKIPPED: no usable GPU ($(grep -m1 "no usable GPU" <<<"$probe"))"
  exit 77
fi
for s in "${SECTIONS[@]}"; do
  case $s in
    route | pipeline | compare | repro | refuse | kill) echo "== $s" && "section_$s" ;;
    *) bad "unknown section '$s' (route, pipeline, compare, repro, refuse, kill)" ;;
  esac
done
finish
