#!/usr/bin/env bash
# labels: cli
# cores: 1
# Bad input gets one clear message naming the thing and what to do, a non-zero exit, and loses
# nothing.
source "$(dirname "$0")/lib.bash"
cfg() { printf '%s\n' "$@" >m.cfg; }
base=(--data synthetic --verbose 0 --max-steps 2)
# one_line NAME PATTERN CMD... : an error every rank meets: exit status 2, exactly one line.
one_line() {
  local name=$1 pat=$2; shift 2
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -qE -- "$pat" <<<"$out"; then ok "$name"
  else bad "$name (exit $rc, wanted 2 and one line /$pat/):"; echo "$out" | head -20; fi
}
# Open MPI's -q keeps mpirun's own notice about a non-zero exit status out of the output.
quiet_mpi() { local np=$1; shift; timeout 120 mpirun -q --oversubscribe --bind-to none -np "$np" "$MGT_BIN" "$@"; }

# Errors every rank meets end with one line from rank 0 and exit 2 on every rank, never with
# MPI_Abort's banner, however the ranks race: many times under mpirun -np 2.
one_line "flag typo, one process" "^mgtrain: unknown flag --epoch .*did you mean --epochs" "$MGT_BIN" --epoch 3
odd=0
for i in $(seq 20); do
  out=$(quiet_mpi 2 --epoch 3 2>&1); rc=$?
  if [ $rc -ne 2 ] || [ "$(wc -l <<<"$out")" -ne 1 ] || ! grep -q "^mgtrain: unknown flag --epoch" <<<"$out"; then
    odd=$((odd + 1)); echo "run $i: exit $rc:"; echo "$out" | head -12
  fi
done
[ $odd -eq 0 ] && ok "flag typo under mpirun -np 2, 20 runs: one line and exit 2 every time" || bad "flag typo under mpirun: $odd of 20 runs differ"
odd=0
for i in $(seq 5); do # without -q mpirun adds its notice, after our line, and never an abort banner
  out=$(mpi 2 --epoch 3 2>&1); rc=$?
  if [ $rc -ne 2 ] || [ "$(grep -c "unknown flag" <<<"$out")" -ne 1 ] || ! head -1 <<<"$out" | grep "^mgtrain: unknown flag" >/dev/null ||
     grep -qE "MPI_ABORT|ORTE_ERROR_LOG|^rank [0-9]" <<<"$out"; then
    odd=$((odd + 1)); echo "run $i: exit $rc:"; echo "$out" | head -12
  fi
done
[ $odd -eq 0 ] && ok "plain mpirun: our line first and once, no MPI_ABORT banner, exit 2" || bad "plain mpirun: $odd of 5 runs differ"
one_line "bad model file under mpirun -np 2" "^mgtrain: nope.cfg|cannot open model file nope.cfg" quiet_mpi 2 --model nope.cfg
touch plainfile
one_line "output folder rank 0 cannot create, under mpirun -np 2" "^mgtrain: cannot create output folder plainfile/run" \
  quiet_mpi 2 --data synthetic --out plainfile/run --verbose 0
one_line "single-dash flags are named as given" "^mgtrain: unknown flag -xy for mgtrain train: flags are spelled out" "$MGT_BIN" -xy
one_line "a value on a flag that takes none" "^mgtrain: --resume takes no value" "$MGT_BIN" --resume=yes
one_line "--lr beyond float32" "^mgtrain: --lr 1e39: expected a positive number" "$MGT_BIN" --lr 1e39 --data synthetic
long=$(printf 'd%.0s' $(seq 600))
one_line "--out over 511 characters" "^mgtrain: --out d{40}\.\.\.: the path has 600 characters, more than the 511" "$MGT_BIN" --out "$long" --data synthetic
[ ! -e "$long" ] && [ ! -e "${long:0:511}" ] && ok "nothing created for the over-long --out" || bad "an over-long --out created something"
# A device of the test's own (a copy of /dev/null's node; a pipe where nodes cannot be made), so
# that a regression replaces nothing outside the test's folder.
mknod devnull c 1 3 2>/dev/null && kind="a device" || { mkfifo devnull; kind="a pipe"; }
one_line "--timeline naming a device" "^mgtrain: --timeline devnull is $kind, not a regular file" "$MGT_BIN" --timeline devnull --data synthetic --out tl
one_line "predict --output naming a device" "^mgtrain: --output devnull is $kind" \
  "$MGT_BIN" predict --output devnull --weights none.safetensors --data synthetic
