#!/usr/bin/env bash
# A part of tests/gpu/on-device: the seed ConvNet (its BatchNorm synchronised, as --reproducible
# needs) trained twice with --reproducible on the GPU gives the same bytes: real cuDNN's
# deterministic algorithms and the exact sums' kernels. Other rank counts: share_gpu.sh's repro.
# Runs from the checkout's root with B and RUNS exported (on-device's part).
set -uo pipefail
: "${B:?run by tests/gpu/on-device}" "${RUNS:?}"
sed 's/^\[batchnorm\]/[batchnorm]\nsync = true/' examples/convnet.cfg >"$RUNS/convnet_sync_bn.cfg"
for i in 1 2; do
    mpirun -np 1 --bind-to none "$B/mgtrain" train --device gpu --profile --verbose 2 \
        --model "$RUNS/convnet_sync_bn.cfg" --batch-size 128 --data synthetic --max-steps 40 \
        --no-validation --reproducible --out "$RUNS/run$i" || exit 1
done
if cmp -s "$RUNS/run1/weights.safetensors" "$RUNS/run2/weights.safetensors"; then
    echo "ok: --reproducible twice on the GPU: the same bytes ($(sha256sum <"$RUNS/run1/weights.safetensors" | cut -c1-16))"
    status=0
else
    echo "FAIL: --reproducible twice on the GPU: the weights differ"
    status=1
fi
rm -f "$RUNS"/run*/*.safetensors # weights stay out of the tarball
exit $status
