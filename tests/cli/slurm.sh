#!/usr/bin/env bash
# labels: slurm
# timeout: 900
# cores: 1
# launch/mgtrain.sbatch under a real Slurm on this machine: installs Debian's slurm-wlm and munge
# when missing, starts a private munged, then slurmctld and slurmd from a private slurm.conf
# (temp folder, high ports, one node with two fake GPUs; slurm.bash holds what this shares with
# slurm_multinode.sh; TmpFS too is in the temp folder, because the PMIx plugin names its folders
# there by job id, from 1 in every test cluster), submits the template and checks the job, its log and its output. Needs
# root. A daemon that cannot start fails the test with its log; nothing here skips.
source "$(dirname "$0")/lib.bash"
source "$MGT_SRC/tests/cli/slurm.bash"
trap 'slurm_cleanup; rm -rf "$T"' EXIT
slurm_setup

# --- slurm.conf -----------------------------------------------------------------------------
port_free() { # nothing listens on TCP port $1 (v4 or v6)
  local hex; hex=$(printf ':%04X ' "$1")
  ! grep -qi "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
for _ in $(seq 50); do
  CTLD_PORT=$(( 20000 + RANDOM % 9000 )); SLURMD_PORT=$((CTLD_PORT + 1))
  port_free $CTLD_PORT && port_free $SLURMD_PORT && break
done
node_line=$(slurmd -C 2>/dev/null | head -1)
grep -q '^NodeName=' <<<"$node_line" || die "slurmd -C gave no node line: $node_line"
node=$(sed 's/^NodeName=\([^ ]*\).*/\1/' <<<"$node_line")
mkdir -p spool jobtmp
slurm_fake_gpus "$node"
{
  slurm_conf_common
  cat <<EOF
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmdSpoolDir=$T/spool
SlurmdPidFile=$T/slurmd.pid
SlurmdLogFile=$T/slurmd.log
TmpFS=$T/jobtmp
$node_line NodeAddr=127.0.0.1 $SLURM_GRES State=UNKNOWN
PartitionName=mgtest Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
} >slurm.conf
export SLURM_CONF=$T/slurm.conf
echo "slurm.conf: ports $CTLD_PORT/$SLURMD_PORT, $node_line, $SLURM_GPUS fake GPUs"

# --- daemons --------------------------------------------------------------------------------
slurm_daemon slurmctld slurmctld.out slurmctld -D -f "$SLURM_CONF"
slurm_daemon slurmd slurmd.out slurmd -D -f "$SLURM_CONF"
slurm_wait_idle "$node"

# --- jobs -----------------------------------------------------------------------------------
TEMPLATE=$MGT_SRC/launch/mgtrain.sbatch
if [ $SLURM_GPUS -eq 0 ]; then # no GPUs to ask for: the template's GPU request commented out
  sed 's/^#SBATCH --gpus/##SBATCH --gpus/' "$MGT_SRC/launch/mgtrain.sbatch" >nogpu.sbatch
  TEMPLATE=$T/nogpu.sbatch
fi
data="--data $DATA"; [ -d "$DATA" ] || data="--data synthetic"
t0=$(date +%s)
# The template as it is, but 2 ranks of 1 core each on this one node.
export MGT_BIN MGT_ARGS="--model $MGT_SRC/examples/mlp.cfg $data --max-steps 300 --out RUN --verbose 2"
slurm_submit train --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 || bad "sbatch train"
out=work/runs/slurm-$JID.out err=work/runs/slurm-$JID.err
slurm_completed "sbatch launch/mgtrain.sbatch, 2 ranks, MLP 300 steps"
has "the template prints its srun --mpi=pmix command" "$out" '^\+ srun --mpi=pmix .*mgtrain .*--max-steps 300'
has "start-up block: world of 2 ranks" "$out" 'world: 2 ranks on 1 node'
has "start-up block: rank 1 on local rank 1" "$out" 'rank 1: .*local rank 1'
has "epoch line" "$out" '^Epoch 1/1 - [0-9]+s - loss: [0-9.]+ - acc: [0-9.]+( - top5_acc: [0-9.]+)? - val_loss'
grep -q 'ETA:' "$out" && bad "progress bar in the job's log file" || ok "no progress bar in the log file"
[ -s work/RUN/weights.safetensors ] && ok "RUN/weights.safetensors written ($(stat -c %s work/RUN/weights.safetensors) bytes)" || { bad "no RUN/weights.safetensors"; ls -la work/RUN; }
echo "---- $out:"; cat "$out"
[ -s "$err" ] && { echo "---- $err:"; cat "$err"; }
echo "training job: $(( $(date +%s) - t0 )) s from submission"

# Which GPUs each rank sees: MGT_BIN is a probe here, the template and options as above.
if [ $SLURM_GPUS -gt 0 ]; then
  printf '#!/bin/sh\necho "probe rank $SLURM_PROCID local $SLURM_LOCALID sees CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"\n' >probe.sh
  chmod +x probe.sh
  MGT_BIN=$T/probe.sh MGT_ARGS="" slurm_submit gpus --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 || bad "sbatch gpus"
  slurm_completed "GPU probe job (--gpus-per-task=1, 2 fake GPUs)"
  n=$(grep -c '^probe rank [01] local [01] sees CUDA_VISIBLE_DEVICES=0,1$' "work/runs/slurm-$JID.out")
  [ "$n" = 2 ] && ok "--gpus-per-task=1: both ranks see the node's 2 GPUs in order (local rank i takes GPU i)" \
    || { bad "GPU visibility per rank"; show "work/runs/slurm-$JID.out" "work/runs/slurm-$JID.err"; }
  # The template's alternative: --gpus-per-task commented out, --gpus-per-node in.
  sed 's/^#SBATCH --gpus-per-task/##SBATCH --gpus-per-task/; s/^##SBATCH --gpus-per-node=.*/#SBATCH --gpus-per-node=2/' \
    "$MGT_SRC/launch/mgtrain.sbatch" >pernode.sbatch
  grep -q '^#SBATCH --gpus-per-node=2' pernode.sbatch || bad "the template has no '##SBATCH --gpus-per-node' line"
  TEMPLATE=$T/pernode.sbatch MGT_BIN=$T/probe.sh MGT_ARGS="" slurm_submit gpus-per-node --nodes=1 \
    --ntasks-per-node=2 --cpus-per-task=1 || bad "sbatch gpus-per-node"
  slurm_completed "GPU probe job (--gpus-per-node=2)"
  n=$(grep -c '^probe rank [01] local [01] sees CUDA_VISIBLE_DEVICES=0,1$' "work/runs/slurm-$JID.out")
  [ "$n" = 2 ] && ok "--gpus-per-node=2: both ranks see the node's 2 GPUs in order" \
    || { bad "GPU visibility per rank with --gpus-per-node"; show "work/runs/slurm-$JID.out" "work/runs/slurm-$JID.err"; }
else
  echo "note: mknod failed here, so no fake GPUs: the GPU checks did not run"
fi

# The mpirun fallback inside the allocation (what the template does without srun's PMIx).
MGT_LAUNCHER=mpirun MGT_ARGS="--data synthetic --synthetic-samples 2000 --max-steps 20 --out RUN2 --verbose 2" \
  slurm_submit fallback --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 || bad "sbatch fallback"
out=work/runs/slurm-$JID.out
slurm_completed "MGT_LAUNCHER=mpirun job"
has "the fallback prints its mpirun command" "$out" '^\+ mpirun -np 2 --bind-to none --map-by slot .*mgtrain'
has "fallback: world of 2 ranks" "$out" 'world: 2 ranks on 1 node'
[ -s work/RUN2/weights.safetensors ] && ok "fallback: weights written" || bad "fallback: no RUN2/weights.safetensors"

# Preemption and the time limit: a job stopped mid-run is requeued, resumes from its checkpoint
# (--resume auto, added by the template) and ends with the weights of an uninterrupted run, bit
# for bit (SGD, the same 2 ranks). The time-limit warning is the template's own --signal=B:USR1,
# sent here at once to the batch shell as Slurm sends it; a preemption (or scontrol requeue)
# is SIGTERM to every process of the job, from Slurm.
P="--data synthetic --synthetic-samples 20000 --batch-size 64 --optimizer sgd --lr 0.05 --epochs 2 --save-every 40 --verbose 2"
mpirun --oversubscribe --bind-to none -np 2 "$MGT_BIN" $P --out work/REF >ref.log 2>&1 || { bad "uninterrupted run"; cat ref.log; }
job_field() { grep -o " $1=[^ ]*" <<<"$("${SLURM_ON[@]}" scontrol -o show job "$JID" 2>/dev/null)" | cut -d= -f2; }
# stop_job NAME DIR HOW: submits the job, waits for its first checkpoint (training is under
# way), runs the command HOW (with the job's id in $JID), then waits until the requeued job ends;
# checks how it went.
stop_job() {
  local name=$1 dir=$2 how=$3 out
  MGT_ARGS="$P --out $dir" slurm_sbatch "$name" --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 || { bad "sbatch $name"; return; }
  for _ in $(seq 1200); do [ -e "work/$dir/checkpoint.safetensors" ] && break; sleep 0.1; done
  [ -e "work/$dir/checkpoint.safetensors" ] || { bad "$name: no checkpoint within 120 s"; show "work/runs/slurm-$JID.out"; return; }
  local t0; t0=$(date +%s.%N)
  eval "$how" || bad "$name: $how failed"
  # The job is stopped, then pending again, with a begin time 2 minutes on (Slurm's delay for a
  # requeued job); the test moves it to now. Not at once: slurmd refuses a job credential made in
  # the second it revoked the old one (in whole seconds), and the job would fail to start.
  for _ in $(seq 600); do
    [ "$(job_field Restarts)" -ge 1 ] 2>/dev/null && [ "$(job_field JobState)" = PENDING ] && break
    sleep 0.1
  done
  [ "$(job_field Restarts)" = 1 ] && [ "$(job_field JobState)" = PENDING ] &&
    ok "$name: requeued $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the signal" ||
    bad "$name: not requeued: $("${SLURM_ON[@]}" scontrol -o show job "$JID")"
  # Nor before the first start's step daemons are gone: one may still be finishing (seconds) and
  # hold the step's PMIx socket, which the next start's step 0 would then fail to bind (srun:
  # "task launch failed"). Slurm's 2-minute delay is what covers this outside a test.
  for _ in $(seq 600); do
    pgrep -f "slurmstepd: \\[$JID\\." >/dev/null || [ -e "spool/stepd.slurm.pmix.$JID.0" ] || break
    sleep 0.1
  done
  pgrep -af "slurmstepd: \\[$JID\\." && bad "$name: the first start's step daemons still run after 60 s"
  sleep 2
  "${SLURM_ON[@]}" scontrol update JobId="$JID" StartTime=now >/dev/null 2>&1 || true
  slurm_wait "$name"
  slurm_completed "$name: the requeued job"
  out=work/runs/slurm-$JID.out
  has "$name: the first start stops at a step with a checkpoint" "$out" "interrupted at epoch [0-9]+ step [0-9]+ \\($SIG\\): checkpoint saved"
  has "$name: the second start resumes it" "$out" "resumed from $dir/checkpoint.safetensors at epoch [0-9]+, step [0-9]+"
  has "$name: and finishes" "$out" "^Trained [0-9]+ steps"
  cmp -s "work/$dir/weights.safetensors" work/REF/weights.safetensors &&
    ok "$name: the weights are the uninterrupted run's, bit for bit" || { bad "$name: weights differ from the uninterrupted run's"; show "$out"; }
  local segs
  segs=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(" ".join("%s-%s:%s" % (s["start_step"], s["end_step"], s["end"]) for s in j["segments"]))' "work/$dir/run.json")
  [[ "$segs" =~ ^0-([0-9]+):interrupted\ by\ $SIG\ ([0-9]+)-626:finished$ ]] && [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] &&
    ok "$name: run.json: $segs" || bad "$name: run.json segments: $segs"
  [ "$(python3 -c 'import json,sys; print(len(open(sys.argv[1]).readlines()))' "work/$dir/metrics.jsonl")" = 2 ] &&
    ok "$name: metrics.jsonl holds both epochs" || bad "$name: metrics.jsonl: $(cat "work/$dir/metrics.jsonl")"
}
SIG=SIGUSR1 stop_job time-limit TL '"${SLURM_ON[@]}" scancel --batch --signal=USR1 "$JID"'
has "time-limit: the template requeues the job" "work/runs/slurm-$JID.out" "stopped before the time limit with a checkpoint; requeued to resume it"
SIG=SIGTERM stop_job preempted PRE '"${SLURM_ON[@]}" scontrol requeue "$JID"'

# Ctrl-C at an interactive srun's terminal. srun takes one Ctrl-C as a request for its tasks'
# states, and two within a second as SIGINT followed at once by SIGKILL (22.05's _handle_intr and
# job_force_termination): nothing could be saved. With --disable-status (-X) one Ctrl-C reaches
# the tasks as SIGINT alone: the ranks finish the step that rank 0 makes 3 s longer
# (MGT_FAULT=0:1:slow), save it and exit 130, and so does srun (about 10 s).
mkfifo keys
line=$(printf '%q ' env MGT_FAULT=0:1:slow "${SLURM_ON[@]}" srun -X --mpi=pmix -N 1 -n 2 --cpus-per-task=1 \
  "$MGT_BIN" --data synthetic --synthetic-samples 1024 --batch-size 64 --verbose 2 --out work/INT)
env --default-signal=INT script -qfec "$line" /dev/null <keys >int.raw 2>&1 &
sp=$!
exec 3>keys
for _ in $(seq 1200); do grep -q 'MGT_FAULT: step 1 takes 3 s longer' int.raw 2>/dev/null && break; sleep 0.1; done
if grep -q 'MGT_FAULT: step 1 takes 3 s longer' int.raw; then
  printf '\003' >&3
  wait $sp
  rc=$?
  tr -d '\r' <int.raw >int.log
  [ $rc = 130 ] && ok "srun -X, Ctrl-C: exit 130" || { bad "srun -X, Ctrl-C: exit $rc"; tail -20 int.log; }
  has "srun -X, Ctrl-C: the ranks stop at the slow step" int.log "interrupted at epoch 1 step 2 \(SIGINT\): checkpoint saved"
  [ -s work/INT/checkpoint.safetensors ] && [ ! -e work/INT/mgtrain.lock ] && ok "srun -X, Ctrl-C: a checkpoint, no lock" ||
    bad "srun -X, Ctrl-C: $(ls work/INT)"
else
  bad "srun -X: the slow step never came"; tr -d '\r' <int.raw | tail -20; kill $sp
fi
exec 3>&-

# Outside a job the template says what to do.
expect_fail "the template outside Slurm says to submit it" "not inside a Slurm job" bash "$MGT_SRC/launch/mgtrain.sbatch"
finish