[ ! -f devnull ] && [ ! -e tl ] && ok "the device is still one and no run was started" || bad "the device was replaced or a run started"
one_line "--out naming a file" "^mgtrain: --out plainfile exists and is not a folder" "$MGT_BIN" --out plainfile --data synthetic

expect_fail "unknown flag suggests the closest" "unknown flag --epoch .*did you mean --epochs" "$MGT_BIN" --epoch 3
expect_fail "another trainer's name for a flag" "unknown flag --learning-rate .*did you mean --lr\?" "$MGT_BIN" --learning-rate 0.1
expect_fail "a flag in Python's spelling" "unknown flag --batch_size .*did you mean --batch-size\?" "$MGT_BIN" --batch_size 64
expect_fail "bad flag value" "--epochs x: expected a whole number" "$MGT_BIN" --epochs x
expect_fail "unknown command" "unknown command 'trian' \(did you mean 'train'" "$MGT_BIN" trian
expect_fail "flag of another command" "--output does not apply to mgtrain train" "$MGT_BIN" --output x.npy
expect_fail "bad optimizer" "--optimizer adma: unknown \(did you mean adam\?\)" "$MGT_BIN" --optimizer adma
expect_fail "missing model file" "cannot open model file nope.cfg" "$MGT_BIN" --model nope.cfg

cfg "[input]" "shape = 28,28,1" "[dense]" "units = 10" "[dense]" "unit = 10" "[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 8"
expect_fail "unknown key, file:line, suggestion" "m.cfg:6: \[dense\] has no key 'unit' \(did you mean 'units'\?\)" "$MGT_BIN" --model m.cfg "${base[@]}"
cfg "[input]" "shape = 28,28,1" "[flatten]" "[dense]" "activation = relu" "[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 8"
expect_fail "missing required key, at its section's line" "m.cfg:4: \[dense\] is missing the required key 'units'" "$MGT_BIN" --model m.cfg "${base[@]}"
cfg "[input]" "shape = 28,28,1" "[flatten]" "[dense]" "units = ten" "[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 8"
expect_fail "bad value" "m.cfg:5: \[dense\] units = ten: expected a positive whole number" "$MGT_BIN" --model m.cfg "${base[@]}"
cfg "[input]" "shape = 28,28,1" "[conv2d]" "filters = 4" "kernel = 30" "[flatten]" "[dense]" "units = 10" "[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 8"
expect_fail "impossible shape" "m.cfg:3: \[conv2d\] conv2d_1: kernel = 30,30 does not fit the 28x28 input" "$MGT_BIN" --model m.cfg "${base[@]}"
# Every number of a model file and every number flag has a range, and a value beyond it is named
# with the range, rather than taken for what it overflows to (center_crop = 1e-9 made an
# evaluation size beyond any int, which then read as 1).
T_=(--model m.cfg "${base[@]}")
range() { # range NAME PATTERN EXTRA-LINE SECTION-OF-IT...: the MLP with EXTRA-LINE after [SECTION]
  local name=$1 pat=$2 line=$3 section=$4
  sed "s/^\[$section\]\$/[$section]\n$line/" "$MGT_SRC/examples/mlp.cfg" >m.cfg
  grep -qF -- "${line%%\\n*}" m.cfg || { bad "$name: no [$section] in examples/mlp.cfg"; return; }
  one_line "$name" "$pat" "$MGT_BIN" "${T_[@]}"
}
range "[input] center_crop = 1e-9" "^mgtrain: m.cfg:[0-9]+: \[input\] center_crop = 1e-9: expected .* from 0.05 to 1" "center_crop = 1e-9" input
range "[input] mean = 1e30" "\[input\] mean = 1e30: expected one number per channel .*each from -1000 to 1000" "mean = 1e30\nstd = 1" input
range "[input] std = 0" "\[input\] std = 0: expected one number per channel .*each from 0.0001 to 1000" "mean = 0.5\nstd = 0" input
range "[train] augment_ratio = 0.001, 1" "augment_ratio = 0.001, 1: expected two numbers MIN, MAX with 0.01 <= MIN <= MAX <= 100" "augment_ratio = 0.001, 1" train
range "[train] lr_decay_epochs = 1e30" "lr_decay_epochs = 1e30: expected a number of epochs in \(0, 1e\+06\]" "lr_decay_epochs = 1e30\nlr_schedule = step" train
cfg "[input]" "shape = 8,8,1" "[batchnorm]" "epsilon = 5" "[flatten]" "[dense]" "units = 10" "[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 8"
one_line "[batchnorm] epsilon = 5" "m.cfg:4: \[batchnorm\] epsilon = 5: expected a number in \(0, 1\]" "$MGT_BIN" "${T_[@]}"
one_line "--val-split 1" "^mgtrain: --val-split 1: expected a number from 1e-06 to 0.999" "$MGT_BIN" --val-split 1 "${base[@]}"
one_line "--comm-timeout 0" "^mgtrain: --comm-timeout 0: expected a number from 1 to 1e\+07" "$MGT_BIN" --comm-timeout 0 "${base[@]}"

