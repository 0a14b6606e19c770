#!/usr/bin/env bash
# The binary built with CUDA on whatever machine runs the tests: with no usable GPU, --device auto
# trains on the CPU and --device gpu fails with one clear message; with a GPU, auto picks the GPU
# (one rank: nothing to all-reduce, so the MPI transport), and --device gpu works.
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
elif [ "$backend" = cpu ] && [ "$transport" = mpi ]; then
  ok "--device auto without a usable GPU trains on the CPU (backend cpu, transport mpi)"
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
