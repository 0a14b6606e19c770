#!/usr/bin/env bash
# A part of tests/gpu/on-device: the GPU backend's memory-bound kernels one by one
# (bench/mgt_gpu_kernels: the depthwise convolution beside cuDNN's grouped one, batchnorm alone
# and in its fusion groups) on ResNet-50's and Xception's shapes at batch 32, with float32 and
# then bfloat16 activations: each checked against the CPU, then timed, with its GB/s and its
# fraction of a device-to-device copy's rate and of HBM's, to set beside the kernel table of
# bench/results/gpu-fusion-predictions.md. Without a GPU the program's SKIPPED line ends it
# (exit 77). Runs from the checkout's root with B exported (on-device's part).
set -uo pipefail
: "${B:?run by tests/gpu/on-device}"
status=0
for act in fp32 bf16; do
    args=(--batch 32)
    [ "$act" = bf16 ] && args+=(--bf16)
    echo "== $act activations: bench/mgt_gpu_kernels ${args[*]}"
    "$B/bench/mgt_gpu_kernels" "${args[@]}"
    rc=$?
    [ $rc -eq 77 ] && exit 77
    [ $rc -ne 0 ] && status=1
done
exit $status