# What mgtrain prints must reach standard output: a full device or a closed one is said in one
# line on standard error, exit 2.
for what in "--help" "--version" "summary" "train --data synthetic --synthetic-samples 256 --max-steps 2 --verbose 2 --out full"; do
  # shellcheck disable=SC2086 # the words of the command
  out=$("$MGT_BIN" $what 2>&1 >/dev/full); rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q "^mgtrain: cannot write to standard output.*what mgtrain printed is incomplete" <<<"$out" \
    && ok "mgtrain $what >/dev/full: one line, exit 2" || { bad "mgtrain $what >/dev/full: exit $rc"; echo "$out"; }
done
out=$("$MGT_BIN" summary 2>&1 >&-); rc=$?
[ $rc -eq 2 ] && grep -q "^mgtrain: cannot write to standard output (Bad file descriptor)" <<<"$out" \
  && ok "mgtrain summary with standard output closed: said, exit 2" || { bad "summary >&-: exit $rc"; echo "$out"; }
[ ! -e full/mgtrain.lock ] && [ -s full/weights.safetensors ] && ok "the run into /dev/full kept its files and left no lock" || bad "full: $(ls full)"

cfg "[input]" "shape = 28,28,1" "[dense]" "units = 10" "[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 8"
expect_fail "dense on an image" "needs a flat input .* put a \[flatten\] section before it" "$MGT_BIN" --model m.cfg "${base[@]}"
cfg "[input]" "shape = 28,28,1" "[flaten]" "[dense]" "units = 10" "[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 8"
expect_fail "unknown section" "m.cfg:3: unknown section \[flaten\] \(did you mean \[flatten\]\?\)" "$MGT_BIN" --model m.cfg "${base[@]}"
cfg "[input]" "shape = 28,28,1" "[flatten]" "[dense]" "units = 10" "units = 12" "[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 8"
expect_fail "key given twice" "m.cfg:6: \[dense\] units is given twice" "$MGT_BIN" --model m.cfg "${base[@]}"
cfg "[input]" "shape = 28,28,1" "[flatten]" "[dense]" "units = 10" "[train]" "optimizer = sgd" "batch_size = 8"
expect_fail "missing loss" "m.cfg:6: \[train\] is missing the required key 'loss'" "$MGT_BIN" --model m.cfg "${base[@]}"
cfg "[input]" "shape = 28,28,1" "[flatten]" "[dense]" "units = 10" "[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 8" "garbage line"
expect_fail "unparsable line" "m.cfg:10: cannot read this line" "$MGT_BIN" --model m.cfg "${base[@]}"
# A UTF-8 byte-order mark (Windows editors write one) is no part of the first line; a NUL byte is
# named where it is (it used to end the line there and report the key after it as missing); a
# UTF-16 file is named as such.
{ printf '\xef\xbb\xbf'; grep -v '^[#;]' "$MGT_SRC/examples/mlp.cfg" | grep .; } >bom.cfg
out=$("$MGT_BIN" summary --model bom.cfg 2>&1) && grep -q "Total params: 269,322" <<<"$out" \
  && ok "a model file starting with a UTF-8 byte-order mark is read as without it" || { bad "UTF-8 BOM"; echo "$out" | head -5; }
