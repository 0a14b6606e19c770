#!/usr/bin/env bash
# The binary built with CUDA on whatever machine runs the tests: with no usable GPU, --device auto
# trains on the CPU and --device gpu fails with one clear message; with a GPU, auto picks the GPU
# (one rank: nothing to all-reduce, so the MPI transport), and --device gpu works. Where a GPU may
# be (NVIDIA's device files or driver library, or the emulated stack, MGT_EMU_GPUS) and auto still
# takes the CPU, it says why; where nvidia-smi lists a GPU, auto must take it.
set -uo pipefail
: "${MGT_BIN:?run through ctest}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_btl=self,vader
T=$(mktemp -d /tmp/mgt-gpu-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
cd "$T"
FAILS=0
ok() { echo "ok: $*"; }
bad() { FAILS=$((FAILS + 1)); echo "FAIL: $*"; }
run=(--data synthetic --synthetic-samples 512 --batch-size 64 --max-steps 3 --verbose 2)

out=$("$MGT_BIN" "${run[@]}" --out "$T/auto" 2>&1)
rc=$?
echo "$out"
backend=$(sed -n 's/.*; backend \([a-z]*\), transport \([a-z]*\).*/\1/p' <<<"$out")
transport=$(sed -n 's/.*; backend \([a-z]*\), transport \([a-z]*\).*/\2/p' <<<"$out")
if [ $rc -ne 0 ] || ! grep -q "^Trained 3 steps" <<<"$out"; then
  bad "--device auto did not train 3 steps (exit $rc)"
elif [ "$backend" = cpu ] && command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]'; then
  bad "nvidia-smi lists a GPU, and --device auto trained on the CPU: $(grep -m1 'notice: --device auto' <<<"$out")"
elif [ "$backend" = cpu ] && [ "$transport" = mpi ]; then
  ok "--device auto without a usable GPU trains on the CPU (backend cpu, transport mpi)"
  if [ -n "${MGT_EMU_GPUS:-}" ] || [ -e /dev/nvidiactl ] || ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    grep -q '^notice: --device auto trains on the CPU: no usable GPU on .*: .* (.*); --device gpu makes this an error' <<<"$out" \
      && ok "... and, a GPU being possible here, says why: $(grep -m1 '^notice: --device auto' <<<"$out")" \
      || bad "auto took the CPU where a GPU may be, without saying why"
    out=$("$MGT_BIN" "${run[@]}" --precision bf16 --out "$T/bf16" 2>&1)
    rc=$?
    [ $rc -eq 2 ] && grep -q -- '--precision bf16 is for GPUs, and --device auto found none: no usable GPU on .*: ' <<<"$out" \
      && [ ! -e "$T/bf16" ] && ok "--device auto --precision bf16 without a usable GPU: refused, with the reason" \
      || { bad "auto and bf16 without a usable GPU: exit $rc"; echo "$out"; }
  else
    grep -q 'notice: --device auto' <<<"$out" && bad "a notice where no GPU can be: $out" \
      || ok "... silently, no GPU being possible here"
  fi
  out=$("$MGT_BIN" "${run[@]}" --device gpu --out "$T/gpu" 2>&1)
  rc=$?
  echo "$out"
  if [ $rc -ne 0 ] && grep -q -- "--device gpu: no usable GPU on .*; run with --device cpu" <<<"$out" \
     && [ "$(wc -l <<<"$out")" -le 2 ]; then
    ok "--device gpu without a usable GPU fails with one clear message"
  else
    bad "--device gpu without a GPU: exit $rc, wanted non-zero and 'no usable GPU ... run with --device cpu'"
  fi
elif [ "$backend" = gpu ] && [ "$transport" = mpi ]; then
  ok "--device auto with a GPU trains on it (backend gpu, transport mpi for one rank)"
  out=$("$MGT_BIN" "${run[@]}" --device gpu --out "$T/gpu" 2>&1)
  rc=$?
  [ $rc -eq 0 ] && ok "--device gpu trains" || { bad "--device gpu exited $rc"; echo "$out"; }
else
  bad "unexpected start-up line: backend '$backend', transport '$transport'"
fi
out=$("$MGT_BIN" "${run[@]}" --device cpu --out "$T/cpu" 2>&1)
rc=$?
[ $rc -eq 0 ] && grep -q "backend cpu, transport mpi" <<<"$out" && ok "--device cpu trains on the CPU" \
  || { bad "--device cpu (exit $rc)"; echo "$out"; }
[ "$FAILS" -eq 0 ]
