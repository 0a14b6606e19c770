#!/usr/bin/env bash
# The GPU path's speed machinery on emulated GPUs (MGT_BIN = mgtrain_emu, see emu.h), on a small
# graph (two convolutions, one padded explicitly and one strided, batch norm, global pooling):
#   1. --profile-layers: a row per layer and direction with the cuDNN algorithms, the gaps
#      between layers, the data phase's host and device parts;
#   2. CUDA graphs: forward and backward captured after two eager micro-batches and replayed
#      (the emulator counts the graph launches) train the same bytes as --cuda-graph off; a
#      capture that fails (MGT_EMU_CAPTURE=invalidate) is said once and the run goes on eagerly
#      to the same bytes; so does one that a library invalidates from inside, as a real one
#      does: a query, a synchronisation or an allocation by cuDNN or cuBLAS during the capture
#      (MGT_EMU_CAPTURE=LIB-CALL), after which every call on the stream fails until the capture
#      ends (emu_runtime.cpp); dropout, two ranks and --profile-layers keep replay off, saying
#      why;
#   3. cuDNN algorithms by measurement (the emulator's cudnnFind*AlgorithmEx and its timing
#      model): "measured" in the log; made to time NCHW faster (MGT_EMU_CUDNN_FASTEST=nchw), a
#      plain FP32 run takes NCHW and trains what NHWC trains to rounding (the bias added after
#      the layout's copy back: one more rounding of each output); --tf32 never takes NCHW;
#      --reproducible keeps cuDNN's heuristics and their bytes; a short last batch and a second
#      rank on the same GPU measure nothing again;
#   4. --algo-cache: written by a run that measured, taken by the next (nothing measured, the
#      file unchanged, the same bytes), a damaged file refused before anything is made, and
#      another GPU's entries kept when the file is written again.
source "$MGT_SRC/tests/cli/lib.bash"
export OPENBLAS_NUM_THREADS=1 MGT_EMU_GPUS=1
cat >"$T/g.cfg" <<'EOF'
[input]
shape = 8,8,3

[conv2d]
name = c1
filters = 4
kernel = 2
padding = same
activation = relu

[batchnorm]
name = bn1

[conv2d]
name = c2
filters = 6
kernel = 3
stride = 2
padding = same
activation = relu

[global_avgpool]

[dense]
name = logits
units = 5

[train]
optimizer = adam
learning_rate = 0.01
loss = sparse_categorical_crossentropy
batch_size = 8
epochs = 100
seed = 7
EOF
run=(--device gpu --model "$T/g.cfg" --data synthetic --synthetic-samples 64 --max-steps 10
     --no-validation --verbose 2)
emu() { timeout 300 "$MGT_BIN" train "$@"; }

# 1. The per-layer table.
emu "${run[@]}" --profile-layers --out "$T/p" >p.log 2>&1 || { bad "--profile-layers run"; tail -5 p.log; }
rows=$(grep -cE '^\| [0-9]+ \| (c1|bn1|c2|global_avgpool_1|logits) \|' p.log)
[ "$rows" = 5 ] && ok "--profile-layers: a row for each of the 5 layers" || { bad "rows: $rows"; grep '^|' p.log; }
grep -qE '^\| 0 \| c1 \| conv2d \| [0-9.]+ \| [0-9]+ \| [0-9.]+ \| [0-9]+% \| [0-9.]+ .*\| fwd [A-Z_]+.*bwd-filter [A-Z_0-9]+' p.log \
  && ok "... times, GB/s, TFLOP/s, the floor's share and the cuDNN algorithms of a convolution" \
  || bad "c1's row: $(grep '| c1 |' p.log)"
grep -q '| 0 | c1 | conv2d |.*bwd-data' p.log && bad "c1 computes an input gradient nobody needs" \
  || ok "... the first layer has no backward-data pass"
grep -qE '^forward: [0-9.]+ ms in the layers \+ [0-9.]+ ms between them' p.log \
  && grep -qE '^data phase on the host .*: [0-9.]+ waiting for the loader' p.log \
  && grep -qE '^data phase on the device .*making the batch on the device \(synthetic generation\)' p.log \
  && ok "... the gaps between layers, and the data phase's host and device parts" \
  || bad "summary lines: $(grep -E '^(forward|data phase)' p.log)"
