#!/usr/bin/env bash
# labels: gpu_emu
# .npy datasets on the GPU backend, over the emulated CUDA stack (tests/gpu/emu; SKIPPED where it
# was not built), against the CPU binary:
#  - a uint8 set is kept on the device and gathered there: the peak device memory grows by exactly
#    the set's bytes over --device-data off, less the second input set that only batches copied
#    from the host need, and the weights are the same either way;
#  - a float32 set (x / 255 in float32), a set with more than 256 classes (int32 labels) and an
#    augmented run are gathered on the host: no device copy of the set (the same peak as
#    --device-data off), the same weights as the CPU's, and the augmented run on 2 GPUs gives the
#    1-rank CPU run's weights;
#  - rows of 20 values ([input] shape = F) with float targets: a multi-label binary cross-entropy
#    (5 labels, class weights) and a huber regression on 2 emulated GPUs, against the CPU, and the
#    metrics files' figures (F1, MAE) the same to 1e-4.
# Tolerances: the device gather computes (float)byte / 255 as the host does, so host and device
# gathers, and the float32 copy, give bit-identical inputs: tolerance 0 on one backend. Against
# the CPU the emulated cuBLAS/cuDNN sum in another order than OpenBLAS: per step a relative
# difference of about (terms summed) * 2^-24 ~ 4e-6 at most here (measured 1e-7 after 8 steps),
# so 1e-4 leaves a wide margin. The model is smooth (tanh): a ReLU gate within rounding of zero
# could flip between the backends, which is not rounding (tests/cli/invariance.sh).
source "$(dirname "$0")/lib.bash"
: "${MGT_BUILD:?run through ctest}"
EMU="$MGT_BUILD/tests/gpu/emu/mgtrain_emu"
[ -x "$EMU" ] || { echo "SKIPPED: no emulated GPU build (needs the CUDA toolkit)"; exit 77; }
PY=/usr/bin/python3
/usr/bin/python3 -c "import numpy" 2>/dev/null || PY=python3
"$PY" -c "import numpy" 2>/dev/null || { echo "SKIPPED: no python3 with numpy"; exit 77; }
export OPENBLAS_NUM_THREADS=1 # emulated ranks share this machine's cores

# 2048 samples of 16x16x3: 2048 * 768 + 2048 bytes = 1.5 MiB on the device.
data=(16 16 2048 128 7)
write() { "$PY" "$MGT_SRC/tests/cli/npy_data.py" "$1" "${data[@]}" "${@:2}" || bad "writing $1"; }
write u8
write f32 float32
write wide label_scale=90
cfg() { # cfg NAME UNITS [EXTRA TRAIN KEYS...]
  local name=$1 units=$2; shift 2
  { printf '%s\n' "[input]" "shape = 16,16,3" "[conv2d]" "filters = 4" "kernel = 3" "stride = 2" \
      "activation = tanh" "algo = direct" "[flatten]" "[dense]" "units = $units" "[train]" \
      "optimizer = sgd" "learning_rate = 0.05" "loss = sparse_categorical_crossentropy" \
      "batch_size = 64"; printf '%s\n' "$@"; } >"$name.cfg"
}
cfg plain 4
cfg wide 300
cfg aug 4 "augment_flip = true" "augment_crop = 3"
run=(--max-steps 8 --verbose 2 --no-validation)
emu() { # emu NP OUT ARGS...: NP ranks on NP emulated GPUs
  local np=$1 out=$2; shift 2
  MGT_EMU_GPUS=$np timeout 600 mpirun --oversubscribe --bind-to none -x MGT_EMU_GPUS -np "$np" \
    "$EMU" train "${run[@]}" --out "$out" "$@" >"$out.log" 2>&1 || { bad "$out: $(tail -3 "$out.log")"; return; }
  grep -q "backend gpu" "$out.log" || bad "$out did not run on the emulated GPU"
}
peak() { sed -n 's/^Peak GPU memory: \([0-9.]*\) MiB.*/\1/p' "$1.log"; } # rank 0's device MiB
cpu() { # cpu OUT ARGS...
  local out=$1; shift
  "$MGT_BIN" train "${run[@]}" --device cpu --out "$out" "$@" >"$out.log" 2>&1 || bad "$out: $(tail -3 "$out.log")"
}
grows() { # grows NAME A B MIB: peak A - peak B is MIB (printed to 0.1 MiB)
  "$PY" -c "import sys; a, b, d = map(float, sys.argv[1:]); sys.exit(abs(a - b - d) > 0.15)" "$2" "$3" "$4" \
    && ok "$1: $2 MiB vs $3 MiB" || bad "$1: '$2' MiB vs '$3' MiB, expected a difference of $4"
}

