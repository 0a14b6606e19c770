#!/usr/bin/env bash
# labels: cluster
# timeout: 600
# mgtrain on two nodes under Open MPI, as on a real cluster: a head and two nodes made of Linux
# namespaces on this machine (cluster.bash: each node its own network address, host name, /tmp
# and process tree, linked to the head by veth pairs on 10.213.0.0/16), mpirun on the head with a
# hostfile, 2 nodes x 2 ranks. Checks the start-up block (2 nodes, local ranks per node), that
# the ranks of different nodes really talk over TCP between the namespaces, the weights against
# 1 node x 4 ranks, GPU placement per node on the emulated CUDA stack, launch/mgtrun -H and
# --hostfile, and that killing one whole node ends the job on the other within --comm-timeout.
#
# What Open MPI needs here, and why:
#   - plm_rsh_agent=cluster-rsh: mpirun starts the other nodes' daemons (orted) through a remote
#     shell. On a cluster that is ssh; here cluster-rsh enters the node's namespaces, which is
#     what `ssh node cmd` amounts to, in milliseconds, with no sshd, keys or host keys to set up
#     and nothing that can prompt. plm_rsh_no_tree_spawn=1: the daemons must not start further
#     daemons themselves, because only the head can enter the nodes (with ssh, tree spawning
#     needs keys on every node too).
#   - Nothing for the transport. Open MPI's defaults pick TCP between nodes and shared memory
#     (vader) only within a node: ranks count as local when the same daemon started them, not
#     when they share a kernel, and each node's only interface besides lo is its 10.213 address,
#     so the daemons' and the ranks' TCP find it unaided (oob/btl_tcp_if_include are for nodes
#     with several interfaces: mgtrun --network-interface). lib.bash's btl=self,vader is for one
#     node and is lifted here. The bytes on the links prove where the all-reduce went.
#   - mpi_yield_when_idle=1: both nodes run on this machine's 2 cores, so 4 ranks share 2 cores,
#     but each node's daemon sees 2 ranks on 2 cores and lets them spin while they wait (40
#     steps took 6-13 s instead of 1 s here); Open MPI yields by itself on a node it knows to be
#     oversubscribed. Not needed on real nodes.
#   - oob_tcp_keepalive_*, which mgtrun sets: a node that vanishes without closing its
#     connections leaves mpirun waiting for its daemon for many minutes with the defaults (see
#     mgtrun). The test kills a node both ways, through mgtrun.
source "$(dirname "$0")/lib.bash"
source "$MGT_SRC/tests/cli/cluster.bash"
trap 'cluster_down; rm -rf "$T"' EXIT
die() { bad "$*"; finish; exit 1; }

cluster_up node1 node2 || die "the cluster did not start"
for n in node1 node2; do
  h=$(on "$n" hostname) a=$(on "$n" ip -o -4 addr show eth0 | awk '{print $4}')
  [ "$h" = "$n" ] && [ -n "$a" ] && ok "$n: host name $h, address $a" || bad "$n: host name '$h', address '$a'"
done
on node1 sh -c 'echo mine >/tmp/node1-only'
[ ! -e /tmp/node1-only ] && on node2 test ! -e /tmp/node1-only && on node1 test -s /tmp/node1-only \
  && ok "each node has its own /tmp" || bad "/tmp is shared between the nodes"

unset OMPI_MCA_btl
export OMPI_MCA_plm_rsh_agent=$MGT_SRC/tests/cli/cluster-rsh OMPI_MCA_plm_rsh_no_tree_spawn=1 \
  OMPI_MCA_mpi_yield_when_idle=1
data=(--data synthetic --synthetic-samples 12000)
[ -d "$DATA" ] && data=(--data "$DATA")
steps=40
args=("${data[@]}" --max-steps $steps --no-validation --verbose 2)
printf 'node1 slots=2\nnode2 slots=2\n' >hostfile
# cluster_mpirun ARGS...: mpirun on the head, bounded in time
cluster_mpirun() { on head timeout 300 mpirun --bind-to none --map-by slot "${REMOTE_X[@]}" "$@"; }