grep -q 'CUDA graphs: off (--profile-layers marks every layer)' p.log && ok "... and no replay under it" \
  || bad "replay under --profile-layers: $(grep 'CUDA graphs' p.log)"

# 2. CUDA graphs.
MGT_EMU_READS=$T/on.reads MGT_EMU_KERNELS=$T/on.kernels emu "${run[@]}" --profile --out "$T/on" >on.log 2>&1 \
  || { bad "graphs on"; tail -5 on.log; }
MGT_EMU_READS=$T/off.reads MGT_EMU_KERNELS=$T/off.kernels emu "${run[@]}" --profile --cuda-graph off --out "$T/off" >off.log 2>&1 \
  || { bad "graphs off"; tail -5 off.log; }
# The filters cuDNN reads (KRSC copies of c1's and c2's OIHW weights) are made once each, at
# their first use, and then once per step for both, in one launch after the update: 10 steps,
# 12 launches of k_weights_krsc, eager or replayed (section 4 checks that nothing else
# transposes them).
for way in on off; do
  made=$(awk '$1 == "k_weights_krsc" { print $2 }' "$T/$way.kernels")
  [ "$made" = 12 ] \
    && ok "graphs $way: the filters' copies made in 12 launches for 10 steps and 2 convolutions" \
    || bad "graphs $way: k_weights_krsc ran $made times, not 12"
done
launches=$(sed -n 's/^graphs //p' on.reads)
[ "$launches" = 16 ] && [ "$(sed -n 's/^graphs //p' off.reads)" = 0 ] \
  && ok "graphs: captured at micro-batch 3 and replayed to the 10th (16 launches), none when off" \
  || bad "graph launches: on '$launches', off '$(sed -n 's/^graphs //p' off.reads)'"
grep -qE '^CUDA graphs: forward and backward replayed .* [0-9.]+ ms per micro-batch launched op by op \(2 micro-batches\), [0-9.]+ ms replayed \(7\)' on.log \
  && ok "... --profile gives the host's issue time both ways" || bad "$(grep 'CUDA graphs' on.log)"
same "graphs on and off: the same weights" "$T/on/weights.safetensors" "$T/off/weights.safetensors" 0
cmp -s "$T/on/weights.safetensors" "$T/off/weights.safetensors" && ok "... bit for bit" \
  || bad "replay changed the bytes"
MGT_EMU_CAPTURE=invalidate emu "${run[@]}" --profile --out "$T/inv" >inv.log 2>&1 || { bad "failed capture"; tail -5 inv.log; }
[ "$(grep -c 'could not be captured as a CUDA graph' inv.log)" = 1 ] && grep -q 'CUDA graphs: off (a capture failed)' inv.log \
  && ok "a failed capture is said once and the run goes on eagerly" || bad "$(grep -i 'graph' inv.log)"
cmp -s "$T/inv/weights.safetensors" "$T/off/weights.safetensors" && ok "... to the same bytes" \
  || bad "the fallback changed the bytes"
# A capture invalidated from inside a library: cuDNN's first convolution of the forward pass
# queries its stream, or synchronises it; cuBLAS (the dense layer) allocates. Each refused call
# invalidates the capture; every launch, memset, cuDNN and cuBLAS call after it fails until the
# capture ends, and mgtrain must take that as the capture's failure, not the job's.
for how in cudnn-query cudnn-sync cublas-alloc; do
  MGT_EMU_CAPTURE=$how emu "${run[@]}" --profile --out "$T/$how" >"$how.log" 2>&1 \
    || { bad "$how: the run ended: $(grep -m1 'failed at' "$how.log")"; continue; }
  [ "$(grep -c 'could not be captured as a CUDA graph' "$how.log")" = 1 ] \
    && grep -q 'CUDA graphs: off (a capture failed)' "$how.log" \
    && cmp -s "$T/$how/weights.safetensors" "$T/off/weights.safetensors" \
    && ok "a capture that $how invalidates: said once, the run goes on eagerly to the same bytes" \
    || bad "$how: $(grep -i 'graph' "$how.log")"
