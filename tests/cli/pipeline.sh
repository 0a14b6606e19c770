#!/usr/bin/env bash
# labels: mpi
# timeout: 1500
# The step as a pipeline (src/reducer.h) on real ranks:
#  1. the transports' requests on 2, 3 and 4 ranks (tests/unit/test_comm_requests.c: sums in
#     rank order bit for bit whatever the buckets, bounds, reduce to owners, all-gather, MPI in
#     both progress modes and shared memory);
#  2. buckets: gradients and weights with buckets of every size equal the one-shot all-reduce's
#     (--bucket-mb 0) bit for bit, on 2, 3 and 4 ranks, over MPI in both progress modes and over
#     shared memory; the timeline shows a span per bucket starting before backward ends;
#     --profile reports the exposed wait and the time in flight;
#  3. accumulation: 4 micro-batches of 64 give one SGD step's gradients and weights of a batch of
#     256, on 1 and 3 ranks, with dropout; steps, epochs, checkpoints, --max-steps and resume
#     count optimizer steps;
#  4. ZeRO-1: the same weights and checkpoint as plain data-parallel after 20 Adam steps on 2, 3
#     and 4 ranks; the optimizer state per rank printed; a checkpoint saved on 4 (or 2) ranks resumes
#     on 3, on 1 and without --zero as an uninterrupted run;
#  5. bad values of the new flags and key.
#
# Tolerances. Bucketing changes only which elements travel together, never the addends of an
# element or their order: the transport adds every element's addends in rank order whatever the
# message (src/comm.c): 0, on any number of ranks. ZeRO-1 changes the reduction's shape (to the
# owners only, no all-gather of the sums) but not its additions, and its update is the
# element-wise rule on the same values: 0. Other tolerances are beside their check.
source "$(dirname "$0")/lib.bash"
: "${MGT_BUILD:?run through ctest}"
export OMP_NUM_THREADS=1
SYN=(--data synthetic --synthetic-samples 3000 --verbose 2 --no-validation)

# ---- 1. requests --------------------------------------------------------------------------------
REQ="$MGT_BUILD/tests/test_comm_requests"
for np in 2 3 4; do
  out=$(timeout 300 mpirun --oversubscribe --bind-to none -np $np "$REQ" 2>&1)
  grep -q "on $np rank(s): [0-9]* checks passed, 0 failed" <<<"$out" && ok "requests on $np ranks" \
    || { bad "requests on $np ranks"; echo "$out" | tail -20; }
  echo "$out" | grep -E "bit for bit|bound" | sort -u
done

# ---- 2. buckets ---------------------------------------------------------------------------------
# The MLP, Adam, 12 steps. Its first two layers hand their gradients over in parts (the bias,
# then 4 and 2 row blocks of the weight: layers/dense.c), so 0.01 MiB makes a bucket of each of
# the 9 parts; 0.3 MiB makes 5 (the last two layers and the first's bias, then a block each).
for np in 2 3 4; do
  MGT_DUMP_GRADIENTS=g$np-one.safetensors mpi $np --model "$MGT_SRC/examples/mlp.cfg" "${SYN[@]}" \
    --max-steps 12 --bucket-mb 0 --out one$np >one$np.log 2>&1 || { bad "one-shot np $np"; cat one$np.log; }
  grep -q "step: one all-reduce of the gradients after backward" one$np.log && ok "--bucket-mb 0 is one all-reduce" \
    || { bad "--bucket-mb 0 line"; grep step: one$np.log; }
  for mb in 0.01 0.3 25; do
    MGT_DUMP_GRADIENTS=g$np-$mb.safetensors mpi $np --model "$MGT_SRC/examples/mlp.cfg" "${SYN[@]}" \
      --max-steps 12 --bucket-mb $mb --out b$np-$mb >b$np-$mb.log 2>&1 || { bad "buckets $mb np $np"; cat b$np-$mb.log; }
    same "np $np, --bucket-mb $mb: first step's gradients = one-shot's" g$np-$mb.safetensors g$np-one.safetensors 0
    same "np $np, --bucket-mb $mb: weights after 12 steps = one-shot's" b$np-$mb/weights.safetensors one$np/weights.safetensors 0
  done
  grep -q "step: 9 gradient buckets" b$np-0.01.log && grep -q "step: 5 gradient buckets" b$np-0.3.log \
    && ok "np $np: a bucket per part at 0.01 MiB, five at 0.3 MiB" || { bad "bucket counts"; grep step: b$np-*.log; }
  mpi $np --model "$MGT_SRC/examples/mlp.cfg" "${SYN[@]}" --max-steps 12 --bucket-mb 0.01 \
    --comm-progress thread --out t$np >t$np.log 2>&1 || { bad "progress thread np $np"; cat t$np.log; }
  same "np $np: the progress thread gives the same weights" t$np/weights.safetensors one$np/weights.safetensors 0
  # The same sums over shared memory as over MPI's messages.
  for mb in 0 0.01; do
    MGT_DUMP_GRADIENTS=gs$np-$mb.safetensors mpi $np --model "$MGT_SRC/examples/mlp.cfg" "${SYN[@]}" \
      --max-steps 12 --bucket-mb $mb --transport shm --out s$np-$mb >s$np-$mb.log 2>&1 \
      || { bad "shm transport $mb np $np"; cat s$np-$mb.log; }
    grep -q "backend cpu, transport shm" s$np-$mb.log || bad "np $np: --transport shm not taken"
    same "np $np, --transport shm, --bucket-mb $mb: gradients = MPI's" gs$np-$mb.safetensors g$np-one.safetensors 0
    same "np $np, --transport shm, --bucket-mb $mb: weights = MPI's" s$np-$mb/weights.safetensors one$np/weights.safetensors 0
  done
