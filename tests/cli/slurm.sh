#!/usr/bin/env bash
# labels: slurm
# timeout: 900
# launch/mgtrain.sbatch under a real Slurm on this machine: installs Debian's slurm-wlm and munge
# when missing, starts munged (unless one already answers), then slurmctld and slurmd from a
# private slurm.conf (temp folder, high ports, one node with two fake GPUs), submits the template
# and checks the job, its log and its output. Needs root. A daemon that cannot start fails the
# test with its log; nothing here skips.
source "$(dirname "$0")/lib.bash"

# Nothing from a Slurm job this test might itself run in may leak into ours.
for v in $(compgen -e | grep -E '^(SLURM|SBATCH|SRUN|SALLOC)_'); do unset "$v"; done

CTLD_PID="" SLURMD_PID="" MUNGED_PID="" JOBS=()
cleanup() {
  if [ ${#JOBS[@]} -gt 0 ] && [ -n "$CTLD_PID" ] && kill -0 "$CTLD_PID" 2>/dev/null; then
    scancel "${JOBS[@]}" 2>/dev/null
    for _ in $(seq 20); do squeue -h 2>/dev/null | grep -q . || break; sleep 0.5; done
  fi
  local p
  for p in $SLURMD_PID $CTLD_PID $MUNGED_PID; do kill "$p" 2>/dev/null; done
  for p in $SLURMD_PID $CTLD_PID $MUNGED_PID; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
die() { bad "$*"; finish; exit 1; }
show() { local f; for f in "$@"; do [ -s "$f" ] && { echo "---- $f (last 30 lines)"; tail -30 "$f"; }; done; }

[ "$(id -u)" -eq 0 ] || die "this test starts munged, slurmctld and slurmd and needs root"

# --- packages -------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
   ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  echo "installing slurm-wlm and munge"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq slurm-wlm munge >apt.log 2>&1; then
    apt-get update -qq >>apt.log 2>&1
    apt-get install -y -qq slurm-wlm munge >>apt.log 2>&1 || { tail -20 apt.log; die "apt-get install slurm-wlm munge failed"; }
  fi
fi
for c in slurmctld slurmd sbatch srun squeue sinfo scontrol munged munge unmunge; do
  command -v $c >/dev/null || die "$c is missing after installing slurm-wlm and munge"
done
ok "$(slurmd -V 2>/dev/null) and munge $(munged -V 2>/dev/null | cut -d' ' -f1 | sed 's/munge-//') are installed"

# --- munge ----------------------------------------------------------------------------------
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  ok "a munged is already running; using it"
else
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key --force
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 755 /run/munge
  rm -f /run/munge/munged.pid
  runuser -u munge -- munged >munged.out 2>&1 || { show munged.out /var/log/munge/munged.log; die "munged did not start"; }
  for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
  MUNGED_PID=$(cat /run/munge/munged.pid 2>/dev/null)
  if [ -n "$MUNGED_PID" ] && munge -n | unmunge >/dev/null 2>&1; then ok "started munged (pid $MUNGED_PID)"
  else show munged.out /var/log/munge/munged.log; die "munged started but does not answer"; fi
fi

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
mkdir -p state spool work/runs
# Two fake GPUs: character devices with /dev/null's numbers, in this folder only. They let the
# template's --gpus-per-task=1 run unchanged and show which GPUs each rank sees.
gres="" gpus=0
if mknod "$T/gpu0" c 1 3 2>/dev/null && mknod "$T/gpu1" c 1 3 2>/dev/null; then
  gpus=2 gres="Gres=gpu:2"
  echo "NodeName=$node Name=gpu File=$T/gpu[0-1]" >gres.conf
fi
cat >slurm.conf <<EOF
ClusterName=mgtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
EnforcePartLimits=ALL
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
$( [ $gpus -gt 0 ] && echo "GresTypes=gpu" )
$node_line NodeAddr=127.0.0.1 $gres State=UNKNOWN
PartitionName=mgtest Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$T/slurm.conf
echo "slurm.conf: ports $CTLD_PORT/$SLURMD_PORT, $node_line, $gpus fake GPUs"

# --- daemons --------------------------------------------------------------------------------
slurmctld -D -f "$SLURM_CONF" >slurmctld.out 2>&1 & CTLD_PID=$!
slurmd -D -f "$SLURM_CONF" >slurmd.out 2>&1 & SLURMD_PID=$!
start=$(date +%s%N) state=""
for _ in $(seq 300); do
  kill -0 $CTLD_PID 2>/dev/null || { show slurmctld.out slurmctld.log; CTLD_PID=""; die "slurmctld exited"; }
  kill -0 $SLURMD_PID 2>/dev/null || { show slurmd.out slurmd.log; SLURMD_PID=""; die "slurmd exited"; }
  state=$(sinfo -h -n "$node" -o %T 2>/dev/null)
  [ "$state" = idle ] && break
  sleep 0.1
done
if [ "$state" = idle ]; then
  ok "slurmctld (pid $CTLD_PID) and slurmd (pid $SLURMD_PID) up; node $node idle after $(( ($(date +%s%N) - start) / 1000000 )) ms"
else
  scontrol show node "$node" 2>&1 | grep -E 'State|Reason'
  show slurmctld.out slurmctld.log slurmd.out slurmd.log
  die "node $node not idle within 30 s (state: ${state:-none})"
fi
srun --mpi=list 2>&1 | grep -qw pmix && ok "srun has the PMIx plugin" || bad "srun --mpi=list has no pmix: $(srun --mpi=list 2>&1 | tr '\n' ' ')"

# --- jobs -----------------------------------------------------------------------------------
TEMPLATE=$MGT_SRC/launch/mgtrain.sbatch
if [ $gpus -eq 0 ]; then # no GPUs to ask for: the template's GPU request commented out
  sed 's/^#SBATCH --gpus/##SBATCH --gpus/' "$MGT_SRC/launch/mgtrain.sbatch" >nogpu.sbatch
  TEMPLATE=$T/nogpu.sbatch
fi
# submit NAME [sbatch options...]: submits $TEMPLATE from work/, waits (300 s at most) for
# the job to end; sets JID and JOBINFO (scontrol's one-line record).
submit() {
  local name=$1; shift
  JID=$(cd work && sbatch --parsable --job-name="$name" "$@" "$TEMPLATE" 2>../sbatch.err)
  if [ -z "$JID" ]; then cat sbatch.err; JOBINFO=""; return 1; fi
  JID=${JID%%;*}; JOBS+=("$JID")
  local t0; t0=$(date +%s)
  while :; do
    JOBINFO=$(scontrol -o show job "$JID" 2>/dev/null)
    case "$JOBINFO" in
      *JobState=COMPLETED*|*JobState=FAILED*|*JobState=CANCELLED*|*JobState=TIMEOUT*|*JobState=NODE_FAIL*|*JobState=OUT_OF_MEMORY*|*JobState=BOOT_FAIL*|*JobState=DEADLINE*|*JobState=PREEMPTED*)
        echo "job $JID ($name) ended after $(( $(date +%s) - t0 )) s"; return 0 ;;
    esac
    if [ $(( $(date +%s) - t0 )) -ge 300 ]; then
      echo "job $JID ($name) still not done after 300 s:"; squeue; scancel "$JID"; return 1
    fi
    sleep 0.5
  done
}
completed() { # completed NAME: the job ended COMPLETED with exit code 0:0
  local st ec
  st=$(grep -o 'JobState=[A-Z_]*' <<<"$JOBINFO"); ec=$(grep -o ' ExitCode=[0-9:]*' <<<"$JOBINFO")
  if [ "$st" = JobState=COMPLETED ] && [ "$ec" = " ExitCode=0:0" ]; then ok "$1: $st,$ec"
  else bad "$1: ${st:-no state},${ec:- no exit code}"; show "work/runs/slurm-$JID.out" "work/runs/slurm-$JID.err" slurmd.log; fi
}
has() { # has NAME FILE PATTERN
  if grep -qE -- "$3" "$2" 2>/dev/null; then ok "$1"; else bad "$1: no /$3/ in $2"; show "$2"; fi
}

data="--data $DATA"; [ -d "$DATA" ] || data="--data synthetic"
t0=$(date +%s)
# The template as it is, but 2 ranks of 1 core each on this one node.
export MGT_BIN MGT_ARGS="--model $MGT_SRC/examples/mlp.cfg $data --max-steps 300 --out RUN --verbose 2"
submit train --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 || bad "sbatch train"
out=work/runs/slurm-$JID.out err=work/runs/slurm-$JID.err
completed "sbatch launch/mgtrain.sbatch, 2 ranks, MLP 300 steps"
has "the template prints its srun --mpi=pmix command" "$out" '^\+ srun --mpi=pmix .*mgtrain .*--max-steps 300'
has "start-up block: world of 2 ranks" "$out" 'world: 2 ranks on 1 node'
has "start-up block: rank 1 on local rank 1" "$out" 'rank 1: .*local rank 1'
has "epoch line" "$out" '^Epoch 1/1 - [0-9]+s - loss: [0-9.]+ - acc: [0-9.]+ - val_loss'
grep -q 'ETA:' "$out" && bad "progress bar in the job's log file" || ok "no progress bar in the log file"
[ -s work/RUN/weights.safetensors ] && ok "RUN/weights.safetensors written ($(stat -c %s work/RUN/weights.safetensors) bytes)" || { bad "no RUN/weights.safetensors"; ls -la work/RUN; }
echo "---- $out:"; cat "$out"
[ -s "$err" ] && { echo "---- $err:"; cat "$err"; }
echo "training job: $(( $(date +%s) - t0 )) s from submission"

# Which GPUs each rank sees: MGT_BIN is a probe here, the template and options as above.
if [ $gpus -gt 0 ]; then
  printf '#!/bin/sh\necho "probe rank $SLURM_PROCID local $SLURM_LOCALID sees CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"\n' >probe.sh
  chmod +x probe.sh
  MGT_BIN=$T/probe.sh MGT_ARGS="" submit gpus --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 || bad "sbatch gpus"
  completed "GPU probe job (--gpus-per-task=1, 2 fake GPUs)"
  n=$(grep -c '^probe rank [01] local [01] sees CUDA_VISIBLE_DEVICES=0,1$' "work/runs/slurm-$JID.out")
  [ "$n" = 2 ] && ok "--gpus-per-task=1: both ranks see the node's 2 GPUs in order (local rank i takes GPU i)" \
    || { bad "GPU visibility per rank"; show "work/runs/slurm-$JID.out" "work/runs/slurm-$JID.err"; }
  # The template's alternative: --gpus-per-task commented out, --gpus-per-node in.
  sed 's/^#SBATCH --gpus-per-task/##SBATCH --gpus-per-task/; s/^##SBATCH --gpus-per-node=.*/#SBATCH --gpus-per-node=2/' \
    "$MGT_SRC/launch/mgtrain.sbatch" >pernode.sbatch
  grep -q '^#SBATCH --gpus-per-node=2' pernode.sbatch || bad "the template has no '##SBATCH --gpus-per-node' line"
  TEMPLATE=$T/pernode.sbatch MGT_BIN=$T/probe.sh MGT_ARGS="" submit gpus-per-node --nodes=1 \
    --ntasks-per-node=2 --cpus-per-task=1 || bad "sbatch gpus-per-node"
  completed "GPU probe job (--gpus-per-node=2)"
  n=$(grep -c '^probe rank [01] local [01] sees CUDA_VISIBLE_DEVICES=0,1$' "work/runs/slurm-$JID.out")
  [ "$n" = 2 ] && ok "--gpus-per-node=2: both ranks see the node's 2 GPUs in order" \
    || { bad "GPU visibility per rank with --gpus-per-node"; show "work/runs/slurm-$JID.out" "work/runs/slurm-$JID.err"; }
else
  echo "note: mknod failed here, so no fake GPUs: the GPU checks did not run"
fi

# The mpirun fallback inside the allocation (what the template does without srun's PMIx).
MGT_LAUNCHER=mpirun MGT_ARGS="--data synthetic --synthetic-samples 2000 --max-steps 20 --out RUN2 --verbose 2" \
  submit fallback --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 || bad "sbatch fallback"
out=work/runs/slurm-$JID.out
completed "MGT_LAUNCHER=mpirun job"
has "the fallback prints its mpirun command" "$out" '^\+ mpirun -np 2 --bind-to none --map-by slot .*mgtrain'
has "fallback: world of 2 ranks" "$out" 'world: 2 ranks on 1 node'
[ -s work/RUN2/weights.safetensors ] && ok "fallback: weights written" || bad "fallback: no RUN2/weights.safetensors"

# Outside a job the template says what to do.
expect_fail "the template outside Slurm says to submit it" "not inside a Slurm job" bash "$MGT_SRC/launch/mgtrain.sbatch"
finish