done
sed 's/^\[global_avgpool\]/[dropout]\nrate = 0.1\n\n[global_avgpool]/' "$T/g.cfg" >"$T/d.cfg"
emu "${run[@]}" --model "$T/d.cfg" --profile --out "$T/d" >d.log 2>&1 || { bad "dropout run"; tail -5 d.log; }
grep -q 'CUDA graphs: off (dropout draws a new mask each step)' d.log && ok "dropout keeps replay off, saying why" \
  || bad "dropout: $(grep 'CUDA graphs' d.log)"
MGT_EMU_GPUS=2 timeout 300 mpirun --oversubscribe --bind-to none -x MGT_EMU_GPUS -np 2 "$MGT_BIN" train "${run[@]}" \
  --batch-size 16 --profile --out "$T/two" >two.log 2>&1 || { bad "two ranks"; tail -5 two.log; }
grep -q 'CUDA graphs: off (the gradient buckets are sent while backward runs)' two.log \
  && ok "two ranks keep replay off, saying why" || bad "two ranks: $(grep 'CUDA graphs' two.log)"

# 3. Algorithms by measurement, and NCHW for plain FP32.
[ "$(grep -c '^cuDNN conv .*, measured, ' on.log)" = 5 ] && ok "every convolution direction's algorithm is measured" \
  || bad "$(grep '^cuDNN conv' on.log)"
MGT_EMU_CUDNN_FASTEST=nchw emu "${run[@]}" --profile --out "$T/nchw" >nchw.log 2>&1 || { bad "NCHW run"; tail -5 nchw.log; }
n=$(grep -c '^cuDNN conv .*, NCHW, .*measured' nchw.log)
[ "$n" -ge 3 ] && ok "FP32, NCHW timed faster: $n of 5 directions run NCHW" || bad "NCHW: $(grep '^cuDNN conv' nchw.log)"
# the bias after the copy back: one more rounding of each output per step, 10 Adam steps of 0.01
same "NCHW and NHWC train the same weights to rounding" "$T/nchw/weights.safetensors" "$T/off/weights.safetensors" 1e-4
# Measured once: an epoch's short last batch (60 samples in batches of 8: its last has 4) takes
# the choices measured for the full batch, nothing measured again mid-run; two ranks sharing one
# GPU measure on one of them (cudnnFind* runs, counted by the emulator, as often as for one rank).
finds() { awk '$1 ~ /^cudnnFind/ { n += $2 } END { print n + 0 }' "$1"; }
one=$(finds "$T/on.kernels")
MGT_EMU_KERNELS=$T/short.kernels emu "${run[@]}" --synthetic-samples 60 --profile --out "$T/short" >short.log 2>&1 \
  || { bad "a short last batch"; tail -5 short.log; }
[ "$(finds "$T/short.kernels")" = "$one" ] && [ "$(grep -c '^cuDNN conv n=4 .*, as measured at n=8, ' short.log)" = 5 ] \
  && ok "a short last batch (n=4) takes the choices measured at n=8: $one cuDNN measurements, as without it" \
  || bad "short last batch: $(finds "$T/short.kernels") measurements (one batch size: $one); $(grep '^cuDNN conv n=4' short.log)"
MGT_EMU_KERNELS=$T/shared.kernels MGT_EMU_GPUS=1 timeout 300 mpirun --oversubscribe --bind-to none \
  -x MGT_EMU_GPUS -x MGT_EMU_KERNELS -np 2 "$MGT_BIN" train "${run[@]}" --batch-size 16 --share-gpu \
  --profile --out "$T/shared" >shared.log 2>&1 || { bad "two ranks on one GPU"; tail -5 shared.log; }
[ "$(finds "$T/shared.kernels")" = "$one" ] && [ "$(grep -c '^cuDNN conv .*, measured, ' shared.log)" = 5 ] \
  && ok "two ranks on one GPU: $one cuDNN measurements in all, by one rank, as for one rank alone" \
  || bad "two ranks on one GPU measured $(finds "$T/shared.kernels") times (one rank: $one)"
