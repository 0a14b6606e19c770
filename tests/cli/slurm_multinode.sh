#!/usr/bin/env bash
# labels: cluster;slurm
# timeout: 900
# cores: 1
# launch/mgtrain.sbatch on a Slurm cluster of two nodes: the namespace cluster of cluster.bash
# (a head and node1, node2, each with its own address, host name, /tmp and process tree),
# slurmctld on the head, one slurmd on each node (own NodeName, address and spool; the same
# port, each in its own network), and one private munged whose socket every node reaches, as
# every node of a real cluster holds the same key (slurm.bash). `sbatch -N 2 --ntasks-per-node=2 launch/mgtrain.sbatch` trains 4 ranks on 2 nodes to
# the weights of 1 node x 4 ranks, each node's ranks see that node's GPUs, the template's mpirun
# fallback starts the second node through Slurm, and srun from the head (the interactive recipe)
# does the same.
#
# The job's environment (sbatch passes it on) lifts lib.bash's btl=self,vader, which is for one
# node, and sets mpi_yield_when_idle=1: both nodes share this machine's 2 cores, so 4 ranks must
# not spin while they wait (see multinode.sh). Nothing else: srun --mpi=pmix and Open MPI's
# defaults find TCP between the nodes.
source "$(dirname "$0")/lib.bash"
source "$MGT_SRC/tests/cli/cluster.bash"
source "$MGT_SRC/tests/cli/slurm.bash"
trap 'slurm_cleanup; cluster_down; rm -rf "$T"' EXIT
slurm_setup
cluster_up node1 node2 || die "the cluster did not start"
SLURM_ON=(on head)

# --- slurm.conf: both nodes as slurmd -C sees them ------------------------------------------
slurm_fake_gpus "node[1-2]"
mkdir -p spool.node1 spool.node2
{
  slurm_conf_common
  echo "SlurmctldHost=head(10.213.0.1)"
  echo "SlurmdSpoolDir=$T/spool.%n"
  echo "SlurmdPidFile=$T/slurmd.%n.pid"
  echo "SlurmdLogFile=$T/slurmd.%n.log"
  for n in node1 node2; do
    line=$(on "$n" slurmd -C 2>/dev/null | head -1)
    grep -q "^NodeName=$n " <<<"$line" || die "slurmd -C on $n: $line"
    echo "$line NodeAddr=${line:+10.213.${NODE_INDEX[$n]}.2} $SLURM_GRES State=UNKNOWN"
  done
  echo "PartitionName=mgtest Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP"
} >slurm.conf
export SLURM_CONF=$T/slurm.conf
grep -E '^(SlurmctldHost|NodeName)' slurm.conf

# --- daemons: slurmctld on the head, a slurmd on each node -----------------------------------
slurm_daemon slurmctld slurmctld.out on head slurmctld -D -f "$SLURM_CONF"
slurm_daemon "slurmd(node1)" slurmd.node1.out on node1 slurmd -D -f "$SLURM_CONF"
slurm_daemon "slurmd(node2)" slurmd.node2.out on node2 slurmd -D -f "$SLURM_CONF"
slurm_wait_idle node1 node2

# --- sbatch -N 2 --ntasks-per-node=2 -----------------------------------------------------------
unset OMPI_MCA_btl
export OMPI_MCA_mpi_yield_when_idle=1
TEMPLATE=$MGT_SRC/launch/mgtrain.sbatch
if [ "$SLURM_GPUS" -eq 0 ]; then # no GPUs to ask for: the template's GPU request commented out
  sed 's/^#SBATCH --gpus/##SBATCH --gpus/' "$MGT_SRC/launch/mgtrain.sbatch" >nogpu.sbatch
  TEMPLATE=$T/nogpu.sbatch
fi
data="--data synthetic --synthetic-samples 12000"; [ -d "$DATA" ] && data="--data $DATA"
run="$data --max-steps 40 --no-validation --verbose 2"
export MGT_BIN MGT_ARGS="$run --out RUN"
slurm_run train -N 2 --ntasks-per-node=2 --cpus-per-task=1 || bad "sbatch train"
out=work/runs/slurm-$JID.out
slurm_completed "sbatch -N 2 --ntasks-per-node=2 launch/mgtrain.sbatch"
cat "$out"
has "the template says 4 ranks on 2 nodes" "$out" '^mgtrain.sbatch: job [0-9]+: 4 ranks on 2 node\(s\) \(node\[1-2\]\)'
has "it starts them with srun --mpi=pmix" "$out" '^\+ srun --mpi=pmix .*mgtrain .*--max-steps 40'
has "start-up block: 4 ranks on 2 nodes" "$out" '^  world: 4 ranks on 2 nodes, up to 2 per node;'
n=0
for w in "rank 0: node1, node 0, local rank 0," "rank 1: node1, node 0, local rank 1," \
         "rank 2: node2, node 1, local rank 0," "rank 3: node2, node 1, local rank 1,"; do
  grep -qF "  $w" "$out" && n=$((n + 1))
