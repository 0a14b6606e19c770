#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# cores: 1
# .npy datasets and augmentation end to end, with files written by numpy itself:
#  1. the example of docs/data.md writes a folder that mgtrain trains on, and predict --run takes
#     the --input-shape a run trained with;
#  2. a 3-channel set (uint8 x, int64 / uint8 (N, 1) labels) trains the same weights on 1 and 2
#     ranks, and its float32 copy (x / 255 computed in float32) the same weights as the bytes;
#  3. with augment_flip and augment_crop, 1, 2 and 3 ranks (a batch of 32 that 3 does not divide)
#     train the same weights, which differ from those of the run without augmentation, and it
#     learns; a run stopped mid-epoch and resumed draws the same transforms (bit-exact); eval and predict do not augment; --val-split works on .npy data, with or without a
#     test split;
#  4. bad files, shapes and labels fail through the real binary, on 2 ranks with one message, and
#     leave no output folder behind.
#
# Tolerances. A step's gradient on R ranks is the sum of R partial sums instead of one sum over
# the batch, so it differs by float32 rounding, at most about (B/R + R) * 2^-24 = 2e-6 of the sum
# of |terms| for B = 32; 24 SGD steps at lr 0.05 add up such differences without amplifying them
# (the model is small and smooth, the steps few), leaving about 1e-6 relative on the weights:
# 1e-5 allows 10x. The model is smooth (tanh, average pooling) on purpose: a ReLU or max-pool
# gate within rounding of its threshold could flip between rank counts, which moves a unit's
# weights by far more than rounding (tests/cli/invariance.sh).
# uint8 and its float32 copy give bit-identical inputs (one correctly rounded float32 division
# each), hence identical weights: tolerance 0. Augmentation on vs off changes the inputs of almost
# every sample, so the weights differ by far more than rounding: they must NOT agree to 1e-3.
source "$(dirname "$0")/lib.bash"
PY=/usr/bin/python3
/usr/bin/python3 -c "import numpy" 2>/dev/null || PY=python3
"$PY" -c "import numpy" 2>/dev/null || { echo "SKIPPED: no python3 with numpy (tests/run installs python3-numpy)"; exit 77; }

# 1. The example of docs/data.md, verbatim.
awk '/^```python$/{n++; p = n == 1; next} /^```$/{p=0} p' "$MGT_SRC/docs/data.md" >example.py  # the first: the images'
[ "$(wc -l <example.py)" -eq 6 ] && ok "the example of docs/data.md is 6 lines" || bad "docs/data.md's example: $(wc -l <example.py) lines"
"$PY" example.py || bad "docs/data.md's example failed"
cat >readme.cfg <<'CFG'
[input]
shape = 32,32,3
[conv2d]
filters = 4
kernel = 3
stride = 2
activation = relu
[flatten]
[dense]
units = 10
[train]
optimizer = sgd
loss = sparse_categorical_crossentropy
batch_size = 100
CFG
out=$(mpi 2 --model readme.cfg --data mydata --verbose 2 --out readme 2>&1)
grep -q "^Test loss: .* - test acc: " <<<"$out" && [ -f readme/weights.safetensors ] \
  && ok "the example's folder trains on 2 ranks" || { bad "training on the example's folder"; echo "$out" | tail -5; }
# A run trained with --input-shape: predict --run builds the model for the shape it trained
# (run.json's flag; its model copy is the file as written, for 28x28x1), one class a column.
mpi 1 --model "$MGT_SRC/examples/smallconv.cfg" --input-shape 32,32,3 --data mydata --max-steps 2 \
  --no-validation --verbose 0 --out shaped >shaped.log 2>&1 || { bad "training with --input-shape"; tail -5 shaped.log; }
out=$(mpi 2 predict --run shaped --data mydata --output shaped.npy 2>&1)
grep -qx "wrote shaped.npy: 100 x 10 float32 (logits of the last layer)" <<<"$out" &&
  ok "predict --run of a run trained with --input-shape: 100 x 10" ||
  { bad "predict --run of a run trained with --input-shape:"; echo "$out" | tail -5; }