emu 1 g-u8 --model plain.cfg --data u8
p_dev=$(peak g-u8)
emu 1 g-u8-off --model plain.cfg --data u8 --device-data off
p_off=$(peak g-u8-off)
# the set's 1.5 MiB, less the host path's second input set: a batch of 64 inputs of 768 floats,
# labels and one-hot targets of 4 classes, 64 * (768 + 1 + 4) * 4 bytes = 0.19 MiB
grows "uint8 set kept on the device (1.31 MiB more than --device-data off)" "$p_dev" "$p_off" 1.31
same "uint8: device gather = host gather" g-u8/weights.safetensors g-u8-off/weights.safetensors 0
cpu c-u8 --model plain.cfg --data u8
same "uint8: emulated GPU against the CPU" g-u8/weights.safetensors c-u8/weights.safetensors 1e-4

# host_path NAME NP CFG DATA: gathered on the host (the peak of --device-data off), and the
# weights of the CPU backend's 1-rank run.
host_path() {
  local name=$1 np=$2 cfg=$3 data=$4
  emu "$np" "g-$name" --model "$cfg" --data "$data"
  emu "$np" "g-$name-off" --model "$cfg" --data "$data" --device-data off
  grows "$name: gathered on the host (no device copy)" "$(peak "g-$name")" "$(peak "g-$name-off")" 0
  cpu "c-$name" --model "$cfg" --data "$data"
  same "$name: $np emulated GPU(s) against 1 CPU rank" "g-$name/weights.safetensors" "c-$name/weights.safetensors" 1e-4
}

host_path float32 1 plain.cfg f32
same "float32 on the GPU = uint8 on the GPU" g-float32/weights.safetensors g-u8/weights.safetensors 0
host_path "labels above 255" 1 wide.cfg wide
host_path augmented 2 aug.cfg u8
if "$MGT_COMPARE" g-augmented/weights.safetensors g-u8/weights.safetensors 1e-3 >cmp.log; then
  bad "augmentation changed nothing on the GPU"
else ok "augmentation changes the GPU run: $(tail -1 cmp.log)"; fi
# Rows of values with float targets (the GPU's elem_loss and its counts, end to end).
"$PY" - <<'PY' || bad "writing the rows"
import numpy as np, os
r = np.random.default_rng(3)
x = r.normal(size=(600, 20)).astype(np.float32)
y = (x @ r.normal(size=(20, 5)) > 0.5).astype(np.float32)
for name, t in (("rows_ml", y), ("rows_reg", (x @ r.normal(size=(20, 5))).astype(np.float32))):
    os.makedirs(name, exist_ok=True)
    np.save(f"{name}/train_x.npy", x[:512]); np.save(f"{name}/train_y.npy", t[:512])
    np.save(f"{name}/test_x.npy", x[512:]); np.save(f"{name}/test_y.npy", t[512:])
PY
rows_cfg() { # rows_cfg NAME LOSS [TRAIN KEY]
  printf '%s\n' "[input]" "shape = 20" "[dense]" "units = 16" "activation = tanh" "[dense]" \
    "units = 5" "[train]" "optimizer = sgd" "learning_rate = 0.05" "loss = $2" "batch_size = 64" \
    ${3:+"$3"} >"$1.cfg"
}
rows_cfg rows_ml binary_crossentropy "class_weight = 1, 3"
rows_cfg rows_reg huber
for t in rows_ml rows_reg; do
  run=(--max-steps 8 --verbose 2 --epochs 1)
  emu 2 "g-$t" --model "$t.cfg" --data "$t"
  cpu "c-$t" --model "$t.cfg" --data "$t"
  same "$t: 2 emulated GPUs against 1 CPU rank" "g-$t/weights.safetensors" "c-$t/weights.safetensors" 1e-4
  "$PY" - "g-$t/metrics.jsonl" "c-$t/metrics.jsonl" <<'PY' && ok "$t: the GPU's figures are the CPU's" || bad "$t: figures differ"
import json, sys
g, c = (json.loads(open(p).readlines()[-1]) for p in sys.argv[1:])
keys = [k for k in ("loss", "f1", "precision", "recall", "mae", "rmse", "val_f1", "val_mae") if k in g]
print({k: (g[k], c[k]) for k in keys})
sys.exit(0 if len(keys) >= 4 and all(abs(g[k] - c[k]) <= 1e-4 * max(1, abs(c[k])) for k in keys) else 1)
PY
done
finish
