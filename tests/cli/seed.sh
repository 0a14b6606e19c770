#!/usr/bin/env bash
# labels: mpi
# timeout: 300
# Seeds are 64-bit integers end to end. 9007199254740993 = 2^53 + 1 is the first whole number a
# double cannot hold (it would become ...992): run.json, the checkpoint's metadata and a run
# resumed from that checkpoint (whose position every rank receives in one broadcast) must all
# carry it exactly, and the resumed run must train as the uninterrupted one does (same shuffle).
source "$(dirname "$0")/lib.bash"
S=9007199254740993
N="--data synthetic --synthetic-samples 512 --batch-size 64 --verbose 2"
# The "seed" of a run.json, or of a safetensors file's metadata (8-byte length, JSON header).
run_seed() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["seed"])' "$1"; }
ckpt_seed() {
  python3 -c 'import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
print(json.loads(f.read(n))["__metadata__"]["seed"])' "$1"
}
expect_seed() { # NAME VALUE
  [ "$2" = "$S" ] && ok "$1 holds seed $S" || bad "$1 holds seed '$2', expected $S"
}

mpi 2 $N --seed $S --max-steps 1 --out run >a.log 2>&1 || { bad "one step with seed $S"; cat a.log; }
expect_seed "run.json" "$(run_seed run/run.json)"
expect_seed "checkpoint metadata" "$(ckpt_seed run/checkpoint.safetensors)"

# Resumed without --seed: the seed comes from the checkpoint alone.
mpi 2 $N --max-steps 2 --out run --resume >b.log 2>&1 || { bad "resumed run"; cat b.log; }
expect_seed "the resumed run's run.json" "$(run_seed run/run.json)"
expect_seed "the resumed run's checkpoint" "$(ckpt_seed run/checkpoint.safetensors)"

# Resumed with another --seed: refused, naming both, before anything is written; with the same
# --seed it goes on.
sums=$(md5sum run/* 2>/dev/null)
expect_fail "--resume with another --seed is refused, naming both" \
  "the run in run was trained with other settings, and a resumed run continues it as it was: --seed 5 \(the run: $S\)" \
  "$MGT_BIN" $N --seed 5 --max-steps 3 --out run --resume
[ "$sums" = "$(md5sum run/* 2>/dev/null)" ] && ok "... and nothing in run changed" || bad "the refused resume changed run"
mpi 2 $N --seed $S --max-steps 2 --out run --resume >d.log 2>&1 && grep -q "nothing left to train" d.log \
  && ok "--resume with the same --seed is accepted" || { bad "--resume --seed $S"; cat d.log; }

# The resumed step drew its batch from seed S: bit for bit the second step of a straight run.
mpi 2 $N --seed $S --max-steps 2 --out straight >c.log 2>&1 || { bad "two straight steps"; cat c.log; }
same "resumed step equals the straight run's" straight/weights.safetensors run/weights.safetensors 0
finish
