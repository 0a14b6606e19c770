# slurm.bash: a private Slurm for the Slurm tests. Sourced after lib.bash; needs root.
#
#   slurm_setup             installs slurm-wlm and munge when missing and starts a private munged
#   slurm_cleanup           (in the EXIT trap) cancels the jobs, stops the daemons and munged
#   slurm_conf_common       the slurm.conf lines every test cluster shares (state in $T)
#   slurm_fake_gpus NODES   two fake GPUs per node (gres.conf); sets SLURM_GPUS (2, or 0 where
#                           mknod is refused) and SLURM_GRES (the node lines' Gres=)
#   slurm_daemon NAME LOG CMD...  starts a daemon (output to LOG) and watches it
#   slurm_wait_idle NODES.. waits until these nodes are idle (120 s at most)
#   slurm_submit NAME OPT.. submits $TEMPLATE from work/, waits for the job; JID, JOBINFO
#   slurm_sbatch NAME OPT.. submits it and returns (JID); slurm_wait NAME waits for it (JOBINFO)
#   slurm_completed NAME    the job ended COMPLETED with exit code 0:0
#   has NAME FILE PATTERN   the job's output has PATTERN
# Slurm's client commands run as "${SLURM_ON[@]}" sinfo ...: directly, or on the head of a
# cluster.bash cluster (SLURM_ON=(on head)), wherever slurmctld can be reached.
# A daemon that cannot start fails the test with its log; nothing here skips.

: "${T:?source lib.bash first: everything here lives in its folder}"
SLURM_ON=() SLURM_DAEMONS=() SLURM_JOBS=() MUNGED_PID="" MUNGE_SOCKET="" SLURM_WATCHER=""
SLURM_GPUS=0 SLURM_GRES=""

show() { local f; for f in "$@"; do [ -s "$f" ] && { echo "---- $f (last 30 lines)"; tail -30 "$f"; }; done; }
die() { bad "$*"; finish; exit 1; }

# slurm_job_procs: the pids of the processes of our jobs, which slurmd leaves behind when it
# stops: slurmstepd and the jobs' tasks, which all carry our SLURM_CONF (so do the grep and
# cut that look for them, which are left out, as is whatever has ended meanwhile).
slurm_job_procs() {
  local p c
  for p in $(grep -lzx "SLURM_CONF=$T/slurm.conf" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
    c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    case $c in grep | cut | "") ;; *) echo "$p" ;; esac
  done
}

