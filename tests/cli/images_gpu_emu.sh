#!/usr/bin/env bash
# labels: gpu_emu
# Image sets on the GPU backend, over the emulated CUDA stack (tests/gpu/emu; SKIPPED where it
# was not built), against the CPU binary: random-resized crops, flips and normalisation are made
# on the host, into the loader's pinned buffers, and copied to the device on the copy queue; 2
# emulated GPUs train the weights of 1 CPU rank, and report the same top-5 accuracy.
# Tolerances (as npy_gpu_emu.sh): the inputs are the same bytes; the emulated cuBLAS/cuDNN sum in
# another order than OpenBLAS, about (terms summed) * 2^-24 ~ 4e-6 relative per step at most, so
# 1e-4 on the weights after 6 smooth (tanh) steps leaves a wide margin. The top-5 counts agree
# unless two probabilities are within rounding of each other at the 5th place: at most one sample
# of an epoch may differ (1/64 of the 64 training samples, 0.025 of the 40 test samples).
source "$(dirname "$0")/lib.bash"
: "${MGT_BUILD:?run through ctest}"
EMU="$MGT_BUILD/tests/gpu/emu/mgtrain_emu"
[ -x "$EMU" ] || { echo "SKIPPED: no emulated GPU build (needs the CUDA toolkit)"; exit 77; }
PY=/usr/bin/python3
"$PY" -c "import numpy, PIL" 2>/dev/null || PY=python3
"$PY" -c "import numpy, PIL" 2>/dev/null \
  || { echo "SKIPPED: no python3 with numpy and Pillow (tests/run installs python3-pil)"; exit 77; }
export OPENBLAS_NUM_THREADS=1 # emulated ranks share this machine's cores

"$PY" "$MGT_SRC/tests/cli/images_data.py" tree train 8 8 3 || bad "writing the training tree"
"$PY" "$MGT_SRC/tests/cli/images_data.py" tree test 8 5 4 || bad "writing the test tree"
"$MGT_BIN" convert train set --size 40 --verbose 0 >/dev/null 2>&1 || bad "convert train"
"$MGT_BIN" convert test set --size 40 --split test --verbose 0 >/dev/null 2>&1 || bad "convert test"
printf '%s\n' "[input]" "shape = 32,32,3" "mean = 0.485, 0.456, 0.406" "std = 0.229, 0.224, 0.225" \
  "[conv2d]" "filters = 6" "kernel = 3" "stride = 2" "activation = tanh" "algo = direct" \
  "[global_avgpool]" "[dense]" "units = 8" "[train]" "optimizer = sgd" "learning_rate = 0.1" \
  "loss = sparse_categorical_crossentropy" "batch_size = 32" "epochs = 3" \
  "augment_resized_crop = true" "augment_flip = true" >img.cfg
run=(--model img.cfg --data set --max-steps 6 --verbose 2 --no-tensorboard)
MGT_EMU_GPUS=2 timeout 600 mpirun --oversubscribe --bind-to none -x MGT_EMU_GPUS -np 2 \
  "$EMU" train "${run[@]}" --out gpu >gpu.log 2>&1 || { bad "2 emulated GPUs: $(tail -3 gpu.log)"; }
grep -q "backend gpu" gpu.log && ok "ran on the emulated GPUs" || bad "not on the emulated GPU: $(grep backend gpu.log)"
"$MGT_BIN" train "${run[@]}" --device cpu --out cpu >cpu.log 2>&1 || bad "CPU run: $(tail -3 cpu.log)"
same "image set, 2 emulated GPUs against 1 CPU rank" gpu/weights.safetensors cpu/weights.safetensors 1e-4
"$PY" - <<'PY' && ok "top-5 from the GPU kernel: $(grep -o 'test top5_acc: [0-9.]*' gpu.log), CPU $(grep -o 'test top5_acc: [0-9.]*' cpu.log)" || bad "top-5 differs between the backends"
import json
g = [json.loads(l) for l in open("gpu/metrics.jsonl")]
c = [json.loads(l) for l in open("cpu/metrics.jsonl")]
assert len(g) == len(c) == 3, (g, c)
for a, b in zip(g, c):
    assert abs(a["val_top5_acc"] - b["val_top5_acc"]) <= 0.025 + 1e-12, (a, b)
    assert abs(a["top5_acc"] - b["top5_acc"]) <= 1.0 / 64 + 1e-12, (a, b)
PY
finish