# 2. A learnable 3-channel set (npy_data.py), as bytes and as float32 = bytes / 255.
data=(12 10 512 128 5)
"$PY" "$MGT_SRC/tests/cli/npy_data.py" u8 "${data[@]}" test_label_shape=N1 || bad "writing u8"
"$PY" "$MGT_SRC/tests/cli/npy_data.py" f32 "${data[@]}" float32 label_dtype=int32 || bad "writing f32"
mkdir -p bad
cfg() { # cfg NAME [EXTRA TRAIN KEYS...]
  local name=$1; shift
  { printf '%s\n' "[input]" "shape = 12,10,3" "[conv2d]" "filters = 6" "kernel = 3" \
      "activation = tanh" "algo = direct" "[avgpool]" "[flatten]" "[dense]" "units = 4" "[train]" \
      "optimizer = sgd" "learning_rate = 0.05" "loss = sparse_categorical_crossentropy" \
      "batch_size = 32"; printf '%s\n' "$@"; } >"$name.cfg"
}
cfg plain
cfg aug "augment_flip = true" "augment_crop = 2"
steps=(--epochs 2 --max-steps 24 --verbose 2) # 16 steps an epoch: into the second epoch
for np in 1 2; do
  mpi $np --model plain.cfg --data u8 "${steps[@]}" --out u8-np$np >u8-np$np.log 2>&1 || { bad "u8 np $np"; tail -5 u8-np$np.log; }
done
grep -q "data: u8$" u8-np1.log && ok "start-up block names the folder" || bad "data line: $(grep data: u8-np1.log)"
same "uint8 .npy, 3 channels: 1 vs 2 ranks" u8-np1/weights.safetensors u8-np2/weights.safetensors 1e-5
mpi 1 --model plain.cfg --data f32 "${steps[@]}" --out f32-np1 >f32.log 2>&1 || { bad "f32 run"; tail -5 f32.log; }
same "float32 .npy (x / 255) against uint8: identical" f32-np1/weights.safetensors u8-np1/weights.safetensors 0

# 3. Augmentation.
for np in 1 2 3; do
  mpi $np --model aug.cfg --data u8 "${steps[@]}" --out aug-np$np >aug-np$np.log 2>&1 || { bad "aug np $np"; tail -5 aug-np$np.log; }
done
grep -q "data: u8; augmented: horizontal flip, pad 2 and random crop" aug-np1.log \
  && ok "start-up block shows the augmentation" || bad "augmentation line: $(grep data: aug-np1.log)"
same "augmented: 1 vs 2 ranks" aug-np1/weights.safetensors aug-np2/weights.safetensors 1e-5
same "augmented: 1 vs 3 ranks (32 = 11 + 11 + 10)" aug-np1/weights.safetensors aug-np3/weights.safetensors 1e-5
# Stopped in the second epoch and resumed: the same draws, so bit for bit the same weights.
mpi 2 --model aug.cfg --data u8 --epochs 2 --max-steps 20 --verbose 0 --out aug-res >r1.log 2>&1 || { bad "aug first part"; tail -5 r1.log; }
mpi 2 --model aug.cfg --data u8 "${steps[@]}" --resume --out aug-res >r2.log 2>&1 || { bad "aug resumed"; tail -5 r2.log; }
same "augmented: stopped at step 20 and resumed = straight" aug-res/weights.safetensors aug-np2/weights.safetensors 0
if "$MGT_COMPARE" aug-np1/weights.safetensors u8-np1/weights.safetensors 1e-3 >cmp.log; then
  bad "augmentation changed nothing: $(tail -1 cmp.log)"
else ok "augmentation changes training: $(tail -1 cmp.log)"; fi
# Evaluation never augments: the model file's keys change nothing there.
e0=$(mpi 1 eval --model plain.cfg --data u8 --weights aug-np1/weights.safetensors 2>&1 | grep -o 'loss: [0-9.]* - .*')
e1=$(mpi 2 eval --model aug.cfg --data u8 --weights aug-np1/weights.safetensors 2>&1 | grep -o 'loss: [0-9.]* - .*')
[ -n "$e0" ] && [ "$e0" = "$e1" ] && ok "eval with augment keys = without ($e0)" || bad "eval '$e0' vs '$e1'"
mpi 1 predict --model plain.cfg --data u8 --weights aug-np1/weights.safetensors --output p0.npy >/dev/null 2>&1
mpi 2 predict --model aug.cfg --data u8 --weights aug-np1/weights.safetensors --output p1.npy >/dev/null 2>&1
same "predict with augment keys = without" p0.npy p1.npy 0
out=$(mpi 2 --model aug.cfg --data u8 --val-split 0.25 --epochs 2 --verbose 2 --out vs 2>&1)
grep -q "^Epoch 2/2 .* val_acc" <<<"$out" && ok "--val-split on .npy data" || { bad "--val-split"; echo "$out" | tail -5; }
mpi 2 --model aug.cfg --data u8 --epochs 6 --verbose 2 --out learn >learn.log 2>&1 || { bad "6 epochs"; tail -5 learn.log; }
"$PY" - learn.log <<'PY' && ok "augmented training learns the 3-channel set: $(grep -o 'Test loss.*' learn.log)" || bad "augmented run did not learn: $(grep -o 'Test loss.*' learn.log)"
import re, sys
loss = re.findall(r"Test loss: ([0-9.]+)", open(sys.argv[1]).read())
assert loss and float(loss[-1]) < 0.8, loss  # chance: ln 4 = 1.386; measured 0.42 after 6 epochs
PY

