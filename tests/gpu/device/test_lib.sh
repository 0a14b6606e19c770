#!/usr/bin/env bash
# device_lib: the pieces of the GPU check that decide things, each against real input: the NCCL
# route for two ranks on one GPU by version code, version arithmetic, ldd's missing libraries
# (a program whose library was removed), the figures read off a real mgtrain --profile run, the
# source digest that ties a carried build to its sources, the detector of Open MPI's and PMIx's
# error text; and shellcheck over every script of the check (installed through
# launch/install-deps when missing).
source "$MGT_SRC/tests/cli/lib.bash"
source "$MGT_SRC/tests/gpu/device/lib.bash"
source "$MGT_SRC/tests/gpu/device/testlib.bash"

is() { # is NAME GOT WANT
  [ "$2" = "$3" ] && ok "$1: $2" || bad "$1: got '$2', wanted '$3'"
}

# 1. Versions and the NCCL route: 2.30.0 (23000) is the first NCCL with
#    NCCL_MULTI_RANK_GPU_ENABLE; anything older, or an unknown version (0), uses NCCL_HOSTID.
is "NCCL 2.28.9 takes NCCL_HOSTID" "$(dev_nccl_route 22809)" hostid
is "NCCL 2.29.7 takes NCCL_HOSTID" "$(dev_nccl_route 22907)" hostid
is "NCCL 2.30.0 takes the documented route" "$(dev_nccl_route 23000)" multi-rank
is "NCCL 2.31.2 takes the documented route" "$(dev_nccl_route 23102)" multi-rank
is "an unknown NCCL takes NCCL_HOSTID" "$(dev_nccl_route 0)" hostid
is "version code 22809" "$(dev_version 22809)" 2.28.9
is "version code 91900" "$(dev_version 91900)" 9.19.0
dev_version_ge 2.39 2.34 && ok "glibc 2.39 >= 2.34" || bad "2.39 >= 2.34"
dev_version_ge 2.34 2.34 && ok "2.34 >= 2.34" || bad "2.34 >= 2.34"
dev_version_ge 2.31 2.34 && bad "2.31 >= 2.34 said yes" || ok "2.31 < 2.34"
dev_version_ge 9.10.0 9.9.2 && ok "9.10.0 >= 9.9.2 (numeric, not text)" || bad "9.10.0 >= 9.9.2"

# 1b. Run paths: an empty entry (the current folder) is named; mgtrain's are sound.
echo 'int main(void) { return 0; }' >rp.c
if cc -o rp rp.c -Wl,-rpath,/usr/lib:: 2>/dev/null; then
  is "an empty run-path entry is named" "$(dev_unsafe_runpath rp | paste -sd'|')" "rp: []|rp: []"
else
  bad "cannot build a program with a run path"
fi
is "mgtrain's run path" "$(dev_unsafe_runpath "$MGT_BIN")" ""

# 2. ldd: a program linked to a library that is then removed must be named with that library
#    and the symbol it no longer finds; mgtrain itself resolves completely here.
if MGT_KEEP_GONE=1 build_needs_gone "$T/needs_gone"; then
  is "ldd finds a present library" "$(LD_LIBRARY_PATH=$T dev_ldd_missing "$T/needs_gone")" ""
  rm -f libmgtgone.so.1
  is "ldd names the removed library and the symbol it held" \
    "$(dev_ldd_missing "$T/needs_gone" "$MGT_BIN" | paste -sd'|')" \
    "$T/needs_gone: libmgtgone.so.1|$T/needs_gone: undefined symbol mgt_gone"
  echo "not a program" >notelf
  grep -q "^$T/notelf: ldd failed (" <<<"$(dev_ldd_missing "$T/notelf")" \
    && ok "a file ldd cannot read is named" || bad "notelf: $(dev_ldd_missing "$T/notelf")"
else
  bad "cannot build the ldd test program"
fi
need=$(dev_glibc_needed "$MGT_BIN")
[[ $need =~ ^2\.[0-9]+$ ]] && dev_version_ge "$(getconf GNU_LIBC_VERSION | cut -d' ' -f2)" "$need" \
  && ok "mgtrain needs glibc $need, which this machine has" || bad "glibc needed: '$need'"

# 3. Figures from a real run: 2 epochs of 40 steps on the CPU with --profile and validation.
"$MGT_BIN" train --device cpu --data synthetic --synthetic-samples 2560 --batch-size 64 --epochs 2 \
  --profile --verbose 2 --val-split 0.2 --out "$T/run" >run.log 2>&1 || { bad "the CPU run failed"; cat run.log; }
figs=$(dev_train_figures run.log)
echo "figures: $figs"
step=$(awk '$1 == "0" && NF > 10 { print $(NF - 1) }' run.log)
steps=$(sed -n 's/^Trained \([0-9]*\) steps.*/\1/p' run.log)
acc=$(sed -n 's/.*test acc: \([0-9.]*\)\( - test top5_acc: [0-9.]*\)\{0,1\}$/\1/p' run.log)
grep -q "^$steps steps in [0-9.]* s, [0-9]* samples/s ([0-9.]* s in all)" <<<"$figs" \
  && ok "the figures start with the run's $steps steps" || bad "steps: '$figs'"
