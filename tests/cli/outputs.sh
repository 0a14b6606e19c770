#!/usr/bin/env bash
# labels: cli
# timeout: 300
# No output replaces an input or a run's file, and a wrong output path is said at the start:
# --timeline and predict --output are refused, before any work and with nothing changed, when
# they name the model file, the weights, --init-weights, a data file (compared by identity: a
# symbolic or hard link, another spelling of the path), a file mgtrain keeps in a run folder
# (this run's own --out, made later, or another run's), an existing file mgtrain did not write
# (unless --overwrite), or a folder that does not exist or cannot be written; and a file the
# run reads that its own --out would replace.
source "$(dirname "$0")/lib.bash"
S=(--data synthetic --synthetic-samples 256 --batch-size 64 --verbose 0)
P=(--data synthetic --batch-size 64) # predict's
# refused NAME PATTERN CMD...: exit 2, one line, PATTERN; nothing in the test folder changed.
refused() {
  local name=$1 pat=$2 before out rc
  shift 2
  before=$(find . -path ./sanitizer -prune -o -type f -print0 | sort -z | xargs -0 md5sum)
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -qE -- "^mgtrain: $pat" <<<"$out"; then ok "$name"
  else bad "$name (exit $rc, wanted 2 and one line /$pat/):"; echo "$out" | tail -5; fi
  [ "$before" = "$(find . -path ./sanitizer -prune -o -type f -print0 | sort -z | xargs -0 md5sum)" ] \
    || bad "$name: files changed: $(diff <(echo "$before") <(find . -path ./sanitizer -prune -o -type f -print0 | sort -z | xargs -0 md5sum) | head -4)"
}
cp "$MGT_SRC/examples/mlp.cfg" m.cfg
"$MGT_BIN" --model m.cfg "${S[@]}" --max-steps 2 --out run >run.log 2>&1 || { bad "a first run"; cat run.log; }
mkdir -p d && touch d/train-images-idx3-ubyte.gz d/t10k-labels-idx1-ubyte

# 1. The files the command reads.
refused "--timeline naming the model file" "--timeline m.cfg is the model file \(--model\)" \
  "$MGT_BIN" --model m.cfg "${S[@]}" --timeline m.cfg --out t1
ln -s m.cfg link.cfg && ln m.cfg hard.cfg
refused "... through a symbolic link" "--timeline link.cfg is the model file \(--model\), m.cfg" \
  "$MGT_BIN" --model m.cfg "${S[@]}" --timeline link.cfg --out t1
refused "... through a hard link" "--timeline hard.cfg is the model file \(--model\)" \
  "$MGT_BIN" --model m.cfg "${S[@]}" --timeline hard.cfg --out t1
refused "... spelled another way" "--timeline \./run/\.\./m.cfg is the model file" \
  "$MGT_BIN" --model m.cfg "${S[@]}" --timeline ./run/../m.cfg --out t1
refused "predict --output naming --weights" "--output run/weights.safetensors is the weights \(--weights\)" \
  "$MGT_BIN" predict --model m.cfg --weights run/weights.safetensors "${P[@]}" --output run/weights.safetensors
refused "predict --output naming the weights of --run" "--output \./run/weights.safetensors is the weights of --run" \
  "$MGT_BIN" predict --run run "${P[@]}" --output ./run/weights.safetensors
refused "predict --output naming the model copy of --run" "--output run/m.cfg is the model copy of --run" \
  "$MGT_BIN" predict --run run "${P[@]}" --output run/m.cfg
refused "--timeline naming --init-weights" "--timeline run/weights.safetensors is the initial weights \(--init-weights\)" \
  "$MGT_BIN" --model m.cfg --init-weights run/weights.safetensors "${S[@]}" --timeline run/weights.safetensors --out t1
refused "--timeline naming a data file" "--timeline d/train-images-idx3-ubyte.gz is the data file d/train-images-idx3-ubyte.gz of --data d" \
  "$MGT_BIN" --model m.cfg --data d --timeline d/train-images-idx3-ubyte.gz --out t1
refused "predict --output naming a data file" "--output d/t10k-labels-idx1-ubyte is the data file" \
  "$MGT_BIN" predict --model m.cfg --weights run/weights.safetensors --data d --output d/t10k-labels-idx1-ubyte

refused "--init-weights in the --out that --overwrite would empty" \
  "the initial weights \(--init-weights\) run/weights.safetensors is a file of the run folder run, which this run writes" \
  "$MGT_BIN" --model m.cfg --init-weights run/weights.safetensors "${S[@]}" --out run --overwrite

# 2. The files mgtrain keeps in a run folder: another run's, and this run's own (made later).
for f in checkpoint.safetensors metrics.jsonl run.json m.cfg; do
  refused "--timeline naming $f of another run" "--timeline run/$f is a file mgtrain keeps in the run folder .*/run" \
    "$MGT_BIN" --model m.cfg "${S[@]}" --timeline "run/$f" --out t1
