#!/usr/bin/env bash
# labels: mpi
# timeout: 600
# cores: 1
# launch/mgtrun: starts mgtrain under mpirun with the right options, printing the exact command;
# refuses root without --as-root, and a rank count that is not a positive whole number. Its host
# lists (-H, --hostfile) on this machine as "localhost": what they turn into and what they refuse
# (tests/cli/multinode.sh runs them across nodes). Its errors end with mgtrain's own line.
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
grep '^+ mpirun' over.log | grep -- '--oversubscribe' >/dev/null && ok "-np $np adds --oversubscribe" || bad "no --oversubscribe for $np ranks on $(nproc) cores"

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
"$MGTRUN" --help >help.log 2>&1 && grep -qF 'mgtrun [-np N] [-H HOST[:SLOTS],... | --hostfile FILE]' help.log \
  && ok "--help shows the usage" || { bad "--help"; cat help.log; }

# --- one line per error ----------------------------------------------------------------------
# Whatever ends the job, mgtrain's own line is the last: Open MPI's boxes that only restate a
# rank's non-zero exit are left out, a refusal every rank meets (exit 2) and a failure one rank
# meets alone (MPI_Abort, exit 1) alike; its other boxes (a rank killed by a signal) stay.
# last_line NAME WANT_RC PATTERN CMD...: CMD's exit status and its last line
last_line() {
  local name=$1 want=$2 pat=$3 out rc
  shift 3
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq "$want" ] && grep -qE -- "$pat" <<<"$(tail -1 <<<"$out")" && ! grep -qE 'terminated normally|non-zero status|MPI_ABORT|ORTE_ERROR_LOG' <<<"$out"; then
    ok "$name: exit $rc, the last line: $(tail -1 <<<"$out")"
  else
    bad "$name: exit $rc (wanted $want), the last line not /$pat/:"; echo "$out" | tail -12
  fi
}
last_line "a flag mistyped (mgtrun -np 2 mgtrain --epoch 2)" 2 '^mgtrain: unknown flag --epoch .*did you mean --epochs' \
  "${noenv[@]}" timeout 300 "$MGTRUN" -np 2 "${root[@]}" "$MGT_BIN" --epoch 2
last_line "one rank's failure (MPI_Abort)" 1 '^rank 0: MGT_DUMP_GRADIENTS: .*check that the folder exists' \
  env MGT_DUMP_GRADIENTS="$T/no/grads.safetensors" "${noenv[@]}" timeout 300 "$MGTRUN" -np 2 "${root[@]}" "$MGT_BIN" \
  --data synthetic --synthetic-samples 512 --max-steps 2 --verbose 0 --out abort
printf '#!/bin/sh\n[ "$OMPI_COMM_WORLD_RANK" = 1 ] && kill -KILL $$\nsleep 2\n' >killed.sh
chmod +x killed.sh
out=$("${noenv[@]}" timeout 300 "$MGTRUN" -np 2 "${root[@]}" ./killed.sh 2>&1); rc=$?
# (Open MPI prints its "exited on signal" box most of the time, at times only the restating box
# that mgtrun leaves out: mgtrun's own last line names the signal either way.)
[ $rc -eq 137 ] && grep -q 'mgtrun: mpirun ended with status 137: a rank (or mpirun) was killed by SIGKILL' <<<"$(tail -1 <<<"$out")" &&
  ! grep -q 'terminated normally' <<<"$out" && ok "a rank killed by a signal: exit $rc, said last ($(grep -c 'exited on signal 9' <<<"$out") Open MPI box kept)" ||
  { bad "a rank killed by a signal: exit $rc"; echo "$out"; }

# --- host lists -------------------------------------------------------------------------------
# hosts NAME LOG MGTRUN-ARGS... -- MGTRAIN-ARGS...: runs a short job; sets CMD to the printed line
hosts() {
  local name=$1 log=$2; shift 2
  local pre=()
  while [ "$1" != -- ]; do pre+=("$1"); shift; done; shift
  MGT_HOSTS_PROBE=1 UNLISTED_PROBE=1 "${noenv[@]}" timeout 300 "$MGTRUN" "${pre[@]}" "${root[@]}" "$MGT_BIN" --data synthetic \
    --synthetic-samples 2000 --max-steps 2 --verbose 2 "$@" >"$log" 2>&1; local rc=$?
  CMD=$(grep '^+ mpirun' "$log")
  [ $rc -eq 0 ] && grep -q "world: " "$log" && ok "$name: trains ($(grep -oE 'world: [0-9]+ ranks? on [0-9]+ nodes?' "$log"))" \
    || { bad "$name: exit $rc"; cat "$log"; }
}
hosts "-H localhost:2" h1.log -H localhost:2 -- --out h1
grep -qE '^\+ mpirun -np 2 --bind-to none --map-by slot --host localhost:2 ' <<<"$CMD" \
  && ok "-H localhost:2: -np 2 from the slots, --host passed on" || bad "-H localhost:2 printed: $CMD"
