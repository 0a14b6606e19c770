#!/usr/bin/env bash
# labels: mpi
# timeout: 600
# cores: 1
# What a user coming from other tools runs into: torchrun's WORLD_SIZE/RANK without MPI (a
# warning naming the launcher), --device gpu on a machine without NVIDIA's driver (said so),
# --precision bf16 on the CPU backend (refused),
# weights that overflow (eval and predict refuse a non-finite result instead of printing it), and
# --transport shm with too little room in /dev/shm (as in a container's default 64 MB).
source "$(dirname "$0")/lib.bash"
N="--data synthetic --synthetic-samples 2000 --verbose 0"

# 1. torchrun's variables: the processes are a world of one each; the warning says what to use.
out=$(WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 "$MGT_BIN" $N --max-steps 1 --out torchrun 2>&1)
rc=$?
[ $rc -eq 0 ] && ok "WORLD_SIZE=2 RANK=1 without MPI: trains (exit 0)" || { bad "exit $rc"; echo "$out"; }
grep -q "warning: WORLD_SIZE=2 RANK=1 is set (as torchrun sets it), but mgtrain takes its ranks from MPI.*start the 2 ranks with mpirun -np 2 mgtrain" <<<"$out" &&
  ok "... with a warning naming mpirun" || { bad "no warning"; echo "$out"; }
out=$(WORLD_SIZE=2 RANK=0 mpirun --oversubscribe -np 2 -x WORLD_SIZE -x RANK "$MGT_BIN" $N --max-steps 1 --out under_mpi 2>&1)
grep -q "warning: WORLD_SIZE" <<<"$out" && { bad "a warning under mpirun"; echo "$out"; } || ok "no warning under mpirun"

# 2. --device gpu without NVIDIA's driver: the message says what is missing.
if [ -e /proc/driver/nvidia/version ]; then
  echo "note: this machine has an NVIDIA driver; the no-driver check does not apply"
else
  expect_fail "--device gpu without a driver" "--device gpu: no usable GPU on .*: no NVIDIA driver or GPU found.*run with --device cpu" \
    "$MGT_BIN" --device gpu $N --out gpu
  [ ! -e gpu ] && ok "... and nothing was made" || bad "a folder was made"
fi
# bf16 mixed precision (PyTorch's autocast on CUDA) is for GPUs: the CPU backend refuses it.
expect_fail "--precision bf16 on the CPU backend" \
  "--precision bf16 is for GPUs: the CPU backend computes in fp32 only; leave --precision out or run on a GPU" \
  "$MGT_BIN" --device cpu --precision bf16 $N --out bf16
[ ! -e bf16 ] && ok "... and nothing was made" || bad "a folder was made"
expect_fail "--precision fp16" "--precision fp16: use fp32 or bf16" "$MGT_BIN" --precision fp16 $N --out fp16
out=$("$MGT_BIN" --device cpu --precision fp32 $N --max-steps 1 --out fp32 2>&1) \
  && ok "--precision fp32 (the default) on the CPU" || { bad "--precision fp32"; echo "$out"; }

# 3. Finite weights whose outputs overflow (a run that diverged): eval and predict refuse.
"$MGT_BIN" $N --max-steps 2 --out run >run.log 2>&1 || { bad "run"; cat run.log; }
python3 - <<'PY'
import json, struct
b = open("run/weights.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h, data = json.loads(b[8:8 + n]), bytearray(b[8 + n:])
for k in ("crc32", "crc32_covers"):
    h["__metadata__"].pop(k, None)
h["__metadata__"]["format"] = "pt"
for name in ("dense_1.weight", "dense_2.weight"):  # 1e30 each: 1e60 overflows float32
    s, e = h[name]["data_offsets"]
    w = struct.unpack("<%df" % ((e - s) // 4), data[s:e])
    data[s:e] = struct.pack("<%df" % len(w), *[x * 1e30 for x in w])
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open("huge.safetensors", "wb").write(struct.pack("<Q", len(t)) + t + bytes(data))
PY
expect_fail "eval with weights that overflow" "eval: the loss is (NaN|infinite) on synthetic.*the weights \(huge.safetensors\) give non-finite outputs" \
  "$MGT_BIN" eval --weights huge.safetensors --data synthetic
expect_fail "predict with weights that overflow" "predict: output [0-9]+ of sample [0-9]+ is (NaN|infinite).*nothing was written to p.npy" \
  "$MGT_BIN" predict --weights huge.safetensors --data synthetic --output p.npy
[ ! -e p.npy ] && ok "... and no p.npy" || bad "p.npy written"

# 4. --transport shm with too little /dev/shm: said before MPI_Win_allocate_shared would end the
# job with MPI_ERR_INTERN. A private 1 MB /dev/shm (a mount namespace of its own; Open MPI's TCP
# transport, which needs none of it, between the ranks).
if unshare -m true 2>/dev/null; then
  out=$(unshare -m sh -c 'mount -t tmpfs -o size=1M tmpfs /dev/shm && exec "$@"' sh env OMPI_MCA_btl=self,tcp \
    timeout 120 mpirun -q --oversubscribe --bind-to none -np 2 "$MGT_BIN" $N --max-steps 2 --transport shm --out shm 2>&1); rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] &&
     grep -qE "^mgtrain: --transport shm: the ranks need [0-9.]+ MiB of shared memory in /dev/shm, which has [0-9.]+ MiB free; use --transport mpi, or make /dev/shm larger" <<<"$out"; then
    ok "--transport shm with a 1 MB /dev/shm: one line, exit 2"
  else
    bad "--transport shm with a 1 MB /dev/shm: exit $rc"; echo "$out" | tail -12
  fi
  [ ! -e shm/checkpoint.safetensors ] && ok "... and nothing was trained" || bad "a run was trained"
else
  echo "note: unshare -m is not permitted here (not root?); the /dev/shm check does not run"
fi
finish