# 4. Bad input through the binary: one clear message, a non-zero exit, nothing written.
cp u8/test_x.npy u8/test_y.npy bad/
"$PY" -c "
import numpy as np
np.save('bad/train_x.npy', np.zeros((64, 12, 10, 3))); np.save('bad/train_y.npy', np.zeros(64, np.int64))"
expect_fail "float64 images, 2 ranks" "bad/train_x.npy: dtype float64; save the images as uint8 .* x.astype\(np.float32\)" mpi 2 --model plain.cfg --data bad --out o1
"$PY" -c "
import numpy as np
np.save('bad/train_x.npy', np.zeros((64, 3, 12, 10), np.uint8))"
expect_fail "channels-first images" "images are 3x12x10 \(H, W, C\) but the model's \[input\] shape is 12,10,3; the array looks channels-first .* x.transpose\(0, 2, 3, 1\)" "$MGT_BIN" --model plain.cfg --data bad --out o2
"$PY" -c "
import numpy as np
np.save('bad/train_x.npy', np.zeros((64, 12, 10, 3), np.uint8)); y = np.zeros(64, np.int16); y[37] = 4; np.save('bad/train_y.npy', y)"
expect_fail "label beyond the classes" "bad/train_y.npy: label 4 at index 37 is not below the model's 4 classes" mpi 2 --model plain.cfg --data bad --out o3
"$PY" -c "
import numpy as np
np.save('bad/train_y.npy', np.eye(4, dtype=np.int64)[np.zeros(64, int)])"
expect_fail "one-hot labels" "shape \(64, 4\); .* y.argmax\(axis=1\)" "$MGT_BIN" --model plain.cfg --data bad --out o4
"$PY" -c "
import numpy as np
np.save('bad/train_y.npy', np.zeros(64, np.int64))"
head -c 3000 bad/train_x.npy >cut && mv cut bad/train_x.npy
expect_fail "truncated images" "bad/train_x.npy: truncated: shape \(64, 12, 10, 3\) of \|u1 needs 23040 bytes" "$MGT_BIN" --model plain.cfg --data bad --out o5
rm bad/train_x.npy && mkfifo bad/train_x.npy
expect_fail "a FIFO is refused, not waited on" "bad/train_x.npy: not a regular file \(a FIFO\)" timeout 60 "$MGT_BIN" --model plain.cfg --data bad --out o6
rm bad/train_x.npy bad/test_x.npy bad/test_y.npy && cp u8/train_x.npy bad/ && cp u8/train_y.npy bad/
expect_fail "no test split" "no test_x.npy in bad: .*--val-split" "$MGT_BIN" --model plain.cfg --data bad --out o7
"$MGT_BIN" --model plain.cfg --data bad --val-split 0.2 --max-steps 2 --verbose 0 --out o8 >o8.log 2>&1 \
  && [ -f o8/weights.safetensors ] && ! grep -q "Test loss" o8.log \
  && ok "no test split: --val-split instead, and no final test" || { bad "--val-split without a test split"; tail -3 o8.log; }
mkdir idx && "$PY" -c "
import struct
open('idx/train-images-idx3-ubyte','wb').write(struct.pack('>IIII',0x803,64,12,10)+bytes(64*120))
open('idx/train-labels-idx1-ubyte','wb').write(struct.pack('>II',0x801,64)+bytes(64))"
expect_fail "IDX with a 3-channel model names .npy" "idx: IDX images have 1 channel but the model's \[input\] shape has 3; .*train_x.npy" "$MGT_BIN" --model plain.cfg --data idx --out o9
cfg badkey "augment_crop = -1"
expect_fail "bad augment_crop" "badkey.cfg:[0-9]+: \[train\] augment_crop = -1: expected the padding in pixels" "$MGT_BIN" --model badkey.cfg --data u8
cfg badkey "augment_flip = maybe"
expect_fail "bad augment_flip" "\[train\] augment_flip = maybe: expected true or false" "$MGT_BIN" --model badkey.cfg --data u8
left=$(ls -d o1 o2 o3 o4 o5 o6 o7 o9 2>/dev/null)
[ -z "$left" ] && ok "failed starts wrote nothing" || bad "output folders left by failed starts: $left"
finish
