#!/usr/bin/env bash
# A part of tests/gpu/on-device: how much of a ResNet-50 step on the GPU waits for an image set
# on local disk (the bar: at most 5%). An image set in mgtrain convert's stored layout (256x256,
# 10 classes told apart by colour, about 2 GB: bench/data_larger_than_memory's writer) is
# trained with the training transform (random-resized crop to 224, flip, normalisation) by the
# loader's threads, BF16, batch 256; --profile's data phase (the host's wait for a batch plus
# its copy to the GPU) against the step. Prints the figures and "ok"/"FAIL" against the bar.
# Its 10000 images leave a short last batch at step 40 (16 images), which takes the algorithms
# measured at 256 (nothing measured again mid-run); the set stays in the page cache it was
# written through (128 GB of memory), so the bar measures the loader, not the disk.
# Runs from the checkout's root with B, RUNS and ALGO_CACHE exported (on-device's part).
set -uo pipefail
: "${B:?run by tests/gpu/on-device}" "${RUNS:?}"
IMAGES=${MGT_WAIT_IMAGES:-10000} STEPS=${MGT_WAIT_STEPS:-60} BATCH=${MGT_WAIT_BATCH:-256}
# A GPU first (one step of the built-in MLP), before gigabytes are written for nothing.
mpirun -np 1 --bind-to none "$B/mgtrain" train --device gpu --data synthetic \
    --synthetic-samples 256 --max-steps 1 --verbose 0 --out "$RUNS/probe" || exit 1
python3 - "$RUNS/set" "$IMAGES" <<'EOF' || exit 1
import importlib.machinery, sys, time
from pathlib import Path
dltm = importlib.machinery.SourceFileLoader("dltm", "bench/data_larger_than_memory").load_module()
t = time.monotonic()
n, nbytes, shards = dltm.write_set(Path(sys.argv[1]), int(sys.argv[2]) * 256 * 256 * 3, 256, 7, 512)
print(f"image set: {n} images, {nbytes / 2**30:.2f} GiB in {shards} shards, written in "
      f"{time.monotonic() - t:.0f} s")
EOF
mpirun -np 1 --bind-to none "$B/mgtrain" train --device gpu --model examples/resnet50.cfg \
    --data "$RUNS/set" --batch-size "$BATCH" --precision bf16 --max-steps "$STEPS" --epochs 10 \
    --no-validation --profile --verbose 2 --algo-cache "${ALGO_CACHE:-$RUNS/algos.txt}" \
    --out "$RUNS/run" >"$RUNS/run.log" 2>&1
rc=$?
cat "$RUNS/run.log"
rm -rf "$RUNS/set" "$RUNS"/run/*.safetensors # neither goes into the tarball
[ $rc -eq 0 ] || { echo "FAIL: mgtrain exited $rc"; exit 1; }
# The profile's table: a header naming the phases, then rank 0's "mean / p95" pairs and the step.
awk '/^Profile \(/ { getline; getline; print; exit }' "$RUNS/run.log" |
    awk -v bar=5 '{ seen = 1; data = $2; step = $(NF - 1); share = step > 0 ? 100 * data / step : 100
        printf "%s: data wait %.3f ms of a %.3f ms step (%.1f%%; bar %d%%)\n",
               share <= bar ? "ok" : "FAIL", data, step, share, bar
        exit share <= bar ? 0 : 1 }
        END { if (!seen) { print "FAIL: no --profile table in the run'"'"'s output"; exit 1 } }'