sed 's/^loss = \(.*\)/loss = \1\x00 trailing/' "$MGT_SRC/examples/mlp.cfg" >nul.cfg
line=$(grep -an '^loss' nul.cfg | cut -d: -f1)
one_line "a NUL byte in a line" "^mgtrain: nul.cfg:$line: a NUL byte \(character [0-9]+ of the line\): a model file is plain text" \
  "$MGT_BIN" summary --model nul.cfg
printf '[input]\nshape = 28,28,1\n' | iconv -f UTF-8 -t UTF-16 >utf16.cfg
one_line "a UTF-16 model file" "^mgtrain: utf16.cfg:1: the file is UTF-16 text .*save it as UTF-8" "$MGT_BIN" summary --model utf16.cfg

# A layer named so that its tensor takes another layer's tensor's name (s.depthwise.weight of the
# separable convolution s): found with the model, by summary too, before any step.
cfg "[input]" "shape = 8,8,2" "[separable_conv2d]" "name = s" "filters = 4" "kernel = 3" "[depthwise_conv2d]" \
  "name = s.depthwise" "kernel = 3" "[flatten]" "[dense]" "units = 3" "[train]" "optimizer = sgd" \
  "loss = sparse_categorical_crossentropy" "batch_size = 8"
one_line "tensor names that collide, summary" \
  "^mgtrain: m.cfg:7: \[depthwise_conv2d\] s.depthwise: its tensor 's.depthwise.weight' has the name of a tensor of layer s \(line 3\).*rename one of the two layers" \
  "$MGT_BIN" summary --model m.cfg
one_line "tensor names that collide, train" "^mgtrain: m.cfg:7: .*'s.depthwise.weight'" "$MGT_BIN" --model m.cfg "${base[@]}" --out collide
[ ! -e collide ] && ok "... and nothing was trained" || bad "a run started with colliding tensor names"

# Two [dense] in a row and an empty [flatten] are separate layers (libinih alone merges them).
cfg "[input]" "shape = 4,4,1" "[flatten]" "[dense]" "units = 8" "[dense]" "units = 3" "[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 8"
out=$("$MGT_BIN" summary --model m.cfg 2>&1)
grep -q "flatten_1 (flatten) *(16)" <<<"$out" && grep -q "dense_1 (dense) *(8) *136" <<<"$out" && grep -q "dense_2 (dense) *(3) *27" <<<"$out" \
  && ok "repeated and empty sections are separate layers" || { bad "summary of repeated sections"; echo "$out"; }

# Capacities: tables grow with the model, sizes are computed in 64 bits and checked.
python3 - <<'PY'
cfg = ["[input]", "shape = 4,4,1", "[flatten]"]
for i in range(200):
    cfg += ["[dense]", "units = 8", "activation = relu"]
cfg += ["[dense]", "units = 3", "[train]", "optimizer = sgd", "loss = sparse_categorical_crossentropy", "batch_size = 8"]
open("deep.cfg", "w").write("\n".join(cfg) + "\n")
wide = ["[input]", "shape = 1,1,1"] + ["[activation]", "type = relu"] * 4097 + ["[dense]", "units = 2"]
open("many.cfg", "w").write("\n".join(wide) + "\n[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\nbatch_size = 8\n")
PY
s=$("$MGT_BIN" summary --model deep.cfg 2>&1)
grep -qE "dense_129 \(dense\) *\(8\) relu *72( |$)" <<<"$s" && grep -qE "dense_201 \(dense\) *\(3\) *27( |$)" <<<"$s" && grep -q "Total params: 14,491" <<<"$s" \
  && ok "201 dense layers: every layer's parameters counted" || { bad "summary of 201 dense layers"; tail -5 <<<"$s"; }