# --- 2 nodes x 2 ranks with a hostfile ------------------------------------------------------
before=$(link_bytes node2)
t0=$(date +%s%N)
cluster_mpirun -np 4 --hostfile hostfile "$MGT_BIN" "${args[@]}" --out r22 >r22.log 2>&1; rc=$?
echo "2 x 2 ranks: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
after=$(link_bytes node2)
[ $rc -eq 0 ] && ok "mpirun --hostfile, 2 nodes x 2 ranks: exit 0" || { bad "2 x 2 ranks: exit $rc"; cat r22.log; }
sed -n '1,/^  model:/p' r22.log
grep -q '^  world: 4 ranks on 2 nodes, up to 2 per node;' r22.log && ok "start-up block: 4 ranks on 2 nodes" \
  || bad "start-up block: $(grep world: r22.log)"
want=("rank 0: node1, node 0, local rank 0," "rank 1: node1, node 0, local rank 1,"
      "rank 2: node2, node 1, local rank 0," "rank 3: node2, node 1, local rank 1,")
n=0; for w in "${want[@]}"; do grep -qF "  $w" r22.log && n=$((n + 1)); done
[ $n -eq 4 ] && ok "each rank's node and local rank: node1 has ranks 0,1 and node2 ranks 2,3, local ranks 0,1 on each" \
  || bad "ranks per node: $(grep '^  rank' r22.log | tr '\n' ';')"
# Where the all-reduce went: each of the P sums node2 ends with depends on node1's gradients, so
# every step at least P floats cross node2's link each way, whatever the algorithm (TCP headers
# and the start-up broadcasts only add). Shared memory between the nodes would leave the link
# idle.
params=$(sed -n 's/^  model: \([0-9]*\) trainable parameters.*/\1/p' r22.log)
read -r rx0 tx0 <<<"$before"; read -r rx1 tx1 <<<"$after"
need=$(( steps * 4 * ${params:-0} ))
if [ "${params:-0}" -gt 0 ] && [ $((rx1 - rx0)) -ge $need ] && [ $((tx1 - tx0)) -ge $need ]; then
  ok "node2's link carried $(( (rx1 - rx0) / 1000 )) kB out and $(( (tx1 - tx0) / 1000 )) kB in, at least $steps x $params floats each way: TCP between the nodes"
else
  bad "node2's link: $((rx1 - rx0)) bytes out, $((tx1 - tx0)) in; the all-reduce needs $need each way"
fi

# --- 1 node x 4 ranks: the same program, the same sums -------------------------------------
before=$(link_bytes node2)
cluster_mpirun -np 4 --host node1:4 "$MGT_BIN" "${args[@]}" --out r14 >r14.log 2>&1; rc=$?
after=$(link_bytes node2)
[ $rc -eq 0 ] && grep -q '^  world: 4 ranks on 1 node, up to 4 per node;' r14.log \
  && ok "mpirun --host node1:4: 4 ranks on 1 node" || { bad "1 x 4 ranks: exit $rc"; cat r14.log; }
[ "$before" = "$after" ] && ok "... and node2's link stayed idle ($after)" || bad "node2's link moved: $before -> $after"
# Tolerance 0: the same 4 ranks read the same shards, and Open MPI's all-reduce algorithm depends
# on the rank count and message size only, not on the transport, so every sum is taken in the
# same order; each rank has one BLAS thread in both runs (2 cores shared by 2 or by 4 ranks).
same "weights, 2 nodes x 2 ranks against 1 node x 4 ranks" r22/weights.safetensors r14/weights.safetensors 0
grep -c '(1 BLAS thread)' r22.log r14.log | grep -v ':4$' >/dev/null && bad "BLAS threads differ from 1 per rank" \
  || ok "1 BLAS thread per rank in both runs"

