#!/usr/bin/env bash
# device_faults: what the GPU check does when something on the GPU machine goes wrong, made to go
# wrong here: a carried program whose library is missing (the environment part fails naming the
# library, and the other parts still run), and an MPI job that hangs and leaves a process behind
# that escaped its process group (the part times out within the budget, the process is ended by
# the part's token, the parts after it are reported as not started once the budget is spent, and
# the summary and tarball are still written); and an mpirun that succeeds but prints PMIx's error
# text (the part fails).
source "$MGT_SRC/tests/cli/lib.bash"
source "$MGT_SRC/tests/gpu/device/lib.bash"
source "$MGT_SRC/tests/gpu/device/testlib.bash"
: "${MGT_BUILD:?}"
OD=$MGT_SRC/tests/gpu/on-device

dry_kit "$T/kit" >prep.log \
  || { bad "prepare-device --dry-run failed"; cat prep.log; }
rm -rf "$T/kit/debs" # without the kit, on-device uses the mpirun on PATH (this machine's, or the fake below)

# 1. A carried program that needs a library this machine lacks.
build_needs_gone "$T/kit/build/bench/sgemm_rate" || bad "cannot build the program with a missing library"
out=$("$OD" truth --dry-run --only tests --from "$T/kit" --out "$T/out1" 2>&1)
rc=$?
echo "$out" | tail -n 8
S=$T/out1/truth.md
[ $rc -eq 1 ] && ok "a missing library: exit 1" || bad "a missing library: exit $rc, wanted 1"
row "$S" env FAIL "ldd cannot resolve: libmgtgone.so.1, undefined symbol mgt_gone"
row "$S" test_gpu_fallback PASS "checks passed"
envlog=$(tar -xzOf "$T/out1/truth-logs.tar.gz" ./env.log)
grep -q "^$T/kit/build/bench/sgemm_rate: libmgtgone.so.1$" <<<"$envlog" \
  && ok "env.log names the program and the library" || bad "env.log does not name the missing library"

cp -p "$MGT_BUILD/bench/sgemm_rate" "$T/kit/build/bench/sgemm_rate" || bad "cannot restore sgemm_rate"

# 2. An mpirun that hangs, with a child that leaves its process group (setsid) as an orphaned
#    rank would; the budget (60 s, 15 of them kept for packing) leaves ~40 s for the first part.
mkdir -p fake
cat >fake/mpirun <<'EOF'
#!/usr/bin/env bash
if [ "${1:-}" = --version ]; then echo "mpirun (Open MPI) 0 (hangs)"; exit 0; fi
setsid bash -c 'echo $$ >"$MGT_TEST_ORPHAN"; exec sleep 900' </dev/null >/dev/null 2>&1 &
exec sleep 900
EOF
chmod +x fake/mpirun
t0=$SECONDS
out=$(PATH="$T/fake:$PATH" MGT_TEST_ORPHAN=$T/orphan.pid "$OD" truth --dry-run --only nccl --budget 60 \
      --from "$T/kit" --out "$T/out2" 2>&1)
rc=$?
dt=$((SECONDS - t0))
echo "$out" | tail -n 8
S=$T/out2/truth.md
[ $rc -eq 1 ] && [ $dt -le 75 ] && ok "a hanging mpirun: exit 1 after $dt s of a 60 s budget" \
  || bad "a hanging mpirun: exit $rc after $dt s"
row "$S" nccl_1rank FAIL "timed out after [0-9]+ s"
row "$S" 'nccl_2ranks_one_gpu_[a-z]*' SKIPPED "not started: -?[0-9]+ s of the 60 s budget left, under the 15 s a part needs"
pid=$(cat orphan.pid 2>/dev/null)
if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
  ok "the process that escaped the part's process group was ended (pid $pid)"
else
  bad "the escaped process ${pid:-(no pid)} is still running"
  [ -n "$pid" ] && kill "$pid"
fi
partlog=$(tar -xzOf "$T/out2/truth-logs.tar.gz" ./nccl_1rank.log)
grep -q "^# on-device: ending processes the part left behind: $pid" <<<"$partlog" \
  && ok "the part's log names the process it ended" || bad "nccl_1rank.log does not name pid $pid"
grep -q "^- verdict: 1 PASS, 1 FAIL, 1 SKIPPED of 3 parts (finished)" "$S" \
  && ok "the summary is complete: $(grep '^- verdict' "$S")" || bad "verdict: $(grep '^- verdict' "$S")"

# 3. An mpirun that works but prints PMIx's error text: its compression banner (as the kit's
#    did on the first GPU machine, which had a PMIx of its own) is a note of the run, and the
#    part passes; any other error text fails a passing part, naming the text. The fake mpirun
#    prints the banner at its first call (nccl_1rank) and adds Open MPI's error line at its
#    second (nccl_2ranks), so that one run shows both.
mkdir -p talks
cat >talks/mpirun <<'EOF'
#!/usr/bin/env bash
if [ "${1:-}" = --version ]; then echo "mpirun (Open MPI) 0 (talks)"; exit 0; fi
echo "[vm:01234] pmix_mca_base_component_repository_open: unable to open /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/pmix_mca_pcompress_zlib: " >&2
echo "    dlopen error: undefined symbol: pmix_output_info" >&2
if [ -e "$MGT_TEST_CALLS" ]; then
  echo "[vm:01234] [[1,0],0] ORTE_ERROR_LOG: Not found in file ess_hnp_module.c at line 320" >&2
fi
touch "$MGT_TEST_CALLS"
exit 0
EOF
chmod +x talks/mpirun
out=$(PATH="$T/talks:$PATH" MGT_TEST_CALLS=$T/calls "$OD" truth --dry-run --only nccl --budget 60 \
  --from "$T/kit" --out "$T/out3" 2>&1)
echo "$out" | tail -n 4
row "$T/out3/truth.md" nccl_1rank PASS
grep -q "^- PMIx printed its compression banner (first in nccl_1rank.log" "$T/out3/truth.md" \
  && ok "... and the summary notes the banner once: $(grep -c 'compression banner' "$T/out3/truth.md") line" \
  || bad "no note of PMIx's banner: $(grep -A3 '^Notes' "$T/out3/truth.md")"
row "$T/out3/truth.md" 'nccl_2ranks_one_gpu_[a-z]*' FAIL "Open MPI or PMIx error text in a passing part: \[vm:01234\] \[\[1,0\],0\] ORTE_ERROR_LOG"
finish