# Keepalive window: idle T/4, probes T/12 apart, 3 of them: within T/2 of the last answer.
grep -q -- '--mca oob_tcp_keepalive_time 75 --mca oob_tcp_keepalive_intvl 25 --mca oob_tcp_keepalive_probes 3 ' <<<"$CMD" \
  && ok "keepalive from the default --comm-timeout 300: 75 s idle, 3 probes 25 s apart" || bad "keepalive for 300 s: $CMD"
grep -q -- '-x MGT_HOSTS_PROBE' <<<"$CMD" && grep -q -- '-x PATH' <<<"$CMD" \
  && ok "MGT_* and PATH are passed on with -x" || bad "no -x MGT_HOSTS_PROBE / -x PATH: $CMD"
grep -qE -- '-x (HOME|UNLISTED_PROBE) ' <<<"$CMD" && bad "a variable outside those families passed on: $CMD" \
  || ok "other variables are not passed on (HOME, UNLISTED_PROBE)"
grep -q -- '--oversubscribe' <<<"$CMD" && bad "--oversubscribe with declared slots: $CMD" || ok "declared slots: no --oversubscribe"

printf '# the nodes\nlocalhost slots=3   # three ranks\n\n' >hostfile
hosts "--hostfile (3 slots on $(nproc) cores)" h2.log --hostfile hostfile -- --comm-timeout 40 --out h2
grep -qE '^\+ mpirun -np 3 --bind-to none --map-by slot --hostfile hostfile ' <<<"$CMD" \
  && ok "--hostfile: -np 3 from its slots, comments and blank lines skipped" || bad "--hostfile printed: $CMD"
grep -q -- '--mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 3 ' <<<"$CMD" \
  && ok "keepalive from --comm-timeout 40: 10 s idle, probes 3 s apart" || bad "keepalive for 40 s: $CMD"
hosts "-np 1 of 2 slots, --network-interface lo" h3.log -np 1 -H localhost:2 --network-interface lo -- --comm-timeout=8 --out h3
grep -q -- '--mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1 ' <<<"$CMD" \
  && ok "keepalive from --comm-timeout=8: 2 s idle, probes 1 s apart (at least 1)" || bad "keepalive for 8 s: $CMD"
grep -q -- '--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -x NCCL_SOCKET_IFNAME=lo' <<<"$CMD" \
  && ok "--network-interface lo: Open MPI's TCP and NCCL's sockets kept to lo" || bad "--network-interface lo: $CMD"
grep -q '^+ mpirun -np 1 ' <<<"$CMD" && ok "-np 1 of 2 slots" || bad "-np 1: $CMD"
hosts "--network-interface with a subnet" h4.log -H localhost:2 --network-interface 127.0.0.0/8 -- --out h4
grep -q -- '--mca btl_tcp_if_include 127.0.0.0/8 --mca oob_tcp_if_include 127.0.0.0/8' <<<"$CMD" && ! grep -q NCCL_SOCKET_IFNAME <<<"$CMD" \
  && ok "--network-interface 127.0.0.0/8: Open MPI's settings, not NCCL's (it takes names only)" || bad "subnet: $CMD"

expect_fail "-H without a value" "mgtrun: -H needs a value: the hosts and their ranks" "$MGTRUN" -H
expect_fail "-H followed by a flag" "mgtrun: -H needs a value" "$MGTRUN" -H --as-root "$MGT_BIN"
expect_fail "-H with 0 slots" "mgtrun: -H a:0: 'a:0' is not HOST or HOST:SLOTS" "$MGTRUN" -H a:0 "${root[@]}" "$MGT_BIN"
expect_fail "-H with an empty entry" "mgtrun: -H a:2,,b: '' is not HOST or HOST:SLOTS" "$MGTRUN" -H a:2,,b "${root[@]}" "$MGT_BIN"
expect_fail "-np above the slots" "mgtrun: -np 5 but the hosts have 4 slots; start fewer ranks or list more slots" \
  "$MGTRUN" -np 5 -H a:2,b:2 "${root[@]}" "$MGT_BIN"
expect_fail "-H and --hostfile" "mgtrun: -H and --hostfile both given" "$MGTRUN" -H a --hostfile hostfile "${root[@]}" "$MGT_BIN"
expect_fail "a hostfile that is not there" "mgtrun: --hostfile no/hosts: no such readable file" \
  "$MGTRUN" --hostfile no/hosts "${root[@]}" "$MGT_BIN"
printf 'node1 slots=2\nnode2 slots=two\n' >bad.hosts
expect_fail "a hostfile line without a number of slots, named by line" \
  "mgtrun: bad.hosts:2: 'node2 slots=two': expected \"HOST slots=N\"" "$MGTRUN" --hostfile bad.hosts "${root[@]}" "$MGT_BIN"
printf '# nothing\n\n' >empty.hosts
expect_fail "a hostfile with no host" "mgtrun: --hostfile empty.hosts lists no host" \
  "$MGTRUN" --hostfile empty.hosts "${root[@]}" "$MGT_BIN"
expect_fail "--network-interface on one node" "mgtrun: --network-interface goes with -H or --hostfile" \
  "$MGTRUN" --network-interface eth0 "${root[@]}" "$MGT_BIN"
finish