"$MGT_BIN" --model deep.cfg --data synthetic --max-steps 2 --verbose 0 --out deep >deep.log 2>&1 && [ -s deep/weights.safetensors ] \
  && ok "201 dense layers train" || { bad "201 dense layers do not train"; tail -5 deep.log; }
one_line "more layers than supported" "^mgtrain: many.cfg:[0-9]+: more than 4096 layers" "$MGT_BIN" summary --model many.cfg
too_large() { # too_large NAME PATTERN MODEL-LINES... : the model is refused as too large, nothing overflows
  local name=$1 pat=$2 out rc; shift 2
  cfg "$@"
  out=$("$MGT_BIN" --model m.cfg "${base[@]}" 2>&1); rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "model too large" <<<"$out" && grep -qE -- "$pat" <<<"$out"; then ok "$name"
  else bad "$name (exit $rc):"; echo "$out" | head -5; fi
}
T=("[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 8")
too_large "input of 100000x100000x3" "m.cfg:2: \[input\] shape = 100000,100000,3: .*30000000000 values" "[input]" "shape = 100000,100000,3" "[flatten]" "[dense]" "units = 10" "${T[@]}"
too_large "kernel of 2e9" "m.cfg:3: \[conv2d\] conv2d_1: .*weight" "[input]" "shape = 28,28,1" "[conv2d]" "filters = 4" "kernel = 2000000000" "padding = same" "[flatten]" "[dense]" "units = 10" "${T[@]}"
too_large "stride and kernel near INT_MAX" "m.cfg:3: \[conv2d\]" "[input]" "shape = 28,28,3" "[conv2d]" "filters = 1" "kernel = 2147483647,2" "stride = 2147483647" "padding = same" "[flatten]" "[dense]" "units = 10" "${T[@]}"
too_large "dense of 2e9 units" "m.cfg:4: \[dense\] dense_1: .*weight" "[input]" "shape = 28,28,1" "[flatten]" "[dense]" "units = 2000000000" "[dense]" "units = 10" "${T[@]}"
too_large "conv output over 2^31 values" "m.cfg:3: \[conv2d\] conv2d_1: model too large: its output holds 3211264000" "[input]" "shape = 28,28,1" "[conv2d]" "filters = 4096000" "kernel = 1" "[flatten]" "[dense]" "units = 10" "${T[@]}"
cfg "[input]" "shape = 4000,4000,3" "[flatten]" "[dense]" "units = 10" "[train]" "optimizer = sgd" "loss = sparse_categorical_crossentropy" "batch_size = 1000"
one_line "a batch too large for the model, on 2 ranks" "^mgtrain: model too large for a local batch of 500: the input holds 48000000 values per sample.*at most .*44 samples" \
  quiet_mpi 2 --model m.cfg --data synthetic --verbose 0

# Data files: truncated, lying, missing.
mkdir -p d
python3 - <<'PY'
import gzip, struct
def idx(path, magic, dims, data):
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + data)
idx("d/train-images-idx3-ubyte", 0x803, (100, 28, 28), bytes(100 * 784))
idx("d/train-labels-idx1-ubyte", 0x801, (100,), bytes([3] * 100))
idx("d/t10k-images-idx3-ubyte", 0x803, (20, 28, 28), bytes(20 * 784))
idx("d/t10k-labels-idx1-ubyte", 0x801, (20,), bytes([1] * 20))
PY
"$MGT_BIN" --data d --batch-size 10 --max-steps 2 --verbose 0 --out ok >/dev/null 2>&1 && ok "small valid IDX set trains" || bad "small valid IDX set"
head -c 50000 d/train-images-idx3-ubyte >d/x && mv d/x d/train-images-idx3-ubyte
expect_fail "truncated images file" "train-images-idx3-ubyte.*truncated" "$MGT_BIN" --data d --batch-size 10 --verbose 0
python3 -c "
import struct; open('d/train-images-idx3-ubyte','wb').write(struct.pack('>IIII',0x803,100,28,28)+bytes(100*784))
open('d/train-labels-idx1-ubyte','wb').write(struct.pack('>II',0x801,100)+bytes([12]*100))"
expect_fail "label beyond the classes" "label 12 .*10 classes" "$MGT_BIN" --data d --batch-size 10 --verbose 0
python3 -c "open('d/train-labels-idx1-ubyte','wb').write(bytes(16))"
expect_fail "wrong magic" "train-labels-idx1-ubyte.*magic" "$MGT_BIN" --data d --batch-size 10 --verbose 0
expect_fail "missing data folder" "pass --data" "$MGT_BIN" --data /nonexistent --verbose 0
# ... named before the run folder, here one that holds a run (the first mistake of the line first).
expect_fail "a missing data folder before a run folder in use" \
  "^mgtrain: --data /nonexistent: no such folder; pass --data with a folder" \
  "$MGT_BIN" --data /nonexistent --out ok --verbose 0