done
# One rank: --transport shm runs the requests anyway (to time them), with the same weights.
mpi 1 --model "$MGT_SRC/examples/mlp.cfg" "${SYN[@]}" --max-steps 12 --out s1 >s1.log 2>&1 || bad "np 1"
mpi 1 --model "$MGT_SRC/examples/mlp.cfg" "${SYN[@]}" --max-steps 12 --transport shm --profile \
  --out s1s >s1s.log 2>&1 || { bad "np 1, --transport shm"; cat s1s.log; }
grep -q "backend cpu, transport shm" s1s.log && grep -q "in flight" s1s.log \
  && ok "one rank, --transport shm: the requests run and are profiled" || { bad "np 1 shm"; tail s1s.log; }
same "one rank, --transport shm: weights = without" s1s/weights.safetensors s1/weights.safetensors 0

# The timeline: one span per bucket and step, on each rank's second row; the first bucket (the
# last layer's) starts before backward ends. The profile names the exposed wait and the time in
# flight.
mpi 2 --model "$MGT_SRC/examples/mlp.cfg" "${SYN[@]}" --max-steps 8 --bucket-mb 0.01 --profile \
  --timeline tl.json --out tl >tl.log 2>&1 || { bad "timeline run"; cat tl.log; }
python3 - tl.json <<'PY' && ok "timeline: a span per bucket, the first inside backward; CPU time per phase" || bad "timeline buckets"
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
for rank in (0, 1):
    for step in range(8):
        b = [e for e in ev if e["pid"] == rank and e["tid"] == 1 and e["args"]["step"] == step]
        back = [e for e in ev if e["pid"] == rank and e["tid"] == 0 and e["args"]["step"] == step
                and e["name"] == "backward"]
        assert sorted(e["args"]["bucket"] for e in b) == list(range(9)), (rank, step, b)
        assert len(back) == 1
        first = min(b, key=lambda e: e["args"]["bucket"])
        assert first["ts"] < back[0]["ts"] + back[0]["dur"], (first, back)
        assert all(e["name"] == "allreduce" and e["args"]["bytes"] > 0 for e in b)
    # each phase carries the CPU time the rank's process spent in it: not negative, and the
    # forward and backward of a step, which compute on this rank's lanes, used some
    ph = [e for e in ev if e["pid"] == rank and e["tid"] == 0]
    assert ph and all(e["args"]["cpu_ms"] >= 0 for e in ph), ph[:3]
    assert sum(e["args"]["cpu_ms"] for e in ph if e["name"] in ("forward", "backward")) > 0
PY
grep -q "^allreduce = waiting after backward; in flight (hidden + waited for): rank 0 [0-9.]* ms ([0-9-]*% hidden), rank 1" tl.log \
  && ok "--profile: the wait and the time in flight" || { bad "profile line"; grep -A4 Profile tl.log; }