grep -q "; step $step ms: data [0-9.]*, forward [0-9.]*, backward [0-9.]*, allreduce [0-9.]* ([0-9.]*%), update [0-9.]*" <<<"$figs" \
  && ok "the profile's step time ($step ms) and every phase, in the table's order" || bad "profile: '$figs'"
grep -q "; test acc $acc (loss [0-9.]*) after 2 epoch(s)" <<<"$figs" \
  && ok "test accuracy $acc after 2 epochs" || bad "accuracy: '$figs'"
printf 'FAIL gpu.c:12: relu: relative error 3e-3 > 1e-04\nt: 1 checks FAILED, 41 passed\n' >fails.log
is "a failed test program" "$(dev_check_figures fails.log)" \
  "t: 1 checks FAILED, 41 passed; first failure: FAIL gpu.c:12: relu: relative error 3e-3 > 1e-04"
printf 'ok: a\nFAIL: b went wrong\nok: c\n' >script.log
is "a test script" "$(dev_check_figures script.log)" "2 ok, 1 failed; first failure: FAIL: b went wrong"

# 3b. Open MPI's and PMIx's error text, as the first GPU run printed it (each mpirun), is found;
#     NCCL's INFO lines about symbols, mgtrain's own output and a clean run are not.
cat >banners.log <<'EOF'
[vm:03375] pmix_mca_base_component_repository_open: unable to open /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/pmix_mca_pcompress_zlib: 
    dlopen error: /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/pmix_mca_pcompress_zlib.so: undefined symbol: pmix_output_info
    Perhaps a missing symbol, or compiled for a different version of pmix? (ignored)
--------------------------------------------------------------------------
PMIx was unable to find a usable compression library
on the system. We will therefore be unable to compress
large data streams.
--------------------------------------------------------------------------
vm:3398:3419 [0] NCCL INFO dlvsym failed on mlx5dv_reg_dmabuf_mr - /lib/x86_64-linux-gnu/libmlx5.so: undefined symbol: mlx5dv_reg_dmabuf_mr, version MLX5_1.25 version MLX5_1.25
test_gpu_nccl: 7 checks passed
EOF
is "the first GPU run's PMIx error text" "$(dev_mpi_banners banners.log | cut -c1-60 | paste -sd'|')" \
  "[vm:03375] pmix_mca_base_component_repository_open: unable t|banner: PMIx was unable to find a usable compression library"
is "a clean run (NCCL INFO and mgtrain's own lines)" "$(sed -n '9,10p' banners.log | dev_mpi_banners)" ""
#     Of those, PMIx's compression banner and its component's failed load are harmless (a note of
#     the run); anything else fails the part.
is "PMIx's compression banner: no failure" "$(dev_mpi_failures banners.log)" ""
is "... but two harmless lines" "$(dev_mpi_harmless banners.log | wc -l)" 2
printf '%s\n' '--------------------------------------------------------------------------' \
  'mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).' \
  '--------------------------------------------------------------------------' >>banners.log
is "another banner is a failure" "$(dev_mpi_failures banners.log)" \
  "banner: mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
is "mgtrain's output on the CPU" "$(dev_mpi_banners run.log)" ""

# 4. The digest: the same over a copy of the sources, different after a change to one, the same
#    after a change to a file that is not built (a script).
mkdir -p copy/tests
(cd "$MGT_SRC" && cp -r CMakeLists.txt examples src cuda bench "$T/copy/" &&
  cp -r tests/gpu tests/unit tests/tools "$T/copy/tests/") || bad "cannot copy the sources"
d0=$(dev_digest "$MGT_SRC")
is "the digest of a copy of the sources" "$(dev_digest copy)" "$d0"
echo "# a comment" >>copy/tests/gpu/on-device
is "a changed script leaves the digest" "$(dev_digest copy)" "$d0"
echo "/* a comment */" >>copy/src/util.c
d1=$(dev_digest copy)
[ -n "$d1" ] && [ "$d1" != "$d0" ] && ok "a changed source changes the digest ($d0 -> $d1)" \
  || bad "a changed source kept the digest $d1"

# 5. shellcheck over every script of the check, and over these tests (whose "cond && ok || bad"
#    is an if-then-else because ok always succeeds: SC2015 is left out for them).
command -v shellcheck >/dev/null || "$MGT_SRC/launch/install-deps" shellcheck >/dev/null
if out=$(cd "$MGT_SRC" && shellcheck -x tests/gpu/on-device tests/gpu/prepare-device \
         tests/gpu/device/lib.bash tests/gpu/device/use-openmpi tests/gpu/device/parts/*.bash 2>&1 &&
         shellcheck -x -e SC2015 tests/gpu/device/test_*.sh tests/gpu/device/testlib.bash \
           tests/gpu/share_gpu.sh 2>&1); then
  ok "shellcheck: on-device, its parts, prepare-device, lib.bash, use-openmpi, share_gpu.sh and the tests are clean"
else
  bad "shellcheck:"
  echo "$out"
fi
finish
