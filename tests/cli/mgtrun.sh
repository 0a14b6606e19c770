#!/usr/bin/env bash
# labels: mpi
# timeout: 600
# launch/mgtrun: starts mgtrain under mpirun with the right options, printing the exact command;
# refuses root without --as-root, and a rank count that is not a positive whole number.
source "$(dirname "$0")/lib.bash"
MGTRUN=$MGT_SRC/launch/mgtrun
root=(); [ "$(id -u)" -eq 0 ] && root=(--as-root)
# Open MPI's own permission for root is ctest's; mgtrun must work without it.
noenv=(env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM)

"${noenv[@]}" timeout 300 "$MGTRUN" -np 2 "${root[@]}" "$MGT_BIN" --data synthetic --max-steps 20 \
  --verbose 2 --out RUN >run.log 2>&1; rc=$?
[ $rc -eq 0 ] && ok "mgtrun -np 2 trains and exits 0" || { bad "mgtrun -np 2: exit $rc"; cat run.log; }
cmdline=$(grep '^+ mpirun' run.log)
[ "$(grep -c '^+ mpirun' run.log)" = 1 ] && ok "prints the command: $cmdline" || { bad "no '+ mpirun' line"; cat run.log; }
grep -qE "^\+ mpirun -np 2 --bind-to none --map-by slot .*$MGT_BIN --data synthetic --max-steps 20 --verbose 2 --out RUN$" run.log \
  && ok "the command has -np 2, --bind-to none, --map-by slot, the program and its flags in order" || bad "unexpected command: $cmdline"
if [ "$(id -u)" -eq 0 ]; then
  grep -q -- '--allow-run-as-root' <<<"$cmdline" && ok "--as-root adds --allow-run-as-root" || bad "--as-root: no --allow-run-as-root in $cmdline"
else
  grep -q -- '--allow-run-as-root' <<<"$cmdline" && bad "--allow-run-as-root for a user that is not root" || ok "not root: no --allow-run-as-root"
fi
grep -q -- '--oversubscribe' <<<"$cmdline" && [ "$(nproc)" -ge 2 ] && bad "--oversubscribe with 2 ranks on $(nproc) cores" || ok "no --oversubscribe for 2 ranks on $(nproc) cores"
grep -q 'world: 2 ranks on 1 node' run.log && ok "start-up block: 2 ranks" || { bad "start-up block has no 2 ranks"; cat run.log; }
grep -q '^  rank 1: ' run.log && ok "start-up block lists rank 1" || bad "no rank 1 line"
grep -qE '^Epoch 1/1 - ' run.log && ok "epoch line" || bad "no epoch line"
[ -s RUN/weights.safetensors ] && ok "RUN/weights.safetensors written" || bad "no RUN/weights.safetensors"

# The printed command is exact: run it again as printed (quoted by mgtrun), with another --out.
"${noenv[@]}" timeout 300 "$MGTRUN" -np 2 "${root[@]}" "$MGT_BIN" --data synthetic --max-steps 2 \
  --verbose 0 --out "out dir" >space.log 2>&1 && [ -s "out dir/weights.safetensors" ] \
  && ok "an argument with a space reaches mgtrain whole" || { bad "--out 'out dir'"; cat space.log; }
grep -q -- "--out out\\\\ dir" space.log && ok "and is printed quoted: $(grep -o -- '--out out.*' space.log)" || { bad "not quoted:"; grep '^+' space.log; }

# More ranks than cores: --oversubscribe.
np=$(( $(nproc) + 1 ))
"${noenv[@]}" timeout 300 "$MGTRUN" -np $np "${root[@]}" "$MGT_BIN" --data synthetic --synthetic-samples 2000 \
  --max-steps 2 --verbose 2 --out over >over.log 2>&1; rc=$?
[ $rc -eq 0 ] && grep -q "world: $np ranks" over.log && ok "-np $np on $(nproc) cores runs $np ranks" || { bad "-np $np: exit $rc"; cat over.log; }
grep '^+ mpirun' over.log | grep -q -- '--oversubscribe' && ok "-np $np adds --oversubscribe" || bad "no --oversubscribe for $np ranks on $(nproc) cores"

# Without -np: one rank per GPU, or 2 on a machine without GPUs.
if ! command -v nvidia-smi >/dev/null; then
  "${noenv[@]}" timeout 300 "$MGTRUN" "${root[@]}" "$MGT_BIN" --data synthetic --max-steps 2 --verbose 2 --out nonp >nonp.log 2>&1
  grep -q '^+ mpirun -np 2 ' nonp.log && grep -q 'world: 2 ranks' nonp.log && ok "no -np and no GPUs: 2 ranks" || { bad "no -np:"; cat nonp.log; }
else
  echo "note: nvidia-smi is here; the no-GPU default (2 ranks) was not checked"
fi

# Root without --as-root: refused, nothing started.
if [ "$(id -u)" -eq 0 ]; then
  out=$("${noenv[@]}" "$MGTRUN" -np 2 "$MGT_BIN" --data synthetic --max-steps 2 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q 'running as root: Open MPI refuses that unless asked; pass --as-root' <<<"$out" \
    && ok "root without --as-root: refused ($out)" || { bad "root without --as-root: exit $rc"; echo "$out"; }
  grep -q '^+ mpirun' <<<"$out" && bad "root without --as-root still printed a command" || ok "root without --as-root: nothing started"
else
  echo "note: not root; the root check did not run"
fi

# Rank counts that are not positive whole numbers, and no program.
expect_fail "-np 0" "mgtrun: -np 0: expected a positive whole number" "$MGTRUN" -np 0 "${root[@]}" "$MGT_BIN"
expect_fail "-np x" "mgtrun: -np x: expected a positive whole number" "$MGTRUN" -np x "${root[@]}" "$MGT_BIN"
expect_fail "-np -1" "mgtrun: -np -1: expected a positive whole number" "$MGTRUN" -np -1 "${root[@]}" "$MGT_BIN"
expect_fail "-np 2.5" "mgtrun: -np 2.5: expected a positive whole number" "$MGTRUN" -np 2.5 "${root[@]}" "$MGT_BIN"
expect_fail "-np with no value" "mgtrun: -np needs a value" "$MGTRUN" -np
expect_fail "a program path that is not there" "mgtrun: ./no/mgtrain: not an executable file" "$MGTRUN" -np 2 "${root[@]}" ./no/mgtrain
"$MGTRUN" --help >help.log 2>&1 && grep -q 'mgtrun \[-np N\] \[--as-root\]' help.log && ok "--help shows the usage" || { bad "--help"; cat help.log; }
finish
