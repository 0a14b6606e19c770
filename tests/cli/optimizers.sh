#!/usr/bin/env bash
# labels: cli
# timeout: 300
# cores: 1
# The optimizer table (src/optim.c) is the one list of optimizers: the --help text names them,
# the [train] row of docs/model-files.md lists the same names, and every one of them trains,
# saves its state under its own name and resumes from it.
source "$(dirname "$0")/lib.bash"
N="--data synthetic --synthetic-samples 256 --batch-size 32 --verbose 2"

line=$("$MGT_BIN" --help | grep -- "--optimizer NAME")
# "sgd, rmsprop or adam" -> "sgd rmsprop adam"
names=$(sed -E 's/.*--optimizer NAME +//; s/ \(default.*//; s/,//g; s/ or / /' <<<"$line")
[ -n "$names" ] && ok "--help names the optimizers: $names" || bad "no optimizer list in: $line"
readme="**\`optimizer\`** ($(tr ' ' '\n' <<<"$names" | paste -sd'|' - | sed 's/|/\\|/g'))"
grep -qF -- "$readme" "$MGT_SRC/docs/model-files.md" && ok "docs/model-files.md lists the same: $readme" \
  || bad "the [train] row of docs/model-files.md does not read $readme"

for o in $names; do
  "$MGT_BIN" $N --optimizer "$o" --max-steps 2 --out "$o" >"$o.log" 2>&1 \
    || { bad "$o: training failed"; cat "$o.log"; continue; }
  saved=$(python3 -c 'import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
print(json.loads(f.read(n))["__metadata__"]["optimizer"])' "$o/checkpoint.safetensors")
  [ "$saved" = "$o" ] && ok "$o: trains and its checkpoint names it" || bad "$o: checkpoint says '$saved'"
  "$MGT_BIN" $N --optimizer "$o" --max-steps 3 --out "$o" --resume >"$o-resume.log" 2>&1 \
    && grep -q "resumed from $o/checkpoint.safetensors" "$o-resume.log" \
    && ok "$o: resumes from its own state" || { bad "$o: resume failed"; cat "$o-resume.log"; }
done
finish
