# Shared by the scripted tests: paths, mpirun, and assertions that fail loudly.
set -uo pipefail
: "${MGT_BIN:?run through ctest}" "${MGT_SRC:?}" "${MGT_COMPARE:?}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Quiet Open MPI's warnings about this container's network interfaces.
export OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
# A rank that waits for a message yields its core instead of spinning: the tests share the
# machine's cores (ctest -j, tests/CMakeLists.txt), and a spinning rank starves the rank it waits
# for (Open MPI yields by itself only where it sees more ranks than cores).
export OMPI_MCA_mpi_yield_when_idle=1
T=$(mktemp -d /tmp/mgt-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
cd "$T"
# In a build with -DMGT_SANITIZE=ON (tests/sanitize), AddressSanitizer and LeakSanitizer write
# each process's report into $T/sanitizer, every mpirun rank's included (the ranks inherit
# this environment; cluster.bash binds $T into its nodes): a test that only greps a run's output,
# or expects it to fail, would not notice a report on stderr. finish() fails the test on any
# report there. Elsewhere nothing reads the variable. (UBSan's reports ignore log_path in gcc
# 12: they stay on stderr and end the process with status 1.)
mkdir "$T/sanitizer"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}log_path=$T/sanitizer/report"
# Ranks that mpirun starts on other nodes (through a remote shell) get only OMPI_* variables and
# what -x names: an mpirun reaching other nodes passes these on (the sanitizers' settings, and
# the OpenBLAS kernel tests/run --full chooses, which launch/mgtrun forwards too).
REMOTE_X=()
for v in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS OPENBLAS_CORETYPE; do
  [ -n "${!v:-}" ] && REMOTE_X+=(-x "$v")
done
FAILS=0
CHECKS=0
DATA=/usr/share/datasets/fashion-mnist

mpi() { # mpi NP ARGS... : run mgtrain on NP ranks
  local np=$1; shift
  timeout 600 mpirun --oversubscribe --bind-to none -np "$np" "$MGT_BIN" "$@"
}
ok() { CHECKS=$((CHECKS + 1)); echo "ok: $*"; }
bad() { CHECKS=$((CHECKS + 1)); FAILS=$((FAILS + 1)); echo "FAIL: $*"; }
# expect_fail NAME PATTERN CMD... : CMD must exit non-zero and print PATTERN (grep -E)
expect_fail() {
  local name=$1 pat=$2; shift 2
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] && grep -qE -- "$pat" <<<"$out"; then ok "$name"
  else bad "$name (exit $rc, wanted /$pat/):"; echo "$out" | tail -20; fi
}
same() { # same NAME A B TOL
  local out
  if out=$("$MGT_COMPARE" "$2" "$3" "$4" "${5:-}"); then ok "$1: $(tail -1 <<<"$out")"
  else bad "$1: $out"; fi
}
finish() {
  local report
  for report in "$T"/sanitizer/report.*; do
    [ -e "$report" ] || continue
    bad "sanitizer report from a process of this test ($report):"
    head -60 "$report"
  done
  echo "$((CHECKS - FAILS)) passed, $FAILS failed"
  [ "$FAILS" -eq 0 ]
}
