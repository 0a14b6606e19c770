#!/usr/bin/env bash
# labels: cli
# OpenBLAS's kernel (src/cpu/cpu_blas.c). On a CPU model OpenBLAS does not know it falls back to
# an old kernel (Prescott's SSE3 code on an AVX-512 Xeon), and mgtrain then executes itself again
# once with OPENBLAS_CORETYPE set to the kernel the CPU's instruction sets call for (AVX-512 F,
# BW, DQ, VL: SkylakeX; AVX2 and FMA: Haswell). Checked with OPENBLAS_VERBOSE=2, which makes each
# loaded image of OpenBLAS print its kernel ("Core: NAME"):
#   1. where OpenBLAS falls back: two images (OpenBLAS's choice, then the one mgtrain set), the
#      start-up block's rank line says which kernel runs and why, also on 2 ranks under mpirun
#      (the exec keeps the process id, so the launcher's PMIx server knows the process), and the
#      same weights as a run given that OPENBLAS_CORETYPE by hand, and the process keeps its
#      name (ps, pgrep: the kernel names it after the file executed);
#   2. an explicit OPENBLAS_CORETYPE is kept, with one image, and the rank line says so;
#   3. libmgt (mgt_train_argv) never executes its host process again: one image, and the rank
#      line names the variable to set instead;
#   4. an OPENBLAS_CORETYPE whose kernel needs instructions the CPU lacks (OpenBLAS takes it, and
#      its first matrix product would die of SIGILL: SkylakeX without AVX-512) is refused in one
#      line, by mgtrain with status 2 before anything is written, and by libmgt at its start-up.
# Where OpenBLAS knows the CPU, part 1 cannot happen here: it checks that nothing is executed
# again, and says with a notice that the choice was not exercised.
source "$(dirname "$0")/lib.bash"
unset OPENBLAS_CORETYPE MGT_OPENBLAS_FALLBACK # (the numeric matrix of tests/run sets the first)
cores() { sed -n 's/^Core: //p' "$1" | tr '\n' ' ' | sed 's/ $//'; }
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
fit=
if has avx512f avx512bw avx512dq avx512vl; then fit=SkylakeX
elif has avx2 fma; then fit=Haswell; fi
OPENBLAS_VERBOSE=2 "$MGT_BIN" --version >v.out 2>v.err || bad "mgtrain --version"
own=$(cores v.err | cut -d' ' -f1)
[ -n "$own" ] || { bad "OPENBLAS_VERBOSE=2 printed no kernel: $(head -3 v.err)"; finish; exit 1; }
run=(--data synthetic --synthetic-samples 512 --batch-size 64 --max-steps 3 --no-validation
     --verbose 2)
case $own in Prescott|Core2|Penryn|Dunnington|Nehalem|Atom|Katmai|Coppermine|Northwood|Banias|Sandybridge) old=1 ;; *) old=0 ;; esac

# 1. OpenBLAS's own choice, and mgtrain's where it falls back
if [ $old = 1 ] && [ -n "$fit" ]; then
  [ "$(cores v.err)" = "$own $fit" ] && ok "--version: OpenBLAS took $own, mgtrain ran again with $fit (one exec)" \
    || bad "--version: kernels '$(cores v.err)', wanted '$own $fit'"
  grep -qx "  OpenBLAS $fit kernel (mgtrain's choice: OpenBLAS took $own on this CPU)" v.out \
    && ok "--version says which kernel runs and why" || bad "--version: $(cat v.out)"
  OPENBLAS_VERBOSE=2 mpi 2 "${run[@]}" --out r2 >r2.log 2>&1 || { bad "2 ranks under mpirun"; tail -5 r2.log; }
  n=$(grep -c "^  rank [01]: .*cpu (1 BLAS thread); OpenBLAS $fit kernel (mgtrain's choice: OpenBLAS took $own on this CPU)$" r2.log)
  # (the two ranks' lines interleave in any order: counted, not compared in sequence)
  [ "$n" = 2 ] && grep -q "Trained 3 steps" r2.log && [ "$(grep -cx "Core: $own" r2.log)" = 2 ] &&
    [ "$(grep -cx "Core: $fit" r2.log)" = 2 ] && [ "$(grep -c '^Core: ' r2.log)" = 4 ] \
    && ok "2 ranks under mpirun: each ran again with $fit and trained" \
    || { bad "2 ranks: $n rank lines, kernels '$(cores r2.log)'"; grep -E "rank|Trained" r2.log; }
  OPENBLAS_CORETYPE=$fit mpi 2 "${run[@]}" --out r2-set >/dev/null 2>&1 || bad "2 ranks, OPENBLAS_CORETYPE=$fit"
  same "the weights of mgtrain's choice are those of OPENBLAS_CORETYPE=$fit by hand" \
    r2/weights.safetensors r2-set/weights.safetensors 0
  "$MGT_BIN" --data synthetic --epochs 1000 --no-validation --verbose 2 --out long >long.log 2>&1 &
  p=$!
  for _ in $(seq 1200); do grep -q '^  model:' long.log && break; sleep 0.1; done
  name=$(cat /proc/$p/comm 2>/dev/null); want=$(basename "$(readlink -f "$MGT_BIN")" | cut -c1-15)
  kill $p; wait $p 2>/dev/null
  grep -q "OpenBLAS $fit kernel (mgtrain's choice" long.log && [ "$name" = "$want" ] \
    && ok "the process ran again as '$name', its name before" \
    || { bad "the process is called '$name' after running again, not '$want'"; head -5 long.log; }