# --- GPU placement per node, on emulated GPUs ----------------------------------------------
EMU=$MGT_BUILD/tests/gpu/emu/mgtrain_emu
if [ -x "$EMU" ]; then
  # Two emulated GPUs per node; --gpus 1,0 gives local rank 0 GPU 1 and local rank 1 GPU 0 on
  # EACH node. The emulated NCCL refuses two ranks on one GPU of one host, so GPU 1 of node1 and
  # GPU 1 of node2 must count as two GPUs: the host names must differ.
  emu=(env MGT_EMU_GPUS=2 OPENBLAS_NUM_THREADS=1)
  eargs=(--data synthetic --synthetic-samples 1024 --batch-size 64 --max-steps 2 --no-validation
         --verbose 2)
  on head "${emu[@]}" timeout 300 mpirun --bind-to none --map-by slot "${REMOTE_X[@]}" -x MGT_EMU_GPUS -x OPENBLAS_NUM_THREADS \
    -np 4 --hostfile hostfile "$EMU" "${eargs[@]}" --gpus 1,0 --out g22 >g22.log 2>&1; rc=$?
  n=0
  for r in "0: node1, node 0, local rank 0, GPU 1:" "1: node1, node 0, local rank 1, GPU 0:" \
           "2: node2, node 1, local rank 0, GPU 1:" "3: node2, node 1, local rank 1, GPU 0:"; do
    grep -qF "  rank $r" g22.log && n=$((n + 1))
  done
  [ $rc -eq 0 ] && [ $n -eq 4 ] && grep -q 'backend gpu, transport nccl' g22.log \
    && ok "--gpus 1,0 on 2 nodes x 2 emulated GPUs: each node's local rank 0 on its GPU 1, local rank 1 on its GPU 0, NCCL across nodes" \
    || { bad "emulated GPUs per node (exit $rc)"; cat g22.log; }
  # 3 ranks on node1 and 1 on node2: 4 GPUs in all, but node1 has only 2.
  expect_fail "3 ranks on a node with 2 GPUs: refused, naming the node" \
    "rank [0-2] on node node1: 3 ranks on this node but only 2 GPUs are visible" \
    on head "${emu[@]}" timeout 300 mpirun --bind-to none --map-by slot "${REMOTE_X[@]}" -x MGT_EMU_GPUS -np 4 \
    --host node1:3,node2:1 "$EMU" "${eargs[@]}" --out g31
else
  echo "note: $EMU is not built (no CUDA toolkit): GPU placement per node was not checked"
fi

# --- launch/mgtrun -H and --hostfile ---------------------------------------------------------
MGTRUN=$MGT_SRC/launch/mgtrun
on head timeout 300 "$MGTRUN" -H node1:2,node2:2 --as-root "$MGT_BIN" "${args[@]}" --out m22 >m22.log 2>&1; rc=$?
cmdline=$(grep '^+ mpirun' m22.log)
[ $rc -eq 0 ] && grep -q '^  world: 4 ranks on 2 nodes' m22.log && ok "mgtrun -H node1:2,node2:2: 4 ranks on 2 nodes" \
  || { bad "mgtrun -H: exit $rc"; cat m22.log; }
grep -qE '^\+ mpirun -np 4 --bind-to none --map-by slot --host node1:2\\?,node2:2 .*--mca oob_tcp_keepalive_time [0-9]+ ' <<<"$cmdline" \
  && ok "it prints: $cmdline" || bad "mgtrun -H printed: $cmdline"
same "weights, mgtrun -H against mpirun --hostfile" m22/weights.safetensors r22/weights.safetensors 0
on head timeout 300 "$MGTRUN" --hostfile hostfile --network-interface 10.213.0.0/16 --as-root "$MGT_BIN" \
  "${args[@]}" --max-steps 4 --out mh >mh.log 2>&1; rc=$?
