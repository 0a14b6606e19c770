#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# Checkpoint and resume: 2 epochs straight equal 1 epoch on 2 ranks + 1 resumed epoch on 3 ranks
# (SGD, 1e-5); with the same rank count, resume is bit-exact with any optimizer, also from a
# mid-epoch checkpoint (--save-every, --max-steps).
# The resumed epoch runs on another rank count, so its sums round differently: the model for
# that comparison is smooth (the MLP with tanh), whose 23 SGD steps carry the per-step rounding
# differences (~1e-7 of the updates) without amplifying them, far below 1e-5; with ReLU a gate
# within rounding of zero could flip between rank counts, which is not rounding
# (tests/cli/invariance.sh). The same-world checks are bit-exact and keep the ReLU MLP.
# A resumed run keeps the metrics history and lists its segments in run.json; --resume auto
# starts when there is nothing to resume; a finished run has nothing left to train; a checkpoint
# of another model is named as such first; no field of a checkpoint is trusted; temporaries a
# killed writer left are removed.
source "$(dirname "$0")/lib.bash"
json() { # json FILE EXPR: a Python expression over the JSON object j
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
N="--synthetic-samples 6000 --data synthetic --verbose 2"
sed 's/activation = relu/activation = tanh/' "$MGT_SRC/examples/mlp.cfg" >tanh.cfg
grep -q "activation = tanh" tanh.cfg || bad "could not make the tanh MLP from examples/mlp.cfg"
S=(--model tanh.cfg --optimizer sgd --lr 0.05)
mpi 2 "${S[@]}" --epochs 2 $N --out straight >s.log 2>&1 || { bad "straight"; cat s.log; }
mpi 2 "${S[@]}" --epochs 1 $N --out split >a.log 2>&1 || { bad "first half"; cat a.log; }
mpi 3 "${S[@]}" --epochs 2 $N --out split --resume >b.log 2>&1 || { bad "resumed half"; cat b.log; }
grep -q "resumed from split/checkpoint.safetensors at epoch 2" b.log && ok "resume message" || { bad "resume message"; cat b.log; }
same "SGD 2 ranks + resume on 3 ranks" straight/weights.safetensors split/weights.safetensors 1e-5

# Adam, same world size, resumed mid-epoch from a --save-every checkpoint: bit-exact.
mpi 2 --epochs 2 $N --verbose 2 --out adam-straight >c.log 2>&1 || { bad "adam straight"; cat c.log; }
mpi 2 --epochs 2 $N --out adam-split --max-steps 30 --save-every 10 >d.log 2>&1 || { bad "adam first part"; cat d.log; }
mpi 2 --epochs 2 $N --verbose 2 --out adam-split --resume >e.log 2>&1 || { bad "adam resumed"; cat e.log; }
same "Adam resume, same world, bit-exact" adam-straight/weights.safetensors adam-split/weights.safetensors 0
same "Adam checkpoints at the end agree bit for bit" adam-straight/checkpoint.safetensors adam-split/checkpoint.safetensors 0
# The resumed epoch line reports the same loss as the uninterrupted run's.
a=$(grep -o 'Epoch 2/2.*' c.log | sed 's/ - [0-9]*s - / - /'); b=$(grep -o 'Epoch 2/2.*' e.log | sed 's/ - [0-9]*s - / - /')
[ -n "$a" ] && [ "$a" = "$b" ] && ok "epoch 2 line identical after resume" || bad "epoch lines differ: '$a' vs '$b'"

# The metrics history survives the resume (Keras' CSVLogger(append=True)): the uninterrupted
# run's rows, bit for bit but for the timings, and the row where --max-steps stopped the first
# part inside epoch 2 (step 30).
rows() { # rows DIR: metrics.jsonl without the timings; then metrics.csv's epoch and step columns
  python3 -c 'import json,sys
for l in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(l); print(r["epoch"], r["step"], repr(r["loss"]), repr(r["acc"]), repr(r["val_loss"]), repr(r["val_acc"]))' "$1"
  cut -d, -f1,2 "$1/metrics.csv"
}
a=$(rows adam-straight); b=$(rows adam-split | grep -v '^2 30 \|^2,30$')
[ "$(grep -c '^[12] ' <<<"$a")" = 2 ] && [ "$a" = "$b" ] && [ "$(rows adam-split | grep -c '^2 30 \|^2,30$')" = 2 ] &&
  ok "metrics history kept across the resume: epochs 1 and 2 as the uninterrupted run's, and the row at step 30" ||
  { bad "metrics after resume differ"; echo "$a"; echo "---"; rows adam-split; }
[ "$(rows split | head -1)" = "$(rows straight | head -1)" ] && [ "$(wc -l <split/metrics.jsonl)" = 2 ] &&
  ok "2 ranks + 3 ranks: epoch 1's row kept, 2 rows in all" || { bad "split metrics"; cat split/metrics.jsonl; }
# run.json lists the segments: where each started and ended, on how many ranks, and how.
segs() { json "$1/run.json" '" ".join("%s-%s:%s:%s" % (s["start_step"], s["end_step"], s["world"], s["end"]) for s in j["segments"])'; }
[ "$(segs split)" = "0-24:2:finished 24-48:3:finished" ] && ok "run.json segments: $(segs split)" || bad "segments: $(segs split)"
[ "$(segs adam-split)" = "0-30:2:stopped at --max-steps 30 30-48:2:finished" ] && ok "run.json segments: $(segs adam-split)" || bad "segments: $(segs adam-split)"

# --- A resume continues the run as it was (resume.h) --------------------------------------------
# Trained with non-default settings and stopped at step 10, `mgtrain --resume` and nothing else
# takes them all from the run folder and ends with the uninterrupted run's bytes (--reproducible,
# one rank each; the built-in MLP's folder, runs/mlp, in both).
G=(--data synthetic --synthetic-samples 1536 --lr 0.01 --optimizer sgd --batch-size 128 --epochs 3 --reproducible)
"$MGT_BIN" "${G[@]}" --verbose 0 --out whole >g1.log 2>&1 || { bad "the uninterrupted run"; cat g1.log; }
"$MGT_BIN" "${G[@]}" --verbose 0 --max-steps 10 >g2.log 2>&1 || { bad "the first part"; cat g2.log; }
"$MGT_BIN" --resume >g3.log 2>&1 || { bad "mgtrain --resume"; cat g3.log; }
grep -q "resumed with the run's flags (runs/mlp/run.json): --data=synthetic --synthetic-samples=1536 --lr=0.01 --optimizer=sgd --batch-size=128 --epochs=3 --reproducible$" g3.log \
  && ok "--resume alone: the start-up block names the run's flags" || { bad "no flags line"; cat g3.log; }
grep -q "Trained 26 steps" g3.log && ok "--resume alone trains the 26 steps left of 3 epochs" || { bad "steps"; tail -3 g3.log; }
same "--resume alone after --lr 0.01 --optimizer sgd --batch-size 128 --epochs 3: the uninterrupted run's bytes" \
  whole/weights.safetensors runs/mlp/weights.safetensors 0
# Given again with other values, every difference is named in one message, and nothing changes;
# the same values, spelled otherwise, are no change; --epochs may change (named in the block), and
# the next resume keeps the new count.
"$MGT_BIN" "${G[@]}" --verbose 0 --max-steps 10 --out part >/dev/null 2>&1 || bad "part"
sums=$(md5sum part/* 2>/dev/null)
out=$("$MGT_BIN" --resume --out part --lr 0.02 --optimizer adam --batch-size 64 --val-split 0.1 --seed 3 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q -- "--val-split 0.1 (the run: without it, .*--batch-size 64 (the run: 128); --optimizer adam (the run: sgd); --lr 0.02 (the run: 0.01); --seed 3 (the run: 7); give the flags as the run had them, or leave them out" <<<"$out" \
  && ok "other values: all five named in one line, exit 2" || { bad "other values: exit $rc"; echo "$out"; }
[ "$sums" = "$(md5sum part/* 2>/dev/null)" ] && ok "... and nothing in the folder changed" || bad "the refused resume changed the folder"
"$MGT_BIN" --resume --out part --lr 1e-2 --optimizer sgd --batch-size 128 --seed 7 --max-steps 12 --verbose 2 >same.log 2>&1 \
  && ok "the same values given again (1e-2 for 0.01, the model file's seed 7): accepted" || { bad "same values"; cat same.log; }
"$MGT_BIN" --resume --out part --epochs 4 --max-steps 14 --verbose 2 >more.log 2>&1 &&
  grep -q "changed on this resume: --epochs 4 (the run: 3), --max-steps 14 (this start), --verbose 2 (this start)$" more.log \
  && ok "--epochs 4 and --max-steps: accepted and named" || { bad "--epochs 4"; cat more.log; }
"$MGT_BIN" --resume --out part --verbose 2 >rest.log 2>&1 && grep -q "Trained 34 steps" rest.log \
  && ok "the next --resume keeps --epochs 4 (48 steps in all)" || { bad "--epochs kept"; tail -3 rest.log; }
# The model file, edited after the run started: [input] mean and std, an augmentation turned off,
# the learning rate in [train]; every key named, and --model with the folder's copy resumes.
sed 's/^shape = 28,28,1$/shape = 28,28,1\nmean = 0.5\nstd = 0.25/; s/^\[train\]$/[train]\naugment_flip = true/' \
  "$MGT_SRC/examples/mlp.cfg" >f.cfg
"$MGT_BIN" --model f.cfg --data synthetic --synthetic-samples 1536 --verbose 0 --max-steps 3 --out fm >/dev/null 2>&1 || bad "f.cfg run"
sed -i 's/^mean = 0.5$/mean = 0.4/; s/^std = 0.25$/std = 0.3/; s/^augment_flip = true$/augment_flip = false/; s/^learning_rate = .*/learning_rate = 0.005/' f.cfg
out=$("$MGT_BIN" --resume --out fm --max-steps 4 2>&1); rc=$?
[ $rc = 2 ] && grep -q "\[input\] mean = 0.4 (the run: 0.5); \[input\] std = 0.3 (the run: 0.25); \[train\] augment_flip = false (the run: true); \[train\] learning_rate = 0.005 (the run: 0.001); resume with the model file the run trained (--model fm/f.cfg)" <<<"$out" \
  && ok "an edited model file: mean, std, augmentation, learning rate named" || { bad "edited model file: exit $rc"; echo "$out"; }
"$MGT_BIN" --resume --out fm --model fm/f.cfg --max-steps 4 --verbose 0 >fm.log 2>&1 && ok "... and --model fm/f.cfg resumes" || { bad "--model fm/f.cfg"; cat fm.log; }

# The data, once loaded, as described: an image set converted again at another size in the same
# place is not the run's data (a few tiny images, about 3 s).
PY=/usr/bin/python3
"$PY" -c "import numpy, PIL" 2>/dev/null || PY=python3
if "$PY" -c "import numpy, PIL" 2>/dev/null; then
  "$PY" "$MGT_SRC/tests/cli/images_data.py" tree tree 2 6 1 || bad "the image tree"
  { "$MGT_BIN" convert tree s16 --size 16 --verbose 0 && "$MGT_BIN" convert tree s12 --size 12 --verbose 0; } >conv.log 2>&1 ||
    { bad "convert"; cat conv.log; }
  I=(--data set --input-shape 8,8,3 --batch-size 4 --no-validation --verbose 0)
  ln -s s16 set
  "$MGT_BIN" "${I[@]}" --max-steps 2 --out img >img.log 2>&1 || { bad "2 steps on the image set"; cat img.log; }
  rm set && ln -s s12 set
  expect_fail "the image set converted again at another size" \
    "the data is not what the run in img trained on: now set \(images stored [^)]* 12[^)]*\).*the run's set \(images stored [^)]* 16" \
    "$MGT_BIN" --resume --out img
else
  echo "note: no python3 with numpy and Pillow; the image set's check did not run"
fi

# A finished run: nothing left to train, nothing written.
sums=$(md5sum split/*.safetensors split/metrics.* split/run.json)
mpi 2 "${S[@]}" --epochs 2 $N --out split --resume >done.log 2>&1; rc=$?
[ $rc -eq 0 ] && grep -q "nothing left to train: the run in split has trained all its 2 epochs (48 steps); pass --epochs with more" done.log &&
  ok "--resume on a finished run: 'nothing left to train', exit 0" || { bad "finished run: exit $rc"; cat done.log; }
grep -q "Trained" done.log && bad "a finished run trained again" || true
[ "$sums" = "$(md5sum split/*.safetensors split/metrics.* split/run.json)" ] && ok "... and wrote nothing" || bad "the finished run's files changed"

# --resume auto: starts where there is no checkpoint (a requeued job's first start), resumes after.
mpi 2 $N --max-steps 10 --out auto --resume auto >auto1.log 2>&1 && grep -q "^Trained 10 steps" auto1.log &&
  ok "--resume auto without a checkpoint starts afresh" || { bad "--resume auto, first start"; cat auto1.log; }
mpi 2 $N --max-steps 20 --out auto --resume auto >auto2.log 2>&1 && grep -q "resumed from auto/checkpoint.safetensors at epoch 1, step 10" auto2.log &&
  ok "--resume auto with a checkpoint resumes it" || { bad "--resume auto, second start"; cat auto2.log; }
expect_fail "--resume where there is no checkpoint" "--resume: no checkpoint at nowhere/checkpoint.safetensors; start without --resume \(--resume auto starts afresh"   "$MGT_BIN" $N --out nowhere --resume
[ ! -e nowhere ] && ok "... and makes no folder" || bad "a failed --resume made its folder"

# Another model's checkpoint is named as such before its optimizer or batch (both differ here).
expect_fail "ConvNet resuming the MLP's run: the model is named first"   "adam-split/checkpoint.safetensors is a checkpoint of model mlp, but this run's model is convnet"   "$MGT_BIN" --model "$MGT_SRC/examples/convnet.cfg" $N --out adam-split --resume
# A model file of the same name, edited since: its structure differs.
mkdir -p edited && sed 's/units = 256/units = 128/' "$MGT_SRC/examples/mlp.cfg" >edited/mlp.cfg
expect_fail "an edited mlp.cfg resuming the mlp run" "adam-split/checkpoint.safetensors is a checkpoint of another model named mlp: its layers or their sizes differ"   "$MGT_BIN" --model edited/mlp.cfg $N --out adam-split --resume

# No field of a checkpoint is trusted: each out-of-range value, in a file whose CRC is right, is
# refused with its name, and nothing in the folder changes. The CRC is made as the writer makes it
# (tensor_io.h): over the canonical header and the data, or the data alone in older files.
"$MGT_BIN" --data synthetic --synthetic-samples 6000 --epochs 2 --max-steps 30 --verbose 0 --out base >base.log 2>&1 || { bad "base run"; cat base.log; }
edit() { # edit DIR KEY=VALUE...: base's checkpoint into DIR with the metadata changed, CRC remade
  rm -rf "$1"; cp -r base "$1"
  python3 - "$@" <<'PY'
import json, struct, sys, zlib
d, edits = sys.argv[1], sys.argv[2:]
b = open("base/checkpoint.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h, data = json.loads(b[8:8 + n]), b[8 + n:]
m = h["__metadata__"]
for e in edits:
    k, v = e.split("=", 1)
    m[k] = v
if "crc32_covers" in m:
    m["crc32"] = "00000000"
    crc = zlib.crc32(json.dumps(h, separators=(",", ":")).encode() + data)
else:
    crc = zlib.crc32(data)
m["crc32"] = "%08x" % crc
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (-len(t) % 8)
open(d + "/checkpoint.safetensors", "wb").write(struct.pack("<Q", len(t)) + t + data)
PY
}
bad_field() { # bad_field NAME PATTERN KEY=VALUE...
  local name=$1 pat=$2 before
  shift 2
  edit case "$@"
  before=$(cd case && md5sum $(ls))
  expect_fail "checkpoint with $name" "$pat" "$MGT_BIN" --data synthetic --synthetic-samples 6000 --epochs 2 --out case --resume --verbose 0
  [ "$before" = "$(cd case && md5sum $(ls))" ] && ok "... nothing in the folder changed" || bad "... the folder changed: $(ls case)"
}
bad_field "a negative epoch" "checkpoint metadata epoch = -2 is out of range" epoch=-2
bad_field "a negative step" "checkpoint metadata step = -1 is out of range" step=-1
bad_field "world 0" "checkpoint metadata world = 0 is out of range \(1 to" world=0
bad_field "a negative seed" "checkpoint metadata 'seed' is missing or not a number" seed=-5
bad_field "more optimizer steps than steps" "checkpoint metadata optimizer_t = 31 is out of range \(0 to 30\)" optimizer_t=31
bad_field "NaN epoch sums" "checkpoint metadata epoch_sums = nan 0 0 is out of range" "epoch_sums=nan 0 0"
bad_field "a position beyond the data" "does not fit this data: 6000 training samples at global batch 256 make 24 steps an epoch" step_in_epoch=29
bad_field "a step count the epochs do not make" "case/checkpoint.safetensors: its position \(epoch 2, step 6 of the epoch, 31 steps in all" step=31 optimizer_t=31
# An epoch beyond the run's: nothing left to train, and the weights of the run stay as they are.
edit case epoch=5 step=120 step_in_epoch=0 optimizer_t=120 "epoch_sums=0 0 0"
before=$(md5sum case/weights.safetensors)
"$MGT_BIN" --data synthetic --synthetic-samples 6000 --epochs 2 --out case --resume >case.log 2>&1 && grep -q "nothing left to train" case.log &&
  [ "$before" = "$(md5sum case/weights.safetensors)" ] && ok "a checkpoint past the last epoch: nothing left to train, weights kept" ||
  { bad "checkpoint past the last epoch"; cat case.log; }
# The same checkpoint with other data does not fit it either: the run's flags say so first; in a
# folder whose run.json records none (an older mgtrain), the checkpoint's position does.
expect_fail "resuming on other data" "--synthetic-samples 5000 \(the run: 6000\)"   "$MGT_BIN" --data synthetic --synthetic-samples 5000 --epochs 2 --out base --resume
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); del j["flags"]; json.dump(j, open(sys.argv[1], "w"))' base/run.json
expect_fail "resuming on other data, no flags recorded" "does not fit this data: 5000 training samples"   "$MGT_BIN" --data synthetic --synthetic-samples 5000 --epochs 2 --out base --resume

# Temporaries a writer killed mid-write left behind (NAME.tmp.<pid>) go at the next start; kill -9
# of the writer during its checkpoint writes, repeatedly, never loses the checkpoint.
dead=$(sh -c 'echo $$') # a process that has ended
head -c 3000000 /dev/urandom >base/checkpoint.safetensors.tmp.$dead
"$MGT_BIN" --data synthetic --synthetic-samples 6000 --epochs 2 --max-steps 31 --verbose 0 --out base --resume >tmp.log 2>&1 &&
  grep -q "notice: base: removed what a killed writer left behind: checkpoint.safetensors.tmp.$dead" tmp.log &&
  [ ! -e base/checkpoint.safetensors.tmp.$dead ] && ok "a stale temporary is removed, with a notice" || { bad "stale temporary"; cat tmp.log; ls base; }
for i in 1 2 3 4 5 6; do
  "$MGT_BIN" --data synthetic --synthetic-samples 6000 --epochs 50 --save-every 1 --verbose 0 --out base --resume >kill.log 2>&1 &
  p=$!
  sleep "0.$((RANDOM % 9 + 1))"
  kill -9 $p; wait $p 2>/dev/null
done
"$MGT_BIN" eval --weights base/checkpoint.safetensors --data synthetic >/dev/null 2>&1 && ok "after 6 kill -9 mid-run the checkpoint loads" || bad "checkpoint damaged by kill -9"
at=$(python3 -c 'import json,struct; f=open("base/checkpoint.safetensors","rb"); n=struct.unpack("<Q",f.read(8))[0]; print(json.loads(f.read(n))["__metadata__"]["step"])')
"$MGT_BIN" --data synthetic --synthetic-samples 6000 --epochs 50 --max-steps $((at + 1)) --verbose 0 --out base --resume >after.log 2>&1 ||
  { bad "the start after the kills"; cat after.log; }
ls base | grep '\.tmp\.' >/dev/null && bad "temporaries left after the next start: $(ls base | grep '\.tmp\.')" ||
  ok "the next start leaves no temporary ($(grep -c removed after.log) notice)"
finish
