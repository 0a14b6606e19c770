#!/usr/bin/env bash
# The training regime on the GPU path (emulated GPUs, MGT_BIN = mgtrain_emu): gradient clipping by
# norm (the device reduction of cuda/gpu_clip.cu) and by value, label smoothing (the GPU xent
# kernel), a cosine schedule with warm-up and per-step rows train the same weights on one
# emulated GPU as on the CPU, and on 2 GPUs over NCCL as on 1, with the same per-step rows. And
# none of it makes the host wait for the device more often: the emulator counts the
# device-to-host copies (each a host wait), and clipping, smoothing and the schedule add none,
# while --log-every N adds the metric reads at multiples of N that were not due anyway (every
# 20 steps, and at the last).
#
# The comparisons of numbers use the smooth ConvNet of tests/cli/smooth.cfg with RMSprop, as
# emu_cli.sh does (tanh and average pooling: rounding differences between the backends' sums
# stay rounding differences, where a ReLU or max-pool gate could flip). Clipping by value and
# by norm, the smoothed targets and the rate are continuous functions of the gradient, so they
# keep it that way, and emu_cli.sh's bound holds: weights after 8 RMSprop steps (lr 1e-3) to
# 1e-5 between the GPU and the CPU and between 1 and 2 GPUs.
source "$MGT_SRC/tests/cli/lib.bash"
: "${MGT_CPU_BIN:?}"
export OPENBLAS_NUM_THREADS=1 # emulated ranks share this machine's cores
sed -e 's/^optimizer = sgd/optimizer = rmsprop/' -e 's/^learning_rate = .*/learning_rate = 0.001/' \
  -e 's/^batch_size = .*/batch_size = 96/' "$MGT_SRC/tests/cli/smooth.cfg" >"$T/smooth.cfg"
base=(--model "$T/smooth.cfg" --data synthetic --synthetic-samples 768 --max-steps 8 --verbose 2)
run=("${base[@]}" --clip-norm 0.05 --clip-value 0.005 --label-smoothing 0.1 --lr-schedule cosine
     --warmup-steps 3 --log-every 3)
emu() { # emu GPUS NP ARGS...
  local g=$1 np=$2; shift 2
  MGT_EMU_GPUS=$g timeout 600 mpirun --oversubscribe --bind-to none -x MGT_EMU_GPUS -x MGT_EMU_READS \
    -np "$np" "$MGT_BIN" "$@"
}

# 1. One emulated GPU against the CPU; 2. two over NCCL against one.
out=$(emu 1 1 train "${run[@]}" --out "$T/g1" 2>&1) || { bad "one emulated GPU"; tail -5 <<<"$out"; }
grep -q "backend gpu" <<<"$out" && ok "trains on the emulated GPU" || bad "not on the GPU: $(tail -3 <<<"$out")"
"$MGT_CPU_BIN" train "${run[@]}" --device cpu --out "$T/c1" >"$T/c1.log" 2>&1 || { bad "CPU run"; tail -5 "$T/c1.log"; }
same "clipping, smoothing, cosine: GPU against CPU" "$T/g1/weights.safetensors" "$T/c1/weights.safetensors" 1e-5
"$MGT_CPU_BIN" train "${base[@]}" --label-smoothing 0.1 --lr-schedule cosine --warmup-steps 3 --device cpu \
  --out "$T/c0" >"$T/c0.log" 2>&1 || { bad "CPU run without clipping"; tail -5 "$T/c0.log"; }
"$MGT_COMPARE" "$T/c1/weights.safetensors" "$T/c0/weights.safetensors" 1e-3 >/dev/null \
  && bad "clipping changed nothing: its limits are not active" || ok "... with clipping active (it changes the weights)"
emu 2 2 train "${run[@]}" --out "$T/g2" >"$T/g2.log" 2>&1 || { bad "two emulated GPUs"; tail -5 "$T/g2.log"; }
same "2 GPUs (NCCL) against 1" "$T/g2/weights.safetensors" "$T/g1/weights.safetensors" 1e-5
rows() { cut -d, -f1,5 "$1/metrics_steps.csv" | tr '\n' ' '; } # steps and rates
[ "$(rows "$T/g1")" = "$(rows "$T/c1")" ] && [ "$(rows "$T/g2")" = "$(rows "$T/g1")" ] \
  && ok "the same step rows and rates on the GPU, 2 GPUs and the CPU: $(rows "$T/g1")" \
  || bad "step rows: GPU '$(rows "$T/g1")', CPU '$(rows "$T/c1")', 2 GPUs '$(rows "$T/g2")'"
# The per-step losses: smooth functions of weights that agree to 1e-5 and of logits whose sums
# round differently (2 u sqrt(K) < 1e-5 for these layers' K): ten times that, 1e-4.
if python3 - "$T/g1" "$T/c1" <<'PY'; then
import csv, sys
g, c = (list(csv.DictReader(open(d + "/metrics_steps.csv"))) for d in sys.argv[1:3])
assert all(abs(float(a["loss"]) - float(b["loss"])) <= 1e-4 * float(b["loss"]) for a, b in zip(g, c, strict=True))
PY
  ok "the per-step losses agree (1e-4)"
else bad "per-step losses differ between GPU and CPU"; fi

# 3. Host reads: 40 steps inside one 50-step epoch, no validation, the MLP.
mlp=(--data synthetic --synthetic-samples 4800 --batch-size 96 --max-steps 40 --verbose 0 --no-validation)
reads() { # reads NAME ARGS...: the device-to-host copies of a run
  rm -f "$T/$1.reads"
  MGT_EMU_READS="$T/$1.reads" emu 1 1 train "${mlp[@]}" --out "$T/$1" "${@:2}" >"$T/$1.log" 2>&1 \
    || { bad "$1 run"; tail -3 "$T/$1.log"; }
  sed -n 's/^D2H //p' "$T/$1.reads"
}
a=$(reads plain)
b=$(reads regime --clip-norm 0.5 --clip-value 0.05 --label-smoothing 0.1 --lr-schedule cosine --warmup-steps 5)
c=$(reads every10 --log-every 10)
d=$(reads every1 --log-every 1)
[ -n "$a" ] && [ "$b" = "$a" ] && ok "clipping, smoothing and a schedule add no host read ($a reads in 40 steps)" \
  || bad "host reads: $a without, $b with clipping, smoothing and a schedule"
[ -n "$a" ] && [ "$c" = $((a + 2)) ] && [ "$d" = $((a + 38)) ] \
  && ok "--log-every 10 adds the reads at steps 10 and 30 ($c), --log-every 1 one a step beyond 20 and 40 ($d)" \
  || bad "host reads with --log-every: $c (10) and $d (1), $a without"
finish