# The wait split at the hand-over of the last gradients; both parts add up to the table's
# allreduce column (to its printed rounding) and are recomputed here from the timeline.
python3 - tl.log tl.json <<'PY' && ok "--profile: the wait split into a slower rank's backward and the exposed communication" \
  || { bad "profile split"; grep -A5 Profile tl.log; }
import json, re, sys
log = open(sys.argv[1]).read()
m = re.search(r"^allreduce = waiting for a slower rank's backward \+ exposed communication "
              r"\(after every rank handed over its gradients\): (.*)$", log, re.M)
parts = re.findall(r"rank (\d) ([0-9.]+) \+ ([0-9.]+) ms", m.group(1))
table = {int(r): float(w) for r, w in re.findall(r"^(\d) +(?:[0-9.]+ / *[0-9.]+ +){3}([0-9.]+) /", log, re.M)}
assert len(parts) == 2 and len(table) == 2, (parts, table)
for r, a, b in parts:
    assert abs(float(a) + float(b) - table[int(r)]) <= 0.0015, (r, a, b, table)
ev = [e for e in json.load(open(sys.argv[2]))["traceEvents"] if e["ph"] == "X"]
steps = sorted({e["args"]["step"] for e in ev})
steps = steps[5:] if len(steps) > 20 else steps  # the profile's warm-up steps left out
for r, a, b in parts:
    x = 0.0
    for s in steps:
        h = max(e["ts"] for e in ev if e["tid"] == 1 and e["args"]["step"] == s
                and e["name"] != "all-gather")
        for e in ev:
            if e["pid"] == int(r) and e["tid"] == 0 and e["name"] == "allreduce" and e["args"]["step"] == s:
                x += max(0.0, e["ts"] + e["dur"] - max(e["ts"], h))
    assert abs(x / len(steps) / 1e3 - float(b)) <= 0.002, (r, x / len(steps) / 1e3, b)
PY

# ---- 3. accumulation ----------------------------------------------------------------------------
# An MLP with dropout: the same samples must meet the same masks for the two to agree.
cp "$MGT_SRC/tests/cli/accum.cfg" drop.cfg
for np in 1 3; do
  MGT_DUMP_GRADIENTS=k4-$np.safetensors mpi $np --model drop.cfg "${SYN[@]}" --max-steps 1 \
    --accum-steps 4 --out k4-$np >k4-$np.log 2>&1 || { bad "K=4 np $np"; cat k4-$np.log; }
  MGT_DUMP_GRADIENTS=k1-$np.safetensors mpi $np --model drop.cfg "${SYN[@]}" --max-steps 1 \
    --batch-size 256 --out k1-$np >k1-$np.log 2>&1 || { bad "K=1 np $np"; cat k1-$np.log; }
  # Each gradient element sums the same 256 per-sample terms t_i, once as 4 partial sums of 64
  # added up, once as one sum; both are within g(256) sum|t_i| of the exact sum (Higham (4.4),
  # g(n) = n u / (1 - n u) = 1.5e-5), so they differ by at most 3.1e-5 sum|t_i|. Relative to the
  # tensor's largest gradient (mgt_compare's measure) that is 3.1e-5 times sum|t_i| / max|G|,
  # which cancellation makes larger than 1: 1e-4 allows a ratio of 3. The weights after one step
  # move by lr / 256 times that, next to weights of about 0.1 (biases start at 0: their
  # difference is their gradient's).
  same "np $np: K=4 x 64 gradients = K=1 x 256" k4-$np.safetensors k1-$np.safetensors 1e-4
  same "np $np: K=4 x 64 weights after one SGD step = K=1 x 256" k4-$np/weights.safetensors k1-$np/weights.safetensors 1e-4
done
grep -q "4 micro-batches of 64 per optimizer step (256 samples)" k4-3.log && ok "start-up block names the accumulation" \
  || { bad "accumulation line"; grep step: k4-3.log; }
# The same masks matter: with the dropout keys of the micro-batch positions instead (another
# seed would do), the gradients would differ far beyond the bound; shown by a different seed.
MGT_DUMP_GRADIENTS=k4-seed.safetensors mpi 1 --model drop.cfg "${SYN[@]}" --max-steps 1 \
  --accum-steps 4 --seed 43 --out k4-seed >/dev/null 2>&1