[ $rc -eq 0 ] && grep -q '^  world: 4 ranks on 2 nodes' mh.log \
  && grep -qE '^\+ mpirun -np 4 .*--hostfile hostfile .*--mca btl_tcp_if_include 10.213.0.0/16 --mca oob_tcp_if_include 10.213.0.0/16' mh.log \
  && ok "mgtrun --hostfile --network-interface 10.213.0.0/16: 4 ranks on 2 nodes, TCP kept to that subnet" \
  || { bad "mgtrun --hostfile: exit $rc"; cat mh.log; }

# --- one whole node dies -----------------------------------------------------------------------
# kill_node_during_training LABEL [silent]: starts a long run through mgtrun, kills node2 a few
# steps in, and measures how long node1's ranks and mpirun live on. mpirun waits out
# odls_base_sigkill_timeout twice when it ends a job whose node was lost: Open MPI's own 1 s is
# set, whatever the environment says, so that what is timed is how soon the loss is seen.
tmo=12
kill_node_during_training() {
  local label=$1 how=${2:-} log=kill-${2:-plain}.log t0 t_ranks="" t_mpirun="" p
  on head timeout 120 env OMPI_MCA_odls_base_sigkill_timeout=1 "$MGTRUN" -H node1:2,node2:2 \
    --as-root "$MGT_BIN" --data synthetic --epochs 100 \
    --no-validation --verbose 2 --comm-timeout $tmo --out "kill-${how:-plain}" >"$log" 2>&1 &
  p=$!
  for _ in $(seq 300); do grep -q '^  model:' "$log" && break; sleep 0.1; done
  sleep 2 # a few steps into training
  node_has node1 mgtrain || { bad "$label: no rank running on node1 before the kill"; cat "$log"; }
  t0=$(date +%s%N)
  node_kill node2 $how || bad "$label: node2 did not die"
  for _ in $(seq 600); do
    [ -z "$t_ranks" ] && ! node_has node1 mgtrain && t_ranks=$(date +%s%N)
    [ -z "$t_mpirun" ] && ! kill -0 $p 2>/dev/null && t_mpirun=$(date +%s%N)
    [ -n "$t_ranks" ] && [ -n "$t_mpirun" ] && break
    sleep 0.1
  done
  wait $p; local rc=$?
  local ms_r=$(( (${t_ranks:-0} - t0) / 1000000 )) ms_m=$(( (${t_mpirun:-0} - t0) / 1000000 ))
  echo "$label: node1's ranks ended after $ms_r ms, mpirun after $ms_m ms (exit $rc)"
  # Margin 2 s over the timeout: the watchdog looks every 0.2 s, and mpirun waits up to 1 s
  # (odls_base_sigkill_timeout) between SIGTERM and SIGKILL for the ranks it ends.
  if [ -n "$t_ranks" ] && [ -n "$t_mpirun" ] && [ $ms_r -le $(( (tmo + 2) * 1000 )) ] &&
     [ $ms_m -le $(( (tmo + 2) * 1000 )) ] && [ $rc -ne 0 ]; then
    ok "$label: the job ended on node1 after $ms_r ms and mpirun after $ms_m ms (--comm-timeout $tmo), exit $rc"
  else
    bad "$label: ranks on node1 after ${t_ranks:+$ms_r ms}${t_ranks:-never}, mpirun after ${t_mpirun:+$ms_m ms}${t_mpirun:-never}, exit $rc"
    node_procs node1; cat "$log"
  fi
  grep -E "lost communication|did not complete within|hung up|node2" "$log" | grep -v '^+' | head -8
  grep -qE "Remote daemon: .* on node node2|Peer host: +node2" "$log" \
    && ok "$label: the message names node2" || { bad "$label: no message names node2"; cat "$log"; }
  node_start node2 || die "node2 did not start again"
}
kill_node_during_training "node2's processes killed (the kernel closes their connections)"
kill_node_during_training "node2 gone silently (its link down first, as in a power loss)" silent
finish
