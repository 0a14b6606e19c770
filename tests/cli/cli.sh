#!/usr/bin/env bash
# labels: cli
# Help lists every flag with its default; summary of the seed ConvNet; the small ConvNet trains;
# a batch normalisation that cannot settle in a run's steps says so.
source "$(dirname "$0")/lib.bash"
h=$("$MGT_BIN" --help)
for f in model data epochs batch-size optimizer lr seed max-steps out init-weights val-split save-every resume profile timeline verbose device comm-timeout; do
  grep -q -- "--$f.*default" <<<"$h" && : || bad "--help lacks --$f with a default"
done
ok "--help lists the train flags with defaults"
"$MGT_BIN" predict --help | grep -- "--output FILE.*default" >/dev/null && ok "predict --help" || bad "predict --help"
[ "$("$MGT_BIN" -h)" = "$h" ] && [ "$("$MGT_BIN" help)" = "$h" ] && ok "-h and mgtrain help print the help" || bad "-h"
"$MGT_BIN" eval -h | grep "^usage: mgtrain eval" >/dev/null && ok "eval -h" || bad "eval -h"
v=$("$MGT_BIN" --version); rc=$?
echo "$v"
[ $rc -eq 0 ] && grep -qx "mgtrain [0-9]*\.[0-9]*\.[0-9]*" <<<"$(head -1 <<<"$v")" && grep -q "^cpu backend: OpenBLAS [0-9]" <<<"$v" \
  && grep -qE "^gpu backend: (CUDA [0-9.]+.*, cuDNN [0-9.]+.*, NCCL [0-9.]+|not built)" <<<"$v" && grep -q "^mpi: Open MPI" <<<"$v" \
  && ok "--version: version, CPU and GPU backends, MPI" || bad "--version"
v2=$(mpi 2 --version 2>&1)
[ "$v2" = "$v" ] && ok "--version under mpirun -np 2 prints once" || { bad "--version on 2 ranks"; echo "$v2"; }
s=$("$MGT_BIN" summary --model "$MGT_SRC/examples/convnet.cfg")
echo "$s"
grep -q "Total params: 2,354,250" <<<"$s" && grep -q "Trainable params: 2,353,738" <<<"$s" && ok "ConvNet parameter count (Keras: 2,354,250)" || bad "ConvNet totals"
grep -q "conv2d_2 (conv2d) *(24, 24, 256) relu *73,984" <<<"$s" && ok "ConvNet layer row" || bad "ConvNet row"
# (--no-validation: nothing here reads the figures, and the ConvNet's passes over the 10,000
# test samples would take most of the test's time: 27 s of CPU against 2 s for the rest)
out=$(mpi 2 --model "$MGT_SRC/examples/convnet.cfg" --data synthetic --batch-size 16 --max-steps 3 --no-validation --verbose 2 --out cn --profile --timeline cn/trace.json 2>&1) || { bad "ConvNet steps"; echo "$out"; }
grep -q "world: 2 ranks on 1 node" <<<"$out" && grep -q "rank 1: .*cpu" <<<"$out" && grep -q "batch: global 16, per rank 8" <<<"$out" && ok "start-up block" || { bad "start-up block"; echo "$out"; }
grep -qE "^1 +[0-9.]+ /" <<<"$out" && ok "profile table has rank 1" || { bad "profile table"; echo "$out"; }
# A batch normalisation whose moving statistics cannot settle in the run's steps says so once
# (rank 0), with the fix; one that settles says nothing (momentum 0.9: 0.9^30 = 4% of the start
# left after 30 steps, below the notice's 5%; 0.9^20 = 12% after 20).
n=$(grep -c "^notice: batch normalisation will not settle in this run" <<<"$out")
[ "$n" = 1 ] && grep -q "momentum 0.99, an average over about the last 100 batches) will still be 97% their starting values after the run's 3 steps.*set momentum = 0.9 in the \[batchnorm\] sections.*train at least 299 steps" <<<"$out" \
  && ok "3 steps of the ConvNet (momentum 0.99): one notice, with the fix" || { bad "batchnorm notice ($n):"; grep notice <<<"$out"; }
cat >bn.cfg <<'CFG'
[input]
shape = 8,8,1
[conv2d]
filters = 4
kernel = 3
[batchnorm]
momentum = 0.9
[flatten]
[dense]
units = 10
[train]
optimizer = sgd
loss = sparse_categorical_crossentropy
batch_size = 32
CFG
bn=(--model bn.cfg --data synthetic --synthetic-samples 320 --no-validation --verbose 2)
"$MGT_BIN" "${bn[@]}" --epochs 3 --out bn30 >bn30.log 2>&1 && ! grep -q "will not settle" bn30.log \
  && ok "30 steps at momentum 0.9: no notice" || { bad "30 steps at momentum 0.9:"; cat bn30.log; }
"$MGT_BIN" "${bn[@]}" --epochs 2 --out bn20 >bn20.log 2>&1 && grep -q "will still be 12% their starting values after the run's 20 steps.*train at least 29 steps" bn20.log \
  && ok "20 steps at momentum 0.9: the notice" || { bad "20 steps at momentum 0.9:"; cat bn20.log; }
python3 -c "
import json; t=json.load(open('cn/trace.json'))['traceEvents']
spans=[e for e in t if e['ph']=='X']; assert {e['pid'] for e in spans}=={0,1}, spans[:3]
assert {e['name'] for e in spans}=={'data','forward','backward','allreduce','update'}" && ok "timeline: both ranks, all phases" || bad "timeline"
finish