"$MGT_COMPARE" k4-seed.safetensors k1-1.safetensors 1e-2 >/dev/null && bad "another seed gives other gradients" \
  || ok "another seed's gradients differ (the comparison can fail)"
# [train] accum_steps in the model file = --accum-steps.
sed 's/^batch_size = 64/batch_size = 64\naccum_steps = 4/' drop.cfg >drop4.cfg
mpi 1 --model drop4.cfg "${SYN[@]}" --max-steps 1 --out k4-key >/dev/null 2>&1
same "[train] accum_steps = 4 is --accum-steps 4" k4-key/weights.safetensors k4-1/weights.safetensors 0

# Bookkeeping in optimizer steps: 3000 samples, micro-batch 64, K=2: 24 steps an epoch.
mpi 2 --model drop.cfg "${SYN[@]}" --epochs 2 --accum-steps 2 --save-every 7 --out acc >acc.log 2>&1 \
  || { bad "accumulation run"; cat acc.log; }
python3 -c "
import json; r=[json.loads(l) for l in open('acc/metrics.jsonl')]
assert [x['step'] for x in r] == [24, 48], r" && ok "two epochs of 24 optimizer steps (3000 / 128)" \
  || { bad "epoch steps"; cat acc/metrics.jsonl; }
grep -q "Trained 48 steps" acc.log && ok "48 steps trained" || { bad "trained line"; tail -2 acc.log; }
mpi 2 --model drop.cfg "${SYN[@]}" --epochs 2 --accum-steps 2 --max-steps 31 --out acc-split >/dev/null 2>&1
python3 -c "
import struct, json
with open('acc-split/checkpoint.safetensors', 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]; m = json.loads(f.read(n))['__metadata__']
assert (m['step'], m['epoch'], m['step_in_epoch'], m['global_batch']) == ('31', '1', '7', '128'), m" \
  && ok "--max-steps 31: checkpoint at optimizer step 31 (epoch 2, step 7), 128 samples a step" \
  || bad "checkpoint position"
mpi 3 --model drop.cfg "${SYN[@]}" --epochs 2 --accum-steps 2 --resume --out acc-split >accr.log 2>&1 \
  || { bad "accumulation resume"; cat accr.log; }
# Resumed on 3 ranks: the remaining 17 steps sum their gradients over 3 ranks instead of 2, a
# rounding difference of a few units of 2^-24 per step (~1e-7 of the updates), which the tanh
# model carries without amplifying: 1e-5, as tests/cli/resume.sh allows the same change of rank
# count.
same "accumulation: 2 ranks to step 31, resumed on 3 = uninterrupted" acc-split/weights.safetensors acc/weights.safetensors 1e-5
# A checkpoint of K=2 x 64 resumes as it was: another split of the step, K=1 x 128, is refused
# (the batch and the accumulation are the run's, resume.h).
out=$(mpi 1 --model drop.cfg "${SYN[@]}" --epochs 2 --batch-size 128 --accum-steps 1 --resume --out acc-split 2>&1)
grep -q "batch-size 128 (the run: 64); --accum-steps 1 (the run: 2)" <<<"$out" \
  && ok "resume with another split of the step is refused" || { bad "resume batch check"; echo "$out" | tail -3; }

# ---- 4. ZeRO-1 ----------------------------------------------------------------------------------
for np in 2 3 4; do
  mpi $np --model "$MGT_SRC/examples/mlp.cfg" "${SYN[@]}" --max-steps 20 --out plain$np >plain$np.log 2>&1 \
    || { bad "plain np $np"; cat plain$np.log; }
  mpi $np --model "$MGT_SRC/examples/mlp.cfg" "${SYN[@]}" --max-steps 20 --zero 1 --out zero$np >zero$np.log 2>&1 \
    || { bad "zero np $np"; cat zero$np.log; }
  same "np $np: ZeRO-1 weights after 20 Adam steps = plain" zero$np/weights.safetensors plain$np/weights.safetensors 0
  same "np $np: ZeRO-1 checkpoint (whole optimizer state) = plain's" zero$np/checkpoint.safetensors plain$np/checkpoint.safetensors 0