done
tb=$(ls run/tb | head -1)
refused "--timeline naming its TensorBoard file" "--timeline run/tb/$tb is a file mgtrain keeps in the run folder" \
  "$MGT_BIN" --model m.cfg "${S[@]}" --timeline "run/tb/$tb" --out t1
refused "predict --output naming another run's best.safetensors (not there yet)" "--output run/best.safetensors is a file mgtrain keeps" \
  "$MGT_BIN" predict --model m.cfg --weights run/weights.safetensors "${P[@]}" --output run/best.safetensors
refused "--timeline naming a file of its own --out, not made yet" "--timeline new/weights.safetensors is a file this run keeps in its folder new" \
  "$MGT_BIN" --model m.cfg "${S[@]}" --timeline new/weights.safetensors --out new
refused "... its own model copy" "--timeline new/m.cfg is a file this run keeps in its folder new" \
  "$MGT_BIN" --model m.cfg "${S[@]}" --timeline new/m.cfg --out new
refused "... the default --out (runs/<model>)" "--timeline runs/m/checkpoint.safetensors is a file this run keeps in its folder runs/m" \
  "$MGT_BIN" --model m.cfg "${S[@]}" --timeline runs/m/checkpoint.safetensors
[ ! -e new ] && [ ! -e runs ] && [ ! -e t1 ] && ok "no run folder was made by a refused start" || bad "a refused start made a folder"
"$MGT_BIN" --model m.cfg "${S[@]}" --max-steps 2 --timeline new/timeline.json --out new >new.log 2>&1 \
  && [ -s new/timeline.json ] && [ -s new/weights.safetensors ] && ok "a timeline of another name in its own new --out is written" \
  || { bad "--timeline new/timeline.json --out new"; cat new.log; }

# 3. An existing file: refused unless mgtrain wrote it (a timeline of its own) or --overwrite.
echo '{"my": "notes"}' >notes.json
refused "--timeline naming a file mgtrain did not write" "--timeline notes.json already holds 16 bytes that mgtrain did not write; pass --overwrite" \
  "$MGT_BIN" --model m.cfg "${S[@]}" --max-steps 2 --timeline notes.json --out t2
"$MGT_BIN" --model m.cfg "${S[@]}" --max-steps 2 --timeline notes.json --out t3 --overwrite >t3.log 2>&1 \
  && grep -q traceEvents notes.json && ok "... replaced with --overwrite" || { bad "--overwrite"; cat t3.log; }
"$MGT_BIN" --model m.cfg "${S[@]}" --max-steps 2 --timeline notes.json --out t4 >t4.log 2>&1 \
  && ok "a timeline mgtrain wrote is replaced without --overwrite" || { bad "rewriting a timeline"; cat t4.log; }
"$MGT_BIN" predict --model m.cfg --weights run/weights.safetensors "${P[@]}" --output p.npy >p.log 2>&1 || { bad "predict"; cat p.log; }
refused "predict --output naming an existing file" "--output p.npy already holds [0-9]+ bytes; pass --overwrite to replace it" \
  "$MGT_BIN" predict --model m.cfg --weights run/weights.safetensors "${P[@]}" --output p.npy
"$MGT_BIN" predict --model m.cfg --weights run/weights.safetensors "${P[@]}" --output p.npy --overwrite >p2.log 2>&1 \
  && ok "... replaced with --overwrite" || { bad "predict --overwrite"; cat p2.log; }
: >empty.npy
"$MGT_BIN" predict --model m.cfg --weights run/weights.safetensors "${P[@]}" --output empty.npy >p3.log 2>&1 && [ -s empty.npy ] \
  && ok "an empty file (mktemp's) is written without --overwrite" || { bad "predict into an empty file"; cat p3.log; }

# 4. A folder that does not exist or cannot be written: said at the start, not after training.
refused "--timeline in a folder that does not exist" "--timeline nodir/t.json: the folder .*/nodir does not exist; create it" \
  "$MGT_BIN" --model m.cfg "${S[@]}" --timeline nodir/t.json --out t5
refused "predict --output in a folder that does not exist" "--output nodir/p.npy: the folder .*/nodir does not exist" \
  "$MGT_BIN" predict --model m.cfg --weights run/weights.safetensors "${P[@]}" --output nodir/p.npy
if unshare -m true 2>/dev/null; then
  mkdir ro
  out=$(unshare -m sh -c 'mount --bind ro ro && mount -o remount,ro,bind ro && exec "$@"' sh \
    "$MGT_BIN" --model m.cfg "${S[@]}" --timeline ro/t.json --out t6 2>&1); rc=$?
  [ $rc -eq 2 ] && grep -q "^mgtrain: --timeline ro/t.json: cannot write in .*/ro (Read-only file system)" <<<"$out" && [ ! -e t6 ] \
    && ok "--timeline in a read-only folder: refused at the start" || { bad "read-only --timeline: exit $rc"; echo "$out"; }
else
  echo "note: unshare -m is not permitted here (not root?); the read-only folder check does not run"
fi
ls -a . run | grep '\.tmp\.' >/dev/null && bad "temporary files left: $(ls -a . run | grep '\.tmp\.')" || ok "no temporary file left"
finish
