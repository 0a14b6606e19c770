#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# Stop signals: SIGTERM, SIGUSR1 or SIGINT on any rank (or on mpirun) make every rank finish its
# step, save a checkpoint at that step, say where it stopped and exit 128 + the signal's number;
# the resumed run ends with the weights of an uninterrupted one, bit for bit (same rank count). A
# second Ctrl-C stops at once. Ctrl-C on the terminal of mpirun or launch/mgtrun waits for a step
# of any length. Also measures the time from SIGTERM to the end of the job.
source "$(dirname "$0")/lib.bash"
N="--data synthetic --synthetic-samples 20000 --batch-size 64 --optimizer sgd --lr 0.05 --epochs 2"
MSG='interrupted at epoch [0-9]+ step [0-9]+ \(SIG[A-Z0-9]+\): checkpoint saved; resume with --resume'
MPIRUN=(mpirun --oversubscribe --bind-to none)

wait_file() { # wait_file FILE SECONDS: FILE exists within SECONDS
  local i
  for i in $(seq $(($2 * 10))); do [ -e "$1" ] && return 0; sleep 0.1; done
  return 1
}
meta() { # meta FILE KEY: a metadata value of a safetensors file
  python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; print(json.loads(f.read(n))["__metadata__"][sys.argv[2]])' "$1" "$2"
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
wait_grep() { # wait_grep FILE PATTERN SECONDS: FILE has PATTERN within SECONDS
  local i
  for i in $(seq $(($3 * 10))); do grep -qE -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
# check_stop NAME LOG RC WANT_RC DIR SIGNAL: the exit status (WANT_RC "-": not checked), the
# message, and a checkpoint at the step the message names.
check_stop() {
  local name=$1 log=$2 rc=$3 want=$4 dir=$5 sig=$6 line step
  if [ "$want" != - ]; then
    [ "$rc" -eq "$want" ] && ok "$name: exit $rc" || { bad "$name: exit $rc, wanted $want"; cat "$log"; }
  fi
  line=$(grep -oE "$MSG" "$log" | head -1)
  if [ -n "$line" ] && grep -q "($sig)" <<<"$line"; then ok "$name: '$line'"
  else bad "$name: no '$MSG' naming $sig"; cat "$log"; return; fi
  step=$(sed -E 's/.* step ([0-9]+) .*/\1/' <<<"$line")
  [ "$(meta "$dir/checkpoint.safetensors" step 2>/dev/null)" = "$step" ] &&
    ok "$name: the checkpoint is at step $step" ||
    bad "$name: checkpoint at step $(meta "$dir/checkpoint.safetensors" step 2>&1), message says $step"
  ls "$dir" | grep '\.tmp\.' >/dev/null && bad "$name: temporary files left: $(ls "$dir")" || true
}

# start DIR ARGS...: 2 ranks of mgtrain ARGS --out DIR in the background (pid MP, output in
# DIR.log); returns once DIR has its first checkpoint (within 300 s), so training is under way.
start() {
  local dir=$1
  shift
  "${MPIRUN[@]}" -np 2 "$MGT_BIN" "$@" --out "$dir" >"$dir.log" 2>&1 &
  MP=$!
  wait_file "$dir/checkpoint.safetensors" 300 && return 0
  bad "$dir: no checkpoint within 300 s"; cat "$dir.log"; kill $MP; wait $MP
  return 1
}
rank_pid() { # rank_pid R: the pid of rank R of $MP
  local p
  for p in $(pgrep -P $MP); do
    grep -qx "OMPI_COMM_WORLD_RANK=$1" <(tr '\0' '\n' </proc/$p/environ) && echo $p
  done
}
# stop NAME DIR WANT_RC SIGNAL_SEEN KILL_ARGS...: sends the signal (kill KILL_ARGS), then checks
# the stop (check_stop) and says how long the ranks took to save and say it, and mpirun to end.
stop() {
  local name=$1 dir=$2 want=$3 sig=$4 t0 saved rc
  shift 4
  t0=$(now)
  kill "$@"
  wait_grep "$dir.log" "$MSG" 60
  saved=$(since "$t0")
  wait $MP
  rc=$?
  check_stop "$name" "$dir.log" $rc "$want" "$dir" "$sig"
  ok "$name: from the signal to the checkpoint saved and said $saved s, to the end of mpirun $(since "$t0") s"
}

# The reference: 2 ranks, 2 epochs, uninterrupted.
mpi 2 $N --verbose 0 --out straight >straight.log 2>&1 || { bad "uninterrupted run"; cat straight.log; }

# 1. SIGTERM to every rank, as Slurm sends it (not through mpirun): all stop at one step.
if start term $N --verbose 2 --save-every 40; then
  stop "MLP, SIGTERM to both ranks" term 143 SIGTERM -TERM $(rank_pid 0) $(rank_pid 1)
  mpi 2 $N --verbose 2 --out term --resume >term2.log 2>&1 || { bad "resume after SIGTERM"; cat term2.log; }
  same "SIGTERM, then --resume: the uninterrupted run's weights" straight/weights.safetensors term/weights.safetensors 0
fi

# 2. SIGTERM to rank 1 alone: rank 0 learns of it through the all-reduce and stops at the same
# step, and says which signal.
if start one $N --verbose 2 --save-every 40; then
  stop "SIGTERM to rank 1 only" one 143 SIGTERM -TERM $(rank_pid 1)
  mpi 2 $N --verbose 0 --out one --resume >one2.log 2>&1 || { bad "resume after rank 1's SIGTERM"; cat one2.log; }
  same "rank 1's SIGTERM, then --resume: the uninterrupted run's weights" straight/weights.safetensors one/weights.safetensors 0
fi

# 3. SIGUSR1 to mpirun, which forwards it to every rank as it is (Slurm's --signal=B:USR1 in
# launch/mgtrain.sbatch, passed on by the script).
start usr1 $N --verbose 2 --save-every 40 && stop "SIGUSR1 to mpirun" usr1 138 SIGUSR1 -USR1 $MP

# 4. SIGTERM or Ctrl-C to mpirun: Open MPI sends the ranks SIGTERM and kills them 1 s later
# (odls_base_sigkill_timeout), and exits 1 itself, whatever the ranks' status; an MLP step and
# its checkpoint fit in that second.
start mpint $N --epochs 20 --verbose 2 --save-every 40 && stop "SIGINT to mpirun (SIGTERM to the ranks)" mpint - SIGTERM -INT $MP

# 5. Ctrl-C on a terminal: one process on a pseudo-terminal (script), ^C typed into it. The bar's
# line is ended before the message. The terminal itself echoes "^C" where the cursor is: after
# the bar, or, where the ^C lands in the instant between two epochs' bars (the line already
# ended), at the start of the message's line, as it does before any program's words.
mkfifo keys
script -qfec "$MGT_BIN $N --save-every 40 --out tty" /dev/null <keys >tty.log 2>&1 &
sp=$!
exec 3>keys
if wait_file tty/checkpoint.safetensors 120; then
  sleep 0.3
  printf '\003' >&3
  wait $sp
  rc=$?
  tr -d '\r' <tty.log >tty.txt
  check_stop "Ctrl-C on a terminal" tty.txt $rc 130 tty SIGINT
  grep -qE "^(\^C)?$MSG" tty.txt && ok "Ctrl-C: the message starts its own line, after the bar's" ||
    { bad "Ctrl-C: the message shares the bar's line"; cat -A tty.log | tail -3; }
  grep -qE '[0-9]+/313 \[' tty.txt && ok "Ctrl-C: the bar was drawn before" || bad "Ctrl-C: no bar"
  "$MGT_BIN" $N --verbose 0 --out tty --resume >tty2.log 2>&1 && ok "Ctrl-C, then --resume: trains on" ||
    { bad "resume after Ctrl-C"; cat tty2.log; }
else
  bad "no checkpoint within 120 s"; cat tty.log; kill $sp
fi
exec 3>&-

# 6. A second Ctrl-C while the first waits for its step stops at once, saving nothing. Steps of
# 20000 samples take long enough for the second ^C to land in the one after the first bar.
script -qfec "$MGT_BIN --data synthetic --synthetic-samples 100000 --batch-size 20000 --out twice" /dev/null <keys >twice.log 2>&1 &
sp=$!
exec 3>keys
if wait_grep twice.log '1/5 \[' 120; then
  printf '\003' >&3
  sleep 0.05
  printf '\003' >&3
  wait $sp
  rc=$?
  [ $rc -eq 130 ] && ok "second Ctrl-C: exit 130" || { bad "second Ctrl-C: exit $rc"; cat twice.log; }
  grep -q "second Ctrl-C: stopping at once, without saving" twice.log && ok "second Ctrl-C: says it stops at once" ||
    { bad "second Ctrl-C: no message"; cat twice.log; }
  [ ! -e twice/checkpoint.safetensors ] && ok "second Ctrl-C: no checkpoint was written" ||
    bad "second Ctrl-C: a checkpoint was written"
else
  bad "no progress bar within 120 s"; cat twice.log; kill $sp
fi
exec 3>&-

# 7. The seed ConvNet, 2 ranks: SIGTERM to the ranks mid-epoch; how long until the job has ended.
start conv --model "$MGT_SRC/examples/convnet.cfg" --data synthetic --synthetic-samples 1280 \
  --save-every 2 --verbose 2 &&
  stop "ConvNet, SIGTERM to both ranks" conv 143 SIGTERM -TERM $(rank_pid 0) $(rank_pid 1)
# 8. Ctrl-C on the terminal of `mpirun -np 2` and of `launch/mgtrun -np 2`, during the seed
# ConvNet's first epoch, in a step that rank 0 makes 3 s longer (MGT_FAULT=0:1:slow): longer than
# Open MPI's own end of a job (SIGCONT, SIGTERM 1 s later, SIGKILL 1 s after that), which a Ctrl-C
# reaching mpirun starts. Under mpirun the ranks hold the terminal (runtime.h); mgtrun passes the
# Ctrl-C on to them. Either way: the step ends, a checkpoint at it, no lock, exit 130, and
# --resume ends with the uninterrupted run's weights, bit for bit (--reproducible; its batchnorm
# synchronised, as --reproducible asks). 12x12 inputs, 4 steps of 32: about 15 s in all.
# (env --default-signal: a test's commands may start with SIGINT ignored, as a background job's
# are, and a shell script such as mgtrun cannot then catch it; a terminal's shell does not.)
sed 's/^\[batchnorm\]$/[batchnorm]\nsync = true/' "$MGT_SRC/examples/convnet.cfg" >conv.cfg
grep -q '^sync = true' conv.cfg || bad "no [batchnorm] section in examples/convnet.cfg"
C=(--model conv.cfg --input-shape 12,12,1 --data synthetic --synthetic-samples 128 --batch-size 32
   --epochs 1 --reproducible --no-validation --verbose 2)
mpi 2 "${C[@]}" --out conv-ref >conv-ref.log 2>&1 || { bad "the uninterrupted ConvNet"; cat conv-ref.log; }
root=(); [ "$(id -u)" -eq 0 ] && root=(--as-root)
# ctrl_c_tty NAME DIR CMD...: CMD ARGS C --out DIR on a pseudo-terminal, ^C typed in the slow step.
ctrl_c_tty() {
  local name=$1 dir=$2 line rc
  shift 2
  line=$(printf '%q ' env MGT_FAULT=0:1:slow "$@" "${C[@]}" --out "$dir")
  env --default-signal=INT script -qfec "$line" /dev/null <keys >"$dir.raw" 2>&1 &
  sp=$!
  exec 3>keys
  if wait_grep "$dir.raw" 'MGT_FAULT: step 1 takes 3 s longer' 120; then
    printf '\003' >&3
    wait $sp
    rc=$?
    tr -d '\r' <"$dir.raw" >"$dir.log"
    check_stop "$name" "$dir.log" $rc 130 "$dir" SIGINT
    [ ! -e "$dir/mgtrain.lock" ] && ok "$name: no lock left" || bad "$name: $dir/mgtrain.lock left"
    mpi 2 "${C[@]}" --verbose 0 --out "$dir" --resume >"$dir.resume.log" 2>&1 ||
      { bad "$name: --resume"; cat "$dir.resume.log"; }
    same "$name, then --resume: the uninterrupted run's weights" conv-ref/weights.safetensors "$dir/weights.safetensors" 0
  else
    bad "$name: the slow step never came"; tr -d '\r' <"$dir.raw"; kill $sp
  fi
  exec 3>&-
}
ctrl_c_tty "ConvNet, Ctrl-C on mpirun -np 2's terminal" conv-mpirun "${MPIRUN[@]}" -np 2 "$MGT_BIN"
ctrl_c_tty "ConvNet, Ctrl-C on launch/mgtrun -np 2's terminal" conv-mgtrun "$MGT_SRC/launch/mgtrun" -np 2 "${root[@]}" "$MGT_BIN"

finish