MGT_EMU_CUDNN_FASTEST=nchw emu "${run[@]}" --profile --tf32 --out "$T/tf" >tf.log 2>&1 || { bad "TF32 run"; tail -5 tf.log; }
grep -q '^cuDNN conv .*NCHW' tf.log && bad "--tf32 ran NCHW" || ok "--tf32 stays NHWC (its tensor-core kernels are NHWC's)"
sed 's/^name = bn1/name = bn1\nsync = true/' "$T/g.cfg" >"$T/r.cfg" # (--reproducible's batch norm)
emu "${run[@]}" --model "$T/r.cfg" --profile --reproducible --out "$T/r1" >r1.log 2>&1 || { bad "--reproducible"; tail -5 r1.log; }
MGT_EMU_CUDNN_FASTEST=nchw emu "${run[@]}" --model "$T/r.cfg" --reproducible --out "$T/r2" >r2.log 2>&1 \
  || { bad "--reproducible 2"; tail -5 r2.log; }
grep -q '^cuDNN conv .*measured' r1.log && bad "--reproducible measured" \
  || { grep -q "by cuDNN's heuristics, deterministic" r1.log && ok "--reproducible keeps cuDNN's heuristics"; }
cmp -s "$T/r1/weights.safetensors" "$T/r2/weights.safetensors" && ok "... and its bytes, whatever measures faster" \
  || bad "--reproducible's bytes moved with the timing"

# 4. --algo-cache.
emu "${run[@]}" --profile --algo-cache "$T/algos.txt" --out "$T/a1" >a1.log 2>&1 || { bad "cache run 1"; tail -5 a1.log; }
[ "$(grep -vc '^#' "$T/algos.txt")" = 5 ] && ok "--algo-cache: 5 measured choices written" || bad "$(cat "$T/algos.txt")"
cp "$T/algos.txt" "$T/algos0.txt"
MGT_EMU_KERNELS=$T/a2.kernels MGT_EMU_CUDNN_FASTEST=nchw emu "${run[@]}" --profile --algo-cache "$T/algos.txt" \
  --out "$T/a2" >a2.log 2>&1 || { bad "cache run 2"; tail -5 a2.log; }
[ "$(grep -c 'from the --algo-cache file' a2.log)" = 5 ] && cmp -s "$T/algos.txt" "$T/algos0.txt" \
  && ok "... taken by the next run (nothing measured, the file unchanged)" || bad "$(grep '^cuDNN conv' a2.log)"
cmp -s "$T/a1/weights.safetensors" "$T/a2/weights.safetensors" && ok "... the same algorithms, the same bytes" \
  || bad "cached choices trained other bytes"
# nothing measured (no NCHW copies timed), so no transpose at all: the filters' KRSC copies are
# made once per step, none per call
tr=$(awk '$1 ~ /^k_transpose/ { n += $2 } END { print n + 0 }' "$T/a2.kernels")
[ "$tr" = 0 ] && [ "$(awk '$1 == "k_weights_krsc" { print $2 }' "$T/a2.kernels")" = 12 ] \
  && ok "... no filter transposed per call: 12 launches make the copies, none transposes" \
  || bad "cached run: k_transpose $tr times; $(grep k_weights "$T/a2.kernels")"
printf 'Other GPU\tcuDNN 90000\tfp32\tn=8 8x8x3 -> 8x8x4 k=2x2 s=1 pad=0,0 algo=auto\tforward\tGEMM\tFMA_MATH\tNHWC\t1.5\n' >>"$T/algos0.txt"
cp "$T/algos0.txt" "$T/algos.txt"
emu "${run[@]}" --batch-size 16 --algo-cache "$T/algos.txt" --out "$T/a3" >a3.log 2>&1 || { bad "cache run 3"; tail -5 a3.log; }
grep -q '^Other GPU' "$T/algos.txt" && [ "$(grep -vc '^#' "$T/algos.txt")" = 11 ] \
  && ok "... a new batch's shapes added, another GPU's entry kept" || bad "$(cat "$T/algos.txt")"
printf 'not\tmine\n' >>"$T/algos.txt"
expect_fail "a damaged --algo-cache file is refused, naming its line" "--algo-cache .*algos.txt: line 14: .*delete it" \
  emu "${run[@]}" --algo-cache "$T/algos.txt" --out "$T/a4"
[ ! -e "$T/a4" ] && ok "... before anything is made" || bad "a4 was made"
finish
