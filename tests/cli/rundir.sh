#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# Run folders: a new run never replaces another run's files (--resume continues it, --overwrite
# replaces it), keeps a copy of its model file (the built-in model named as such), and eval and
# predict find model and weights with --run; one job at a time writes a folder (a lock naming
# the owner; a stale one taken over); --keep-checkpoints K keeps the last K checkpoints;
# best.safetensors holds the weights of the lowest validation loss.
source "$(dirname "$0")/lib.bash"
N="--data synthetic --synthetic-samples 3000 --batch-size 100 --verbose 2"
json() { # json FILE EXPR: a Python expression over the JSON object j
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
meta() { # meta FILE KEY: a metadata value of a safetensors file
  python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; print(json.loads(f.read(n))["__metadata__"][sys.argv[2]])' "$1" "$2"
}

# 1. A second run into a folder that holds a run is refused; nothing of the first run changes.
mkdir -p work && cd work
"$MGT_BIN" $N --epochs 2 >first.log 2>&1 || { bad "first run"; cat first.log; }
[ -s runs/mlp/weights.safetensors ] && ok "the default --out is runs/mlp" || bad "no runs/mlp/weights.safetensors"
sums=$(md5sum runs/mlp/* 2>/dev/null)
expect_fail "a quick test with the default --out is refused" \
  "runs/mlp holds another run \(model mlp from built-in model; weights.safetensors, checkpoint.safetensors.*\); pass --resume to continue it, --overwrite to replace it, or another --out \(runs/mlp-2 is free\)" \
  "$MGT_BIN" $N --max-steps 1
[ "$sums" = "$(md5sum runs/mlp/* 2>/dev/null)" ] && ok "the refused run changed nothing in runs/mlp" || bad "runs/mlp changed"
[ ! -e runs/mlp-2 ] && ok "the refused run made no folder" || bad "runs/mlp-2 was made"
# Another file of the same name (mlp.cfg) would share runs/mlp: refused, naming the first.
mkdir -p other && sed 's/units = 256/units = 64/' "$MGT_SRC/examples/mlp.cfg" >other/mlp.cfg
expect_fail "another mlp.cfg into runs/mlp is refused" "runs/mlp holds another run \(model mlp from built-in model" \
  "$MGT_BIN" --model other/mlp.cfg $N --max-steps 1
[ "$sums" = "$(md5sum runs/mlp/* 2>/dev/null)" ] && ok "... and changed nothing" || bad "runs/mlp changed"

# 2. The model copy and run.json; the built-in model is named as such.
grep -q "training mlp (built-in model)" first.log && ok "banner: training mlp (built-in model)" || { bad "banner"; head -3 first.log; }
[ "$(json runs/mlp/run.json 'j["model_file"]')" = "built-in model" ] && ok "run.json: model_file is \"built-in model\"" || bad "run.json model_file: $(cat runs/mlp/run.json)"
cmp -s runs/mlp/mlp.cfg "$MGT_SRC/examples/mlp.cfg" && ok "runs/mlp/mlp.cfg is the built-in model's text (examples/mlp.cfg)" || bad "model copy differs"
# An edited examples/mlp.cfg here: training without --model says it is not what trains.
mkdir -p examples && sed 's/units = 256/units = 32/' "$MGT_SRC/examples/mlp.cfg" >examples/mlp.cfg
"$MGT_BIN" $N --max-steps 1 --out edited >edited.log 2>&1 || { bad "run next to an edited examples/mlp.cfg"; cat edited.log; }
grep -q "notice: examples/mlp.cfg differs from the built-in model.*pass --model examples/mlp.cfg" edited.log &&
  ok "an edited examples/mlp.cfg is pointed out" || { bad "no notice about the edited examples/mlp.cfg"; cat edited.log; }
grep -q "269322 trainable parameters" edited.log && ok "... and the built-in model trains (269322 parameters)" || bad "parameter count"
"$MGT_BIN" --model examples/mlp.cfg $N --max-steps 1 --out edited2 >edited2.log 2>&1 || bad "--model examples/mlp.cfg"
cmp -s edited2/mlp.cfg examples/mlp.cfg && ok "--model FILE: the run keeps FILE's text" || bad "model copy of --model"
[ "$(json edited2/run.json 'j["model_file"]')" = "examples/mlp.cfg" ] && ok "run.json names --model's file" || bad "run.json model_file"
cd ..

# 3. --overwrite replaces the run: the old run's files go first.
cp work/runs/mlp/checkpoint.safetensors work/runs/mlp/checkpoint-7.safetensors
"$MGT_BIN" $N --max-steps 5 --out work/runs/mlp --overwrite >ow.log 2>&1 || { bad "--overwrite"; cat ow.log; }
[ "$(meta work/runs/mlp/weights.safetensors step)" = 5 ] && ok "--overwrite: the new run's weights (step 5)" || bad "--overwrite weights"
[ ! -e work/runs/mlp/checkpoint-7.safetensors ] && ok "--overwrite: the old run's kept checkpoints are gone" || bad "old checkpoint-7 left"
[ "$(json work/runs/mlp/run.json 'len(j["segments"])')" = 1 ] && ok "--overwrite: run.json has the new run's one segment" || bad "segments: $(cat work/runs/mlp/run.json)"

# 4. eval and predict --run: the folder's model copy and weights, as --model and --weights give.
mpi 2 --model "$MGT_SRC/examples/smallconv.cfg" --data synthetic --synthetic-samples 1000 --max-steps 4 \
  --no-validation --verbose 0 --out conv >conv.log 2>&1 || { bad "smallconv run"; cat conv.log; }
a=$("$MGT_BIN" eval --run conv --data synthetic 2>&1 | sed 's/ - [0-9.]* s - / - /')
b=$("$MGT_BIN" eval --model "$MGT_SRC/examples/smallconv.cfg" --weights conv/weights.safetensors --data synthetic 2>&1 | sed 's/ - [0-9.]* s - / - /')
[ -n "$a" ] && [ "$a" = "$b" ] && grep -q "loss:" <<<"$a" && ok "eval --run conv: $a" || bad "eval --run: '$a' vs '$b'"
"$MGT_BIN" predict --run conv --data synthetic --output p1.npy >/dev/null 2>&1 &&
  "$MGT_BIN" predict --model "$MGT_SRC/examples/smallconv.cfg" --weights conv/weights.safetensors --data synthetic --output p2.npy >/dev/null 2>&1 &&
  cmp -s p1.npy p2.npy && ok "predict --run conv: the same predictions" || bad "predict --run"
expect_fail "eval --run on a folder that is no run" "--run work: no readable run.json there; pass the --out folder of a training run" \
  "$MGT_BIN" eval --run work --data synthetic
# The folder's model copy is checked against the model its checkpoint was trained with: a copy
# edited since (an activation changed: the weights still fit) is refused, by predict too.
cp -r conv conv-edited && sed -i '0,/activation = relu/s//activation = tanh/' conv-edited/smallconv.cfg
expect_fail "eval --run with an edited model copy" \
  "--run conv-edited: its model copy conv-edited/smallconv.cfg is not the model its checkpoint was trained with \(other layers or sizes\).*pass --model" \
  "$MGT_BIN" eval --run conv-edited --data synthetic
expect_fail "predict --run with an edited model copy" "--run conv-edited: its model copy .* is not the model its checkpoint" \
  "$MGT_BIN" predict --run conv-edited --data synthetic --output p3.npy
[ ! -e p3.npy ] && ok "... and nothing was written" || bad "p3.npy written"
"$MGT_BIN" eval --run conv-edited --model "$MGT_SRC/examples/smallconv.cfg" --data synthetic >edited-ok.log 2>&1 \
  && ok "eval --run with --model: the model named" || { bad "eval --run --model"; cat edited-ok.log; }

# 5. The lock: a second job into a folder a running job writes is refused, naming the first;
# the first finishes with its own files.
mpirun --oversubscribe --bind-to none -np 2 "$MGT_BIN" --data synthetic --synthetic-samples 20000 --batch-size 64 \
  --epochs 3 --verbose 2 --out locked >locked.log 2>&1 &
mp=$!
for _ in $(seq 600); do [ -e locked/mgtrain.lock ] && break; sleep 0.1; done
owner=$(head -1 locked/mgtrain.lock)
expect_fail "a second job into a folder in use is refused, naming the owner" \
  "locked is in use by another mgtrain job \(pid $(cut -d' ' -f2 <<<"$owner") on $(hostname)" \
  "$MGT_BIN" --model "$MGT_SRC/examples/smallconv.cfg" --data synthetic --max-steps 1 --out locked --overwrite
wait $mp && ok "the first job finishes" || { bad "the first job failed"; cat locked.log; }
[ "$(json locked/run.json 'j["model"]')" = mlp ] && [ "$(meta locked/weights.safetensors model)" = mlp ] &&
  ok "run.json and weights are the first job's (mlp)" || bad "locked folder mixed: $(cat locked/run.json)"
[ ! -e locked/mgtrain.lock ] && ok "the lock is gone when the job ends" || bad "lock left behind"
# A lock left by a process of this host that no longer runs is taken over, with a notice.
dead=$(sh -c 'echo $$') # a process that has ended
printf '%s %s 1700000000.000\n' "$(hostname)" "$dead" >locked/mgtrain.lock
"$MGT_BIN" --data synthetic --synthetic-samples 20000 --batch-size 64 --epochs 4 --verbose 2 --out locked --resume >stale.log 2>&1 &&
  grep -q "notice: locked: took over the lock of pid $dead on $(hostname).*no longer running" stale.log &&
  ok "a stale lock of this host is taken over with a notice" || { bad "stale lock"; cat stale.log; }
# One of another host cannot be checked: refused, saying how to remove it.
printf 'elsewhere.example 4242 1700000000.000\n' >locked/mgtrain.lock
expect_fail "a lock of another host is refused with what to do" \
  "locked is locked by pid 4242 on elsewhere.example.*if no job runs there any more, delete locked/mgtrain.lock" \
  "$MGT_BIN" --data synthetic --synthetic-samples 20000 --batch-size 64 --epochs 5 --out locked --resume
# An empty lock file (a process killed between making it and writing its line in it): taken
# over with a notice once it is 2 s old; a younger one is looked at again until then (its
# maker may be writing it), so the start waits about that long and no more.
: >locked/mgtrain.lock
t0=$(date +%s.%N)
"$MGT_BIN" --data synthetic --synthetic-samples 20000 --batch-size 64 --epochs 5 --verbose 2 --out locked --resume >empty.log 2>&1 &&
  grep -q "notice: locked: took over a lock file with no owner in it" empty.log &&
  ok "an empty lock file is taken over with a notice, after $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s" ||
  { bad "empty lock file"; cat empty.log; }
[ ! -e locked/mgtrain.lock ] && ok "... and released at the end" || bad "empty lock: lock left behind"

# 6. --keep-checkpoints 3: the current checkpoint and the two before it, each a checkpoint.
mpi 2 $N --epochs 2 --save-every 7 --keep-checkpoints 3 --out keep >keep.log 2>&1 || { bad "keep run"; cat keep.log; }
kept=$(cd keep && ls checkpoint-*.safetensors | sed 's/checkpoint-\([0-9]*\).*/\1/' | sort -n | tr '\n' ' ')
# Saves at steps 7, 14, ..., 56 and at the epoch ends, 30 and 60: the last three are 49, 56, 60.
[ "$kept" = "49 56 " ] && ok "--keep-checkpoints 3: checkpoint.safetensors (step 60) and steps 49, 56 kept" ||
  bad "--keep-checkpoints 3 kept: '$kept'"
[ "$(meta keep/checkpoint-56.safetensors step)" = 56 ] && [ "$(meta keep/checkpoint.safetensors step)" = 60 ] &&
  ok "each kept checkpoint holds its own step" || bad "kept checkpoints' steps"
"$MGT_BIN" eval --weights keep/checkpoint-49.safetensors --data synthetic >/dev/null 2>&1 &&
  ok "a kept checkpoint loads (eval --weights)" || bad "checkpoint-49 does not load"
mpi 2 $N --epochs 2 --save-every 7 --out keep1 >keep1.log 2>&1 || bad "keep1 run"
ls keep1 | grep 'checkpoint-' >/dev/null && bad "default keeps numbered checkpoints: $(ls keep1)" || ok "by default only checkpoint.safetensors"

# 7. best.safetensors: the weights of the lowest validation loss, across a resume too.
mpi 2 --data synthetic --synthetic-samples 3000 --batch-size 100 --verbose 0 --epochs 2 --lr 0.02 --out best >best.log 2>&1 || bad "best run"
mpi 2 --data synthetic --synthetic-samples 3000 --batch-size 100 --verbose 0 --epochs 4 --lr 0.02 --out best --resume >best2.log 2>&1 || bad "best resumed"
got="$(meta best/best.safetensors step) $(meta best/best.safetensors val_loss)"
if python3 - "$got" <<'PY'
import json, sys
rows = [json.loads(l) for l in open("best/metrics.jsonl")]
b = min(rows, key=lambda r: r["val_loss"])
step, loss = sys.argv[1].split()
print("epochs", [r["epoch"] for r in rows], "best at step", b["step"], "val_loss", b["val_loss"])
sys.exit(not (len(rows) == 4 and int(step) == b["step"] and float(loss) == b["val_loss"]))
PY
then ok "best.safetensors: the step and val_loss of the lowest val_loss of all 4 epochs ($got)"
else bad "best.safetensors has '$got'"; cat best/metrics.jsonl; fi
"$MGT_BIN" eval --weights best/best.safetensors --data synthetic --batch-size 100 >/dev/null 2>&1 && ok "best.safetensors loads" || bad "best.safetensors does not load"
finish
