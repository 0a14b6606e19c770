#!/usr/bin/env bash
# A part of tests/gpu/on-device truth: ResNet-50 (224x224x3, BF16, batch 32, 20 steps) with its
# forward and backward captured into CUDA graphs and replayed (--cuda-graph on, the default),
# against the same run launched op by op (--cuda-graph off), both with the algorithms of the
# shared --algo-cache. This is where cuDNN's and cuBLAS's calls first meet a real capture: CUDA
# invalidates a capture that a library's call inside it cannot hold, mgtrain then says so once
# and goes on op by op (tests/gpu/emu/emu_speed.sh checks that on the emulator), and here that
# is a failure, with the notice as its reason: every single-GPU run would lose its graphs.
# The two runs compute the same function of the same data with the same kernels: their losses
# agree step by step, to 2% (a detector of a graph that replays stale weights or misses a
# kernel, which moves the loss by far more within a few steps of SGD; the rounding of cuDNN's
# non-deterministic reductions, where the measured algorithms have them, moves it by about a
# bfloat16 rounding, 2^-8 = 0.4%, and no more than that per step on a loss that falls slowly).
# Runs from the checkout's root with B, RUNS and ALGO_CACHE exported (on-device's part).
set -uo pipefail
: "${B:?run by tests/gpu/on-device}" "${RUNS:?}" "${ALGO_CACHE:?}"
STEPS=${MGT_GRAPHS_STEPS:-20}
run() { # run on|off
    mpirun -np 1 --bind-to none "$B/mgtrain" train --device gpu --model examples/resnet50.cfg \
        --input-shape 224,224,3 --batch-size 32 --precision bf16 --data synthetic --epochs 100 \
        --max-steps "$STEPS" --no-validation --log-every 1 --profile --verbose 2 \
        --algo-cache "$ALGO_CACHE" --cuda-graph "$1" --out "$RUNS/$1" >"$RUNS/$1.log" 2>&1
    local rc=$?
    cat "$RUNS/$1.log"
    rm -f "$RUNS/$1"/*.safetensors # weights stay out of the tarball
    return $rc
}
run on || { echo "FAIL: the run with CUDA graphs failed (its output above)"; exit 1; }
run off || { echo "FAIL: the run without CUDA graphs failed (its output above)"; exit 1; }
status=0
line=$(grep -m1 '^CUDA graphs: ' "$RUNS/on.log")
if grep -q '^CUDA graphs: forward and backward replayed' <<<"$line"; then
    echo "ok: $line"
else
    echo "FAIL: ResNet-50 ran without its graphs: ${line:-no CUDA graphs line}$(grep -m1 'could not be captured' "$RUNS/on.log" | sed 's/^/; /')"
    status=1
fi
python3 - "$RUNS/on/metrics_steps.jsonl" "$RUNS/off/metrics_steps.jsonl" "$STEPS" <<'EOF' || status=1
import json, math, sys
on, off = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
steps = int(sys.argv[3])
if len(on) != steps or len(off) != steps:
    sys.exit(print(f"FAIL: {len(on)} and {len(off)} step losses, {steps} wanted") or 1)
if not all(math.isfinite(v) for v in on + off):
    sys.exit(print("FAIL: a loss that is not finite") or 1)
worst = max(range(steps), key=lambda i: abs(on[i] - off[i]) / abs(off[i]))
d = abs(on[worst] - off[worst]) / abs(off[worst])
print(f"{'ok' if d <= 0.02 else 'FAIL'}: graphs on and off, {steps} steps: the losses agree to "
      f"{d:.2e} at worst (step {worst + 1}: {on[worst]:.6g} and {off[worst]:.6g}; bound 0.02); "
      f"{'the same bits' if on == off else 'not bit for bit'}")
sys.exit(0 if d <= 0.02 else 1)
EOF
for w in on off; do
    grep -m1 '^Profile (' -A3 "$RUNS/$w.log" | sed "s/^/graphs $w: /"
done
exit $status