slurm_cleanup() {
  [ -n "$SLURM_WATCHER" ] && kill "$SLURM_WATCHER" 2>/dev/null
  if [ ${#SLURM_JOBS[@]} -gt 0 ] && "${SLURM_ON[@]}" squeue -h >/dev/null 2>&1; then
    "${SLURM_ON[@]}" scancel "${SLURM_JOBS[@]}" 2>/dev/null
    for _ in $(seq 20); do "${SLURM_ON[@]}" squeue -h 2>/dev/null | grep . >/dev/null || break; sleep 0.5; done
  fi
  local d p left
  for d in "${SLURM_DAEMONS[@]}" $MUNGED_PID; do kill "${d%%:*}" 2>/dev/null; done
  for d in "${SLURM_DAEMONS[@]}" $MUNGED_PID; do
    p=${d%%:*}
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  # Nothing of our Slurm may outlive the test: a step daemon or a task still running would hold
  # this folder and take the cores from the next test.
  for _ in $(seq 50); do
    left=$(slurm_job_procs)
    [ -z "$left" ] && return 0
    kill -KILL $left 2>/dev/null
    sleep 0.1
  done
  echo "slurm: processes of our jobs still there after 5 s: $left"
}

slurm_setup() {
  # Nothing from a Slurm job this test might itself run in may leak into ours.
  local v
  for v in $(compgen -e | grep -E '^(SLURM|SBATCH|SRUN|SALLOC)_'); do unset "$v"; done
  [ "$(id -u)" -eq 0 ] || die "this test starts munged, slurmctld and slurmd and needs root"
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
     ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    echo "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq slurm-wlm munge >apt.log 2>&1; then
      apt-get update -qq >>apt.log 2>&1
      apt-get install -y -qq slurm-wlm munge >>apt.log 2>&1 || { tail -20 apt.log; die "apt-get install slurm-wlm munge failed"; }
    fi
  fi
  local c
  for c in slurmctld slurmd sbatch srun squeue sinfo scontrol munged munge unmunge; do
    command -v $c >/dev/null || die "$c is missing after installing slurm-wlm and munge"
  done
  ok "$(slurmd -V 2>/dev/null) and munge $(munged -V 2>/dev/null | cut -d' ' -f1 | sed 's/munge-//') are installed"

  # If this shell is killed (a test timeout) its EXIT trap does not run: this watcher then stops
  # every daemon started here (their pids in $T/daemons) and every process of our jobs (slurmd
  # leaves its slurmstepd and their tasks behind; they carry our SLURM_CONF), within a second.
  local shell=$$
  : >"$T/daemons"
  (
    while kill -0 "$shell" 2>/dev/null; do sleep 1; done
    kill -KILL $(cat "$T/daemons") $(slurm_job_procs)
  ) >/dev/null 2>&1 &
  SLURM_WATCHER=$!
  disown "$SLURM_WATCHER"

  # A munged of our own, with its own key and socket in $T: the machine's munged (if any) and
  # other tests' are left alone, and nothing here depends on them. Slurm finds it through
  # AuthInfo=socket=...; the nodes of a cluster.bash cluster reach the socket through the
  # shared folder, as every node of a real cluster shares one key.
  mkdir -p "$T/munge"
  chmod 700 "$T/munge"
  dd if=/dev/urandom of="$T/munge/key" bs=1 count=1024 status=none && chmod 400 "$T/munge/key" ||
    die "cannot write a munge key in $T/munge"
  MUNGE_SOCKET=$T/munge/munge.sock
  # -f: run as root, and with the socket in a folder only root can enter.
  munged -F -f --socket="$MUNGE_SOCKET" --key-file="$T/munge/key" --pid-file="$T/munge/munged.pid" \
    --log-file="$T/munge/munged.log" --seed-file="$T/munge/seed" >"$T/munge/munged.out" 2>&1 &
  MUNGED_PID=$!
  echo "$MUNGED_PID" >>"$T/daemons"
  for _ in $(seq 300); do [ -S "$MUNGE_SOCKET" ] && break; sleep 0.1; done
  if munge -S "$MUNGE_SOCKET" -n 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; then
    ok "started munged (pid $MUNGED_PID) on $MUNGE_SOCKET"
  else
    show "$T/munge/munged.out" "$T/munge/munged.log"
    die "munged did not start or does not answer"
  fi
}

slurm_conf_common() {
  mkdir -p "$T/state" "$T/work/runs"
  # Job ids start at a random number: Open MPI names the shared-memory segments and session
  # folders of a job's ranks by host name and Slurm job id, so two test clusters on one machine
  # that both number from 1 would have their ranks map each other's segments (and crash).
  cat <<EOF
ClusterName=mgtest
FirstJobId=$(( (RANDOM * 32768 + RANDOM) % 60000000 + 1000 ))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$T/state
SlurmctldPidFile=$T/slurmctld.pid
SlurmctldLogFile=$T/slurmctld.log
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
EOF
  [ "$SLURM_GPUS" -gt 0 ] && echo "GresTypes=gpu"
  return 0
}

slurm_fake_gpus() { # slurm_fake_gpus NODES (a Slurm node list, e.g. node[1-2])
  # Character devices with /dev/null's numbers, in this folder only. They let the template's
  # --gpus-per-task=1 run unchanged and show which GPUs each rank sees.
  if mknod "$T/gpu0" c 1 3 2>/dev/null && mknod "$T/gpu1" c 1 3 2>/dev/null; then
    SLURM_GPUS=2 SLURM_GRES="Gres=gpu:2"
    echo "NodeName=$1 Name=gpu File=$T/gpu[0-1]" >"$T/gres.conf"
  fi
}

slurm_daemon() { # slurm_daemon NAME LOG CMD...: CMD in the background, watched by slurm_wait_idle
  local name=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1 &
  SLURM_DAEMONS+=("$!:$name:$log")
  echo "$!" >>"$T/daemons"
}

# (Seconds on an idle machine; on one busy with other work slurmd can take much longer to start
# and register, so the limit is generous: it costs nothing when all goes well.)
slurm_wait_idle() { # slurm_wait_idle NODE...: all idle within 120 s, or the test fails
  local start d state="" n want=$# idle=0
  start=$(date +%s%N)
  while [ $(( ($(date +%s%N) - start) / 1000000000 )) -lt 120 ]; do
    for d in "${SLURM_DAEMONS[@]}"; do
      IFS=: read -r p n log <<<"$d"
      kill -0 "$p" 2>/dev/null || { show "$log" "$T"/*.log; die "$n exited"; }
    done
    state=$("${SLURM_ON[@]}" sinfo -h -N -n "$(IFS=,; echo "$*")" -o '%N %T' 2>/dev/null)
    idle=$(grep -c ' idle$' <<<"$state")
    [ "$idle" -eq "$want" ] && break
    sleep 0.1
  done
  if [ "$idle" -eq "$want" ]; then
    ok "$(printf '%s\n' "${SLURM_DAEMONS[@]}" | cut -d: -f2 | paste -sd' ') up; $* idle after $(( ($(date +%s%N) - start) / 1000000 )) ms"
  else
    for n in "$@"; do "${SLURM_ON[@]}" scontrol show node "$n" 2>&1 | grep -E 'NodeName|State|Reason'; done
    show "$T"/*.log "$T"/*.out
    die "nodes not idle within 120 s: ${state:-no answer from sinfo}"
  fi
  "${SLURM_ON[@]}" srun --mpi=list 2>&1 | grep -w pmix >/dev/null && ok "srun has the PMIx plugin" ||
    bad "srun --mpi=list has no pmix: $("${SLURM_ON[@]}" srun --mpi=list 2>&1 | tr '\n' ' ')"
}

# slurm_sbatch NAME [sbatch options...]: submits $TEMPLATE from work/ and returns; sets JID.
slurm_sbatch() {
  local name=$1
  shift
  JID=$(cd "$T/work" && "${SLURM_ON[@]}" sbatch --parsable --job-name="$name" "$@" "$TEMPLATE" 2>"$T/sbatch.err")
  if [ -z "$JID" ]; then cat "$T/sbatch.err"; JOBINFO=""; return 1; fi
  JID=${JID%%;*}; SLURM_JOBS+=("$JID")
}

# slurm_wait NAME: waits (300 s at most) for job $JID to end; sets JOBINFO (scontrol's one-line
# record). A requeued job (pending again) is waited for until its last start ends.
slurm_wait() {
  local name=$1 t0
  t0=$(date +%s)
  while :; do
    JOBINFO=$("${SLURM_ON[@]}" scontrol -o show job "$JID" 2>/dev/null)
    case "$JOBINFO" in
      *JobState=COMPLETED*|*JobState=FAILED*|*JobState=CANCELLED*|*JobState=TIMEOUT*|*JobState=NODE_FAIL*|*JobState=OUT_OF_MEMORY*|*JobState=BOOT_FAIL*|*JobState=DEADLINE*|*JobState=PREEMPTED*)
        echo "job $JID ($name) ended after $(( $(date +%s) - t0 )) s"; return 0 ;;
    esac
    if [ $(( $(date +%s) - t0 )) -ge 300 ]; then
      echo "job $JID ($name) still not done after 300 s:"; "${SLURM_ON[@]}" squeue; "${SLURM_ON[@]}" scancel "$JID"; return 1
    fi
    sleep 0.5
  done
}

# slurm_submit NAME [sbatch options...]: slurm_sbatch, then slurm_wait.
slurm_submit() {
  slurm_sbatch "$@" && slurm_wait "$1"
}

# slurm_startup_crash OUT ERR: whether a run's ranks died in Open MPI's start-up: a segmentation
# fault at address 0 (ERR) before mgtrain printed its start-up block (OUT). On the namespace
# cluster, Debian 12's Open MPI 4.1 under srun --mpi=pmix does this to a few starts in a hundred
# on a busy machine, before any of mgtrain's own code runs: the core files show MPI_Init waiting
# in its first PMIx fence (the modex) while an MPI message from a rank on the other node, one
# that has already left MPI_Init, reaches the TCP transport, whose handler for it is not yet set
# (a call through a null pointer). A rank can only leave MPI_Init after the fence that ends it,
# so the fences were released out of order; Slurm 22.05's PMIx plugin and PMIx 4.2 run them.
slurm_startup_crash() {
  grep -q 'Failing at address: (nil)' "$2" 2>/dev/null && ! grep -q '^  world: ' "$1" 2>/dev/null
}

# slurm_startup_retry WHAT ERR: says that WHAT is run once more after such a crash, with its
# signal lines from ERR.
slurm_startup_retry() {
  echo "note: $1: ranks died in MPI_Init (slurm.bash: slurm_startup_crash); once more:"
  grep -m 4 -E 'Signal:|Failing at|srun: error' "$2"
}

# slurm_run NAME [sbatch options...]: slurm_submit, and once more, saying so, where the job's
# ranks died in Open MPI's start-up (slurm_startup_crash); a second such death stands.
slurm_run() {
  slurm_submit "$@" || return 1
  local out=$T/work/runs/slurm-$JID.out err=$T/work/runs/slurm-$JID.err
  case "$JOBINFO" in *JobState=FAILED*) ;; *) return 0 ;; esac
  slurm_startup_crash "$out" "$err" || return 0
  slurm_startup_retry "job $JID ($1)" "$err"
  slurm_submit "$@"
}

slurm_completed() { # slurm_completed NAME: the job ended COMPLETED with exit code 0:0
  local st ec
  st=$(grep -o 'JobState=[A-Z_]*' <<<"$JOBINFO"); ec=$(grep -o ' ExitCode=[0-9:]*' <<<"$JOBINFO")
  if [ "$st" = JobState=COMPLETED ] && [ "$ec" = " ExitCode=0:0" ]; then ok "$1: $st,$ec"
  else bad "$1: ${st:-no state},${ec:- no exit code}"; show "$T/work/runs/slurm-$JID.out" "$T/work/runs/slurm-$JID.err" "$T"/slurmd*.log; fi
}

has() { # has NAME FILE PATTERN
  if grep -qE -- "$3" "$2" 2>/dev/null; then ok "$1"; else bad "$1: no /$3/ in $2"; show "$2"; fi
}