# A pipe as a data file or a model file is refused at once (it used to hang with no output).
mkdir -p fifo && cp d/t10k-* d/train-labels-idx1-ubyte fifo/ && mkfifo fifo/train-images-idx3-ubyte m.fifo
one_line "a pipe as a data file" "^mgtrain: fifo/train-images-idx3-ubyte is not a regular file" \
  timeout 60 "$MGT_BIN" --data fifo --batch-size 10 --verbose 0
one_line "a pipe as the model file" "^mgtrain: model file m.fifo is not a regular file" timeout 60 "$MGT_BIN" --model m.fifo --data synthetic
# A folder with both .npy and IDX files: which is meant cannot be told; refused, naming both.
mkdir -p both && cp d/train-* d/t10k-* both/ && touch both/train_x.npy both/train_y.npy
one_line "a data folder with .npy and IDX files" \
  "^mgtrain: both holds data in two formats, .npy \(both/train_x.npy\) and IDX \(both/train-images-idx3-ubyte[.gz]*\).*move one of them into a folder of its own" \
  "$MGT_BIN" --data both --batch-size 10 --verbose 0 --out both-run
[ ! -e both-run ] && ok "... and nothing was started" || bad "a run folder was made for an ambiguous data folder"

# Weights that belong to another model; checkpoints are never overwritten by a failed start.
"$MGT_BIN" --data synthetic --max-steps 3 --batch-size 16 --out mlp --verbose 0 >/dev/null 2>&1 || bad "mlp run"
expect_fail "weights of another model" "has no tensor 'conv2d_1.weight'.*another model" "$MGT_BIN" eval --model "$MGT_SRC/examples/convnet.cfg" --weights mlp/weights.safetensors --data synthetic
cfg "[input]" "shape = 28,28,1" "[flatten]" "[dense]" "units = 128" "activation = relu" "[dense]" "units = 256" "activation = relu" "[dense]" "units = 10" "[train]" "optimizer = adam" "loss = sparse_categorical_crossentropy" "batch_size = 8"
expect_fail "same names, other shapes" "tensor 'dense_1.weight' has shape \[256,784\] but model m needs \[128,784\]" "$MGT_BIN" --model m.cfg --init-weights mlp/weights.safetensors --data synthetic
head -c 3000 mlp/weights.safetensors >cut.safetensors
expect_fail "truncated weights file" "cut.safetensors.*(truncated|shorter|beyond)" "$MGT_BIN" eval --weights cut.safetensors --data synthetic
python3 -c "
b=bytearray(open('mlp/weights.safetensors','rb').read()); b[-5]^=0xff; open('flip.safetensors','wb').write(b)"
expect_fail "damaged weights file" "flip.safetensors.*CRC" "$MGT_BIN" eval --weights flip.safetensors --data synthetic
sum=$(md5sum mlp/checkpoint.safetensors)
expect_fail "resume with another batch size" "the run in mlp was trained with other settings.*--batch-size 32 \(the run: 16\)" "$MGT_BIN" --data synthetic --batch-size 32 --out mlp --resume --verbose 0
expect_fail "resume with another optimizer" "--optimizer sgd \(the run: adam\)" "$MGT_BIN" --data synthetic --batch-size 16 --optimizer sgd --out mlp --resume --verbose 0
[ "$sum" = "$(md5sum mlp/checkpoint.safetensors)" ] && ok "checkpoint untouched by failed resumes" || bad "checkpoint changed"
expect_fail "resume without checkpoint" "no checkpoint at nowhere/checkpoint.safetensors" "$MGT_BIN" --data synthetic --out nowhere --resume
# The CRC covers the header and a checkpoint must have one: a step changed in the header, or the
# crc32 removed and a data byte damaged, are refused.
mkdir -p edit1 edit2
python3 - <<'PY'
import json, struct
b = open("mlp/checkpoint.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h, data = b[8:8 + n], bytearray(b[8 + n:])
step = json.loads(h)["__metadata__"]["step"]
open("edit1/checkpoint.safetensors", "wb").write(b[:8] + h.replace(b'"step":"%s"' % step.encode(), b'"step":"%d"' % (int(step) + 1)) + data)
j = json.loads(h)
del j["__metadata__"]["crc32"], j["__metadata__"]["crc32_covers"]
data[100] ^= 0x40
j = json.dumps(j, separators=(",", ":")).encode()
j += b" " * (-len(j) % 8)
open("edit2/checkpoint.safetensors", "wb").write(struct.pack("<Q", len(j)) + j + data)
PY
expect_fail "a checkpoint whose header was edited" "edit1/checkpoint.safetensors: CRC mismatch.*header and data" \
  "$MGT_BIN" --data synthetic --batch-size 16 --out edit1 --resume --verbose 0
expect_fail "a checkpoint without its crc32, damaged" "edit2/checkpoint.safetensors: no crc32 in a file mgtrain wrote" \
  "$MGT_BIN" --data synthetic --batch-size 16 --out edit2 --resume --verbose 0
mkfifo w.fifo
expect_fail "a pipe as --init-weights" "w.fifo is not a regular file" timeout 60 "$MGT_BIN" --init-weights w.fifo --data synthetic --out fifo-run
expect_fail "output folder that cannot exist" "cannot create output folder" "$MGT_BIN" --data synthetic --out /proc/nope/run

# Weights with a NaN (no CRC, as PyTorch writes them) are refused at load, naming the tensor.
python3 - <<'PY'
import json, struct
b = open("mlp/weights.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h.pop("__metadata__")
data = bytearray(b[8 + n:])
begin = h["dense_2.bias"]["data_offsets"][0]
data[begin + 12:begin + 16] = struct.pack("<f", float("nan"))
j = json.dumps(h).encode()
j += b" " * (-len(j) % 8)
open("nan.safetensors", "wb").write(struct.pack("<Q", len(j)) + j + data)
PY
expect_fail "NaN in --init-weights names the file and the tensor" "nan.safetensors: tensor 'dense_2.bias' holds a NaN at index 3" \
  "$MGT_BIN" --init-weights nan.safetensors --data synthetic --out nanrun --verbose 0
[ ! -e nanrun/checkpoint.safetensors ] && ok "nothing trained from NaN weights" || bad "a run started from NaN weights"

# Device placement errors that need no GPU to check.
expect_fail "bad --gpus list" "--gpus 0,x: expected a comma-separated list of device numbers" "$MGT_BIN" --gpus 0,x --data synthetic
expect_fail "--gpus with a repeated id" "--gpus 1,1: device 1 is listed twice" "$MGT_BIN" --gpus 1,1 --data synthetic
expect_fail "--device gpu without a GPU" "--device gpu: .*(no GPU backend|no usable GPU).*run with --device cpu" "$MGT_BIN" --device gpu --data synthetic
expect_fail "unknown device" "--device tpu: unknown; use cpu, gpu or auto" "$MGT_BIN" --device tpu --data synthetic

# More ranks than samples per global batch.
expect_fail "too many ranks" "3 ranks but the global batch is 2: .*start at most 2 ranks" mpi 3 --data synthetic --batch-size 2
ls -a mlp ok | grep tmp >/dev/null && bad "temporary files left behind" || ok "no temporary files anywhere"
finish