done
[ $n -eq 4 ] && ok "ranks 0,1 on node1 and 2,3 on node2, local ranks 0,1 on each" \
  || bad "ranks per node: $(grep '^  rank' "$out" | tr '\n' ';')"
# The reference: the same 4 ranks on one node (this machine), the same sums in the same order
# (see multinode.sh), one BLAS thread per rank in both: tolerance 0.
mpi 4 $run --out "$T/ref" >ref.log 2>&1 || { bad "reference run"; cat ref.log; }
same "weights, Slurm 2 nodes x 2 ranks against 1 node x 4 ranks" work/RUN/weights.safetensors ref/weights.safetensors 0

# --- each node's GPUs go to that node's ranks ---------------------------------------------------
if [ "$SLURM_GPUS" -gt 0 ]; then
  printf '#!/bin/sh\necho "probe rank $SLURM_PROCID on $(hostname) local $SLURM_LOCALID sees CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"\n' >probe.sh
  chmod +x probe.sh
  MGT_BIN=$T/probe.sh MGT_ARGS="" slurm_submit gpus -N 2 --ntasks-per-node=2 --cpus-per-task=1 || bad "sbatch gpus"
  slurm_completed "GPU probe job on 2 nodes (--gpus-per-task=1, 2 fake GPUs per node)"
  n=0
  for w in "0 on node1 local 0" "1 on node1 local 1" "2 on node2 local 0" "3 on node2 local 1"; do
    grep -qx "probe rank $w sees CUDA_VISIBLE_DEVICES=0,1" "work/runs/slurm-$JID.out" && n=$((n + 1))
  done
  [ $n -eq 4 ] && ok "on each node both ranks see that node's 2 GPUs in order (local rank i takes GPU i)" \
    || { bad "GPU visibility per node"; show "work/runs/slurm-$JID.out" "work/runs/slurm-$JID.err"; }
else
  echo "note: mknod failed here, so no fake GPUs: the GPU checks did not run"
fi

# --- the template's mpirun fallback: Open MPI starts node2's daemon through Slurm -------------
MGT_LAUNCHER=mpirun MGT_ARGS="$run --comm-timeout 60 --out RUN2" \
  slurm_submit fallback -N 2 --ntasks-per-node=2 --cpus-per-task=1 || bad "sbatch fallback"
out=work/runs/slurm-$JID.out
slurm_completed "MGT_LAUNCHER=mpirun on 2 nodes"
has "the fallback prints its mpirun command, with keepalive within half of --comm-timeout 60" "$out" \
  '^\+ mpirun -np 4 --bind-to none --map-by slot --mca oob_tcp_keepalive_time 15 --mca oob_tcp_keepalive_intvl 5 --mca oob_tcp_keepalive_probes 3 .*mgtrain'
has "fallback: 4 ranks on 2 nodes" "$out" '^  world: 4 ranks on 2 nodes, up to 2 per node;'
has "fallback: rank 2 on node2, local rank 0" "$out" '^  rank 2: node2, node 1, local rank 0,'
same "weights, the mpirun fallback against srun" work/RUN2/weights.safetensors work/RUN/weights.safetensors 0

# --- srun from the head, as a user would start it interactively --------------------------------
srun_head() {
  (cd work && on head timeout 300 srun -N 2 --ntasks-per-node=2 --cpus-per-task=1 --mpi=pmix \
    "$MGT_BIN" $run --out RUN3) >srun.log 2>&1
}
srun_head; rc=$?
if [ $rc -ne 0 ] && slurm_startup_crash srun.log srun.log; then
  slurm_startup_retry "srun from the head" srun.log
  srun_head; rc=$?
fi
[ $rc -eq 0 ] && grep -q '^  world: 4 ranks on 2 nodes' srun.log && grep -q '^  rank 3: node2, node 1, local rank 1,' srun.log \
  && ok "srun -N 2 --ntasks-per-node=2 --mpi=pmix from the head: 4 ranks on 2 nodes" || { bad "srun from the head: exit $rc"; cat srun.log; }
same "weights, srun from the head against sbatch" work/RUN3/weights.safetensors work/RUN/weights.safetensors 0
finish
