#!/usr/bin/env bash
# labels: mpi
# timeout: 600
# Every ending mgtrain controls leaves a clean run folder: no mgtrain.lock, no NAME.tmp.<pid>.
# SIGHUP and SIGPIPE stop training as SIGTERM does (a checkpoint at the step, exit 128 + the
# signal); a second Ctrl-C stops at once and still removes the lock; a write past the file-size
# limit (ulimit -f: SIGXFSZ) fails with a message, on one rank and on two; the watchdog's end of a
# job whose peer hangs; and launch/mgtrun, signalled, exits 128 + the signal as mgtrain does.
source "$(dirname "$0")/lib.bash"
N="--data synthetic --synthetic-samples 200000 --batch-size 64 --verbose 2"
MSG='interrupted at epoch [0-9]+ step [0-9]+ \(SIG[A-Z0-9]+\): checkpoint saved; resume with --resume'

wait_file() { # wait_file FILE SECONDS: FILE exists within SECONDS
  local i
  for i in $(seq $(($2 * 10))); do [ -e "$1" ] && return 0; sleep 0.1; done
  return 1
}
clean() { # clean NAME DIR: no lock and no temporary file left in DIR
  local left
  left=$(ls -A "$1" 2>/dev/null | grep -E '^mgtrain\.lock$|\.tmp\.[0-9]+$' | paste -sd' ')
  [ -z "$left" ] && ok "$2: no lock or temporary file left in $1" || bad "$2: left in $1: $left"
}
status() { # status NAME RC WANT LOG
  [ "$2" -eq "$3" ] && ok "$1: exit $2" || { bad "$1: exit $2, wanted $3"; tail -5 "$4"; }
}

# 1. SIGHUP (the terminal or ssh session went away): a checkpoint at the step, exit 129.
"$MGT_BIN" $N --save-every 20 --out hup >hup.log 2>&1 &
p=$!
if wait_file hup/checkpoint.safetensors 120; then
  kill -HUP $p; wait $p; rc=$?
  status "SIGHUP" $rc 129 hup.log
  grep -qE "$MSG" hup.log && grep -q "(SIGHUP)" hup.log && ok "SIGHUP: '$(grep -oE "$MSG" hup.log)'" \
    || { bad "SIGHUP: no checkpoint message"; tail -3 hup.log; }
  clean hup SIGHUP
  "$MGT_BIN" $N --max-steps 1 --out hup --resume >hup2.log 2>&1 \
    && ok "SIGHUP, then --resume: trains on" || { bad "resume after SIGHUP"; tail -3 hup2.log; }
else
  bad "SIGHUP: no checkpoint within 120 s"; kill $p; wait $p
fi

# 2. SIGPIPE: stdout is a pipe whose reader went away (| head). The message goes to stderr.
set -o pipefail
{ "$MGT_BIN" $N --synthetic-samples 4096 --epochs 100000 --out pipe 2>pipe.err; echo $? >pipe.rc; } | head -c 1 >/dev/null
rc=$(cat pipe.rc)
status "SIGPIPE (| head -c 1)" "$rc" 141 pipe.err
grep -qE "$MSG" pipe.err && grep -q "(SIGPIPE)" pipe.err && ok "SIGPIPE: '$(grep -oE "$MSG" pipe.err)', on stderr" \
  || { bad "SIGPIPE: no checkpoint message on stderr"; tail -3 pipe.err; }
[ -s pipe/checkpoint.safetensors ] && ok "SIGPIPE: the checkpoint is there" || bad "SIGPIPE: no checkpoint"
clean pipe SIGPIPE

# 3. A second Ctrl-C stops at once, saving nothing, and the lock goes with it. Steps of 20000
# samples take long enough for the second signal to land while the first waits for its step.
"$MGT_BIN" --data synthetic --synthetic-samples 100000 --batch-size 20000 --out twice >twice.log 2>&1 &
p=$!
if wait_file twice/run.json 120; then
  sleep 0.5
  kill -INT $p; sleep 0.1; kill -INT $p; wait $p; rc=$?
  status "second SIGINT" $rc 130 twice.log
  grep -q "second Ctrl-C: stopping at once, without saving" twice.log && ok "second SIGINT: says it stops at once" \
    || { bad "second SIGINT: no message"; tail -3 twice.log; }
  clean twice "second SIGINT"
else
  bad "second SIGINT: no run.json within 120 s"; kill $p; wait $p
fi

# 4. The file-size limit (ulimit -f, 2 MB): the checkpoint cannot be written. SIGXFSZ does not kill
# the writer; it says why, removes its temporary file, and the job ends with the lock removed.
( ulimit -f 2000; exec "$MGT_BIN" $N --synthetic-samples 2048 --max-steps 5 --save-every 2 --out fsize >fsize.log 2>&1 ); rc=$?
status "ulimit -f, one rank" $rc 1 fsize.log
grep -q "checkpoint.safetensors: cannot write (File too large): this process may write files of at most 2048000 bytes (ulimit -f 2000); raise the limit" fsize.log \
  && ok "ulimit -f: the message names the limit" || { bad "ulimit -f: message"; tail -3 fsize.log; }
clean fsize "ulimit -f, one rank"
# (the limit on the ranks alone, and MPI over TCP: Open MPI's shared-memory files are larger)
OMPI_MCA_btl=self,tcp timeout 300 mpirun --oversubscribe --bind-to none -np 2 bash -c 'ulimit -f 2000 && exec "$@"' sh "$MGT_BIN" $N \
  --synthetic-samples 2048 --max-steps 5 --save-every 2 --out fsize2 >fsize2.log 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "rank 0: .*cannot write (File too large)" fsize2.log && ok "ulimit -f, two ranks: rank 0 says why, exit $rc" \
  || { bad "ulimit -f, two ranks: exit $rc"; tail -5 fsize2.log; }
clean fsize2 "ulimit -f, two ranks"

# 5. A peer that hangs: the watchdog ends the job; the lock goes too.
MGT_FAULT=1:3:sleep mpi 2 $N --synthetic-samples 2048 --out hang --comm-timeout 3 >hang.log 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "did not complete within 3 s" hang.log && ok "a hung peer: the watchdog ends the job (exit $rc)" \
  || { bad "hung peer: exit $rc"; tail -5 hang.log; }
clean hang "the watchdog"

# 6. launch/mgtrun signalled: mpirun (Open MPI's) would exit 1; mgtrun exits 143 as mgtrain does.
root=(); [ "$(id -u)" -eq 0 ] && root=(--as-root)
"$MGT_SRC/launch/mgtrun" -np 2 "${root[@]}" "$MGT_BIN" $N --save-every 20 --out mgtrun >mgtrun.log 2>&1 &
p=$!
if wait_file mgtrun/checkpoint.safetensors 120; then
  kill -TERM $p; wait $p; rc=$?
  status "SIGTERM to mgtrun" $rc 143 mgtrun.log
  grep -qE "$MSG" mgtrun.log && ok "SIGTERM to mgtrun: '$(grep -oE "$MSG" mgtrun.log)'" || { bad "mgtrun: no message"; tail -5 mgtrun.log; }
  clean mgtrun "SIGTERM to mgtrun"
else
  bad "mgtrun: no checkpoint within 120 s"; kill $p; wait $p
fi
finish