else
  [ "$(cores v.err)" = "$own" ] && ok "OpenBLAS runs $own here by itself: no exec" || bad "kernels '$(cores v.err)'"
  echo "notice: OpenBLAS knows this CPU (it runs $own${fit:+; the CPU calls for $fit}): mgtrain's own choice of kernel is not exercised here"
fi

# 2. An explicit OPENBLAS_CORETYPE is the user's: kept, no exec
want=${fit:-$own}
OPENBLAS_CORETYPE=$want OPENBLAS_VERBOSE=2 "$MGT_BIN" "${run[@]}" --out one >one.log 2>&1 || { bad "OPENBLAS_CORETYPE=$want"; tail -5 one.log; }
[ "$(cores one.log)" = "$want" ] && grep -q "^  rank 0: .*; OpenBLAS $want kernel (OPENBLAS_CORETYPE)$" one.log \
  && ok "OPENBLAS_CORETYPE=$want is kept (one image) and the rank line says so" \
  || { bad "OPENBLAS_CORETYPE=$want: kernels '$(cores one.log)'"; grep "rank 0" one.log; }

# 3. libmgt: no exec inside a library. (A program built here without -fsanitize cannot load a
# sanitized libmgt: ASan must be the first library; tests/sanitize's install test has the same
# reason to be left out.)
MPICC=$(pkg-config --cflags --libs ompi-c 2>/dev/null)
if ldd "$MGT_BUILD/libmgt.so" 2>/dev/null | grep libasan >/dev/null; then
  echo "note: a build with AddressSanitizer; the check of libmgt in a program of its own does not apply"
elif cc -std=c17 -o train_lib "$MGT_SRC/tests/install/train_installed.c" -I"$MGT_SRC/include" \
  -L"$MGT_BUILD" -Wl,-rpath,"$MGT_BUILD" -lmgt $MPICC >cc.log 2>&1; then
  OPENBLAS_VERBOSE=2 timeout 600 ./train_lib "${run[@]}" --out lib >lib.log 2>&1 || { bad "mgt_train_argv"; tail -5 lib.log; }
  if [ $old = 1 ] && [ -n "$fit" ]; then
    [ "$(cores lib.log)" = "$own" ] \
      && grep -q "^  rank 0: .*; OpenBLAS runs its $own kernel, not its $fit one: set OPENBLAS_CORETYPE=$fit$" lib.log \
      && ok "libmgt keeps its host process (one image, $own) and names OPENBLAS_CORETYPE=$fit" \
      || { bad "libmgt: kernels '$(cores lib.log)'"; grep "rank 0" lib.log; }
  else
    [ "$(cores lib.log)" = "$own" ] && grep -q "^  rank 0: .*; OpenBLAS $own kernel$" lib.log \
      && ok "libmgt: one image, OpenBLAS's $own kernel" || { bad "libmgt: kernels '$(cores lib.log)'"; grep "rank 0" lib.log; }
  fi
else
  bad "cannot build tests/install/train_installed.c against $MGT_BUILD/libmgt.so"; cat cc.log
fi

# 4. A kernel this CPU cannot run
unfit=
if ! has avx512f avx512bw avx512dq avx512vl; then unfit=SkylakeX
elif ! has avx2 fma; then unfit=Haswell; fi
if [ -n "$unfit" ]; then
  refusal="OPENBLAS_CORETYPE=$unfit: OpenBLAS's $unfit kernel needs .*, which this CPU does not have, and would stop at its first matrix product (illegal instruction); unset OPENBLAS_CORETYPE${fit:+ or set it to $fit}"
  rc=0; OPENBLAS_CORETYPE=$unfit "$MGT_BIN" "${run[@]}" --out unfit >unfit.log 2>&1 || rc=$?
  [ $rc = 2 ] && [ "$(wc -l <unfit.log)" = 1 ] && grep -qx "mgtrain: $refusal" unfit.log && [ ! -e unfit ] \
    && ok "OPENBLAS_CORETYPE=$unfit is refused in one line (status 2, nothing written)" \
    || { bad "OPENBLAS_CORETYPE=$unfit: status $rc"; cat unfit.log; ls unfit 2>/dev/null; }
  if [ -x train_lib ]; then
    rc=0; OPENBLAS_CORETYPE=$unfit timeout 600 ./train_lib "${run[@]}" --out lib-unfit >lib-unfit.log 2>&1 || rc=$?
    [ $rc != 0 ] && [ $rc -lt 128 ] && grep -qx "rank 0: $refusal" lib-unfit.log \
      && ok "libmgt refuses OPENBLAS_CORETYPE=$unfit (status $rc)" \
      || { bad "libmgt, OPENBLAS_CORETYPE=$unfit: status $rc"; cat lib-unfit.log; }
  fi
else
  echo "notice: this CPU runs every kernel OpenBLAS offers: the refusal of one it cannot run is not exercised here"
fi
finish
