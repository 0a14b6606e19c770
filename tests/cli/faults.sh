#!/usr/bin/env bash
# labels: mpi
# timeout: 600
# Failures never hang and never lose work: a rank that exits, a rank that stops (over MPI and over
# shared memory), a NaN loss.
source "$(dirname "$0")/lib.bash"
N="--data synthetic --synthetic-samples 20000 --batch-size 64 --verbose 0"
mpi 2 $N --out run --max-steps 4 --save-every 2 >pre.log 2>&1 || { bad "first run"; cat pre.log; }
sum0=$(md5sum run/checkpoint.safetensors | cut -d' ' -f1)

start=$(date +%s)
MGT_FAULT=1:5:exit mpi 2 $N --out run --save-every 2 --resume >exit.log 2>&1; rc=$?
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] && [ $took -le 30 ] && ok "rank 1 exiting at step 5: mpirun exit $rc after ${took}s" || { bad "exit fault: rc $rc after ${took}s"; cat exit.log; }
grep -q "rank 1: MGT_FAULT: exiting at step 5" exit.log && ok "the dying rank says so" || bad "no message from rank 1"
"$MGT_BIN" eval --weights run/checkpoint.safetensors --data synthetic >eval.log 2>&1 && ok "last checkpoint still loads: $(tail -1 eval.log)" || { bad "checkpoint does not load"; cat eval.log; }
ls run | grep tmp >/dev/null && bad "temporary files left: $(ls run)" || ok "no temporary files left"

start=$(date +%s)
MGT_FAULT=1:3:sleep mpi 2 $N --out stop --comm-timeout 5 >sleep.log 2>&1; rc=$?
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] && [ $took -le 30 ] && ok "rank 1 stopping: job ended, exit $rc after ${took}s" || { bad "stop fault: rc $rc after ${took}s"; cat sleep.log; }
grep -q "did not complete within 5 s" sleep.log && ok "watchdog names the stuck collective" || { bad "no watchdog message"; cat sleep.log; }

# The same over shared memory, where a waiting rank sleeps on a futex rather than inside MPI.
start=$(date +%s)
MGT_FAULT=1:3:exit mpi 2 $N --transport shm --max-steps 8 --out shm-exit >shm-exit.log 2>&1; rc=$?
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] && [ $took -le 30 ] && ok "shm: rank 1 exiting at step 3: mpirun exit $rc after ${took}s" \
  || { bad "shm exit fault: rc $rc after ${took}s"; cat shm-exit.log; }
start=$(date +%s)
MGT_FAULT=1:3:sleep mpi 2 $N --transport shm --out shm-stop --comm-timeout 5 >shm-sleep.log 2>&1; rc=$?
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] && [ $took -le 30 ] && grep -q "did not complete within 5 s" shm-sleep.log \
  && ok "shm: rank 1 stopping: the watchdog ends the job, exit $rc after ${took}s" \
  || { bad "shm stop fault: rc $rc after ${took}s"; cat shm-sleep.log; }

cp run/checkpoint.safetensors before.safetensors
sum1=$(md5sum run/checkpoint.safetensors | cut -d' ' -f1)
expect_fail "NaN loss stops training naming the step" "loss became NaN at step 5" \
  env MGT_FAULT=0:4:nan mpirun --oversubscribe -np 2 "$MGT_BIN" $N --out run --resume --save-every 2
sum2=$(md5sum run/checkpoint.safetensors | cut -d' ' -f1)
[ "$sum1" = "$sum2" ] && ok "checkpoint untouched by the NaN run" || bad "checkpoint changed"
[ -n "$sum0" ] || bad "no first checkpoint"
finish