done
# Adam's m and v for 269,322 parameters: 2.05 MiB, a third on each of 3 ranks.
grep -q "optimizer state 0.68 MiB per rank (ZeRO-1: its slice of 2.05 MiB)" zero3.log \
  && ok "ZeRO-1 prints the optimizer state per rank" || { bad "state line"; grep step: zero3.log; }
mpi 3 --model "$MGT_SRC/examples/mlp.cfg" "${SYN[@]}" --max-steps 20 --zero 1 --bucket-mb 0.01 \
  --comm-progress thread --out zero3t >/dev/null 2>&1
same "np 3: ZeRO-1, a bucket per layer, progress thread = plain" zero3t/weights.safetensors plain3/weights.safetensors 0
for np in 2 3; do
  mpi $np --model "$MGT_SRC/examples/mlp.cfg" "${SYN[@]}" --max-steps 20 --zero 1 --bucket-mb 0.01 \
    --transport shm --out zero${np}s >/dev/null 2>&1
  same "np $np: ZeRO-1 over shared memory = plain over MPI" zero${np}s/weights.safetensors plain$np/weights.safetensors 0
done

# Save with --zero 1 on 4 ranks, resume on 3 with it, on 1 and on 2 without it: each equals the
# uninterrupted run. SGD with momentum (state to carry). The resumed steps sum over another
# number of ranks: 1e-5, as above, with the MLP's ReLUs made tanh for the same reason.
sed -e 's/activation = relu/activation = tanh/' -e 's/^optimizer = adam/optimizer = sgd\nmomentum = 0.9/' \
  -e 's/^learning_rate = .*/learning_rate = 0.01/' "$MGT_SRC/examples/mlp.cfg" >tanh.cfg
grep -q "activation = tanh" tanh.cfg && grep -q "^momentum = 0.9" tanh.cfg \
  || bad "could not make the tanh MLP with momentum from examples/mlp.cfg"
Z=(--model tanh.cfg "${SYN[@]}" --epochs 1)
mpi 2 "${Z[@]}" --max-steps 20 --out zs >/dev/null 2>&1 || bad "uninterrupted SGD"
for to in "3 --zero 1" "1" "2"; do
  d=zr-${to// /}
  np=${to%% *}
  extra=(${to#"$np"})
  mpi 4 "${Z[@]}" --max-steps 10 --zero 1 --out $d >$d-a.log 2>&1 || { bad "save on 4"; cat $d-a.log; }
  mpi $np "${Z[@]}" --max-steps 20 "${extra[@]}" --resume --out $d >$d-b.log 2>&1 \
    || { bad "resume on ${to}"; cat $d-b.log; }
  same "saved with --zero 1 on 4 ranks, resumed on $to: = uninterrupted" $d/weights.safetensors zs/weights.safetensors 1e-5
done
mpi 2 "${Z[@]}" --max-steps 10 --zero 1 --out z2 >/dev/null 2>&1
mpi 3 "${Z[@]}" --max-steps 20 --zero 1 --resume --out z2 >/dev/null 2>&1
same "saved with --zero 1 on 2 ranks, resumed on 3 = uninterrupted (SGD, 1e-5)" z2/weights.safetensors zs/weights.safetensors 1e-5

# ---- 5. bad values ------------------------------------------------------------------------------
expect_fail "--zero 2" "--zero 2: use 1" "$MGT_BIN" --zero 2
expect_fail "--accum-steps 0" "accum-steps 0: expected a whole number from 1" "$MGT_BIN" --accum-steps 0
expect_fail "--bucket-mb -1" "--bucket-mb -1: expected a number from 0" "$MGT_BIN" --bucket-mb -1
expect_fail "--comm-progress x" "--comm-progress x: use test or thread" "$MGT_BIN" --comm-progress x
expect_fail "--transport x" "--transport x: unknown; use auto, nccl, mpi or shm" "$MGT_BIN" --transport x
expect_fail "--transport shm without a launcher" "--transport shm needs MPI: start the job with mpirun" \
  "$MGT_BIN" --transport shm --data synthetic --out noshm
printf '[input]\nshape = 4,4,1\n[flatten]\n[dense]\nunits = 2\n[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\nbatch_size = 4\naccum_steps = two\n' >bad.cfg
expect_fail "accum_steps = two" "bad.cfg:.*accum_steps = two: expected a whole number" "$MGT_BIN" --model bad.cfg
finish
