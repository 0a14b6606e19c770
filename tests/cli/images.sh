#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# Image folders end to end, on trees the test makes itself with Pillow (images_data.py): JPEG and
# PNG, sizes from 64x400 to 512x384, greyscale, CMYK, palette, 16-bit, alpha, interlaced and
# progressive files, a nested folder.
#  1. mgtrain convert stores exactly Pillow's bytes (decode, torchvision's Resize of the whole
#     picture with Image.BILINEAR; with --square, Resize + CenterCrop), the same bytes for 1 and 3
#     threads and any shard size, and a stopped conversion run again keeps its finished shards
#     and ends with the same bytes;
#  2. the transforms equal an independent reference: each crop as torchvision's get_params draws
#     it on the original picture from the same counter-based numbers, mapped onto the stored one
#     and resized by Pillow (crop, then resize with the fractional box), flipped, then ToTensor
#     and Normalize in float32 (exactly: no tolerance; normalised on the transform's threads),
#     the fallback crop too, and the evaluation resize + centre crop of the original's geometry;
#     the same for --square; the batches are the same bytes on 1 and 3 threads; real photos
#     (Debian's lomiri-wallpapers-20.04) evaluate at 224 as torchvision does on the originals;
#     class folders whose names are not UTF-8 are numbered as ImageFolder numbers them;
#     and 2b. all of it again against PyPI's current Pillow (a virtual environment in the build
#     folder, made once: about 30 s), equal up to the order of Pillow's two passes;
#  3. training on an image set learns (10 classes, random-resized crops, flips, normalisation),
#     and reports top-5 accuracy; eval and predict read it;
#  4. augmented batches are the same on any rank count: 1, 2 and 3 ranks (a batch of 32 that 3
#     does not divide) and 1 or 2 loader threads train the same weights, and a run stopped mid-
#     epoch and resumed the same weights bit for bit;
#  5. every bad input is refused with its path and what to do, writing nothing (a 2 GiB .jpg
#     unread, --skip-bad with no readable image); --val-split holds out a share of every class;
#  6. convert owns only its files: a DST of other files, of .npy data, of another tree's set, or
#     inside SRC is refused before a byte is written; no output flag (--output, --timeline,
#     --algo-cache, --out) may name an image set's file; SIGTERM, SIGINT, SIGHUP and a closed
#     pipe stop a conversion with one line, exit 128 + the signal, no lock, no temporary file,
#     and the set says it is incomplete until the same command finishes it.
# Cost on 2 cores: about 2 minutes, 30 s of it making the PyPI Pillow environment the first time
# (left out under the sanitizers).
#
# Tolerances, as in npy.sh: R ranks sum R partial gradients instead of one sum over the batch,
# float32 rounding of about (B/R + R) * 2^-24 relative per step; 16 smooth (tanh, average pool)
# SGD steps leave ~1e-6 on the weights: 1e-5 allows 10x. Loader threads change no input byte and
# a resumed run redraws the same crops: tolerance 0.
source "$(dirname "$0")/lib.bash"
PY=/usr/bin/python3
"$PY" -c "import numpy, PIL" 2>/dev/null || PY=python3
if ! "$PY" -c "import numpy, PIL" 2>/dev/null; then
  echo "SKIPPED: no python3 with numpy and Pillow (tests/run installs python3-numpy and python3-pil)"
  exit 77
fi
: "${MGT_IMAGES_DUMP:?run through ctest}"
DATA_PY="$MGT_SRC/tests/cli/images_data.py"

# ---- 1. conversion ------------------------------------------------------------------------
"$PY" "$DATA_PY" tree train 10 16 1 --odd || bad "writing the training tree"
"$PY" "$DATA_PY" tree test 10 4 2 || bad "writing the test tree"
out=$("$MGT_BIN" convert train set --size 48 --threads 1 --shard-size 13 --verbose 2 2>&1)
rc=$?
[ $rc -eq 0 ] && grep -q "^train: 170 images of 10 classes in set" <<<"$out" \
  && ok "convert: 170 files of 10 classes into 14 shards" || { bad "convert (exit $rc)"; echo "$out" | tail -5; }
"$PY" "$DATA_PY" stored set train train 48 && ok "stored bytes are Pillow's" || bad "stored bytes differ from Pillow's"
"$MGT_BIN" convert train set3 --size 48 --threads 3 --shard-size 13 --verbose 0 >/dev/null 2>&1 || bad "convert, 3 threads"
same_files() { # same_files A B: every .npy of A is byte for byte the one of B
  local f n=0
  for f in "$1"/*.npy; do
    n=$((n + 1))
    cmp -s "$f" "$2/${f##*/}" || { echo "differs: $f"; return 1; }
  done
  [ "$n" -gt 0 ] && [ "$(ls "$2"/*.npy | wc -l)" -eq "$n" ]
}
same_files set set3 && ok "1 and 3 threads write the same bytes" || bad "thread count changed the bytes"
"$MGT_BIN" convert train one --size 48 --threads 2 --verbose 0 >/dev/null 2>&1 || bad "convert, one shard"
"$PY" -c "
import numpy as np, json, sys
def load(d):
    s = json.load(open(d + '/images.json'))['splits']['train']['shards']
    return np.concatenate([np.load(d + '/' + x['name'] + '_x.npy') for x in s])
sys.exit(0 if np.array_equal(load('set'), load('one')) else 1)" \
  && ok "one shard of 170 holds the 14 shards' images" || bad "shard size changed the images"
# A stopped conversion: shard 3 unfinished (no record), shard 7's images cut short, a killed
# writer's temporary file; the same command keeps the rest and ends with the same bytes.
cp -r set stopped
rm stopped/train-00003.json
"$PY" -c "
import json; m = json.load(open('stopped/images.json')); m['splits']['train']['complete'] = False
json.dump(m, open('stopped/images.json', 'w'))"
head -c 1000 set/train-00007_x.npy >stopped/train-00007_x.npy
echo junk >stopped/train-00009_x.npy.tmp.999999
out=$("$MGT_BIN" convert train stopped --size 48 --shard-size 13 --verbose 2 2>&1)
grep -q "12 shards (.*) already done, kept" <<<"$out" && same_files set stopped \
  && [ ! -e stopped/train-00009_x.npy.tmp.999999 ] \
  && ok "a stopped conversion is finished by the same command: 12 shards kept, same bytes" \
  || { bad "resumed conversion"; echo "$out" | tail -3; }
out=$("$MGT_BIN" convert train set --size 48 --shard-size 13 --verbose 2 2>&1)
grep -q "14 shards (170 files) already done, kept" <<<"$out" && ok "converting again: nothing to redo" \
  || { bad "converting a finished set again"; echo "$out" | tail -3; }
"$MGT_BIN" convert test set --size 48 --split test --verbose 0 >/dev/null 2>&1 || bad "convert the test split"
"$PY" "$DATA_PY" stored set test test 48 >/dev/null && ok "test split stored beside the training split" \
  || bad "test split"

# Class folders whose names are not all UTF-8 get ImageFolder's numbers: Python sorts the str of
# os.scandir (bytes that are not UTF-8 as U+DC80..U+DCFF), not the bytes (U+E000 is EE 80 80,
# before FF in byte order, after U+DCFF in Python's).
"$PY" - <<'PY' && "$MGT_BIN" convert enc encset --size 16 --verbose 0 >/dev/null 2>&1 && "$PY" - <<'PY2' \
  && ok "non-UTF-8 class folders numbered as ImageFolder numbers them" || bad "class order of non-UTF-8 names"
import os, shutil
for name in (b"z", b"\xc3\xa9", b"\xff", b"\xee\x80\x80", b"a\xffb", b"a\xc3\xa9"):
    os.makedirs(b"enc/" + name)
    shutil.copy("train/class_01/000.jpg", b"enc/" + name + b"/1.jpg")
PY
import os
want = [os.fsencode(n) for n in sorted(e.name for e in os.scandir("enc") if e.is_dir())]
got = open("encset/classes.txt", "rb").read().split(b"\n")[:-1]
assert got == want and want != sorted(want), (got, want)
PY2

# ---- 2. the transforms against the reference ---------------------------------------------
n_dump=0
check_dump() { # check_dump NAME "H W TRAIN SEED EPOCH THREADS" [EXTRA...]: mgt_images_dump's
  local name=$1 args=$2; shift 2 # batch against images_data.py's reference
  n_dump=$((n_dump + 1))
  mkdir -p dump$n_dump
  # shellcheck disable=SC2086
  "$MGT_IMAGES_DUMP" "${DUMP_SET:-set}" train $args dump$n_dump "$@" >dump$n_dump.log 2>&1 || { bad "$name: dump failed"; cat dump$n_dump.log; return; }
  echo "${DUMP_SET:-set}" >dump$n_dump/set.txt
  local r; r=$("$PY" "$DATA_PY" crops "${DUMP_SET:-set}" train dump$n_dump)
  [ $? -eq 0 ] && ok "$name: ${r#ok: }" || { bad "$name"; echo "$r" | tail -5; }
}
check_dump "train 40x40, epoch 3" "40 40 1 7 3 1"
check_dump "train 24x36, epoch 0, another seed" "24 36 1 11 0 3"
check_dump "train, no try fits (scale 0.8-0.9, ratio 2-3): the fallback crop" "40 40 1 9 0 2" 0 0.8 0.9 2 3
check_dump "evaluation 40x40 (resized to 45)" "40 40 0 7 0 2"
check_dump "evaluation 32x24, center_crop 0.75" "32 24 0 7 0 1" 0.75
# The square layout (--square): the centre square stored, crops drawn on it.
"$MGT_BIN" convert train setsq --size 48 --square --shard-size 50 --verbose 0 >/dev/null 2>&1 \
  && "$PY" "$DATA_PY" stored setsq train train 48 >/dev/null && ok "--square stores Pillow's Resize + CenterCrop" \
  || bad "--square's stored bytes"
DUMP_SET=setsq check_dump "--square: train 40x40" "40 40 1 7 3 2"
DUMP_SET=setsq check_dump "--square: evaluation 40x40" "40 40 0 7 0 2"
expect_fail "a whole-picture split into a square set" "setsq holds images stored square \(--square\); convert with --square" \
  "$MGT_BIN" convert test setsq --split test --size 48
mkdir -p t1 t3
"$MGT_IMAGES_DUMP" set train 40 40 1 7 3 1 t1 >/dev/null 2>&1 && "$MGT_IMAGES_DUMP" set train 40 40 1 7 3 3 t3 >/dev/null 2>&1 \
  && cmp -s t1/x.npy t3/x.npy && ok "a batch is the same bytes on 1 and 3 threads" || bad "threads changed a batch"

# Real photographs (Debian's lomiri-wallpapers-20.04: four JPEGs of 9 to 24 megapixels, 11 MB,
# installed by tests/run): stored whole at 256, their evaluation crop at 224 is torchvision's
# Resize(256) + CenterCrop(224) of the original photo, byte for byte (a few seconds).
photos=$(ls /usr/share/backgrounds/*_by_*.jpg 2>/dev/null | head -4)
if [ -n "$photos" ]; then
  mkdir -p real/photo && for f in $photos; do ln -s "$f" real/photo/; done
  mkdir -p evalreal
  "$MGT_BIN" convert real realset --size 256 --verbose 0 >/dev/null 2>&1 \
    && "$MGT_IMAGES_DUMP" realset train 224 224 0 7 0 2 evalreal >/dev/null 2>&1 \
    && r=$("$PY" "$DATA_PY" evalorig realset train real evalreal) && ok "photos: ${r#ok: }" \
    || { bad "evaluation crops of real photos"; echo "$r"; }
else
  echo "SKIPPED (part): no lomiri-wallpapers-20.04 photos (tests/run installs the package)"
fi

# ---- 2b. PyPI's current Pillow ------------------------------------------------------------
# The bytes above are Debian's Pillow's (9.4), exactly. PyPI's current one (13 at the time of
# writing; in a virtual environment in the build folder, made once: about 30 s) runs the
# vertical pass first for some sizes, which rounds the intermediate bytes otherwise: every stored
# image and transform is checked against it too, equal or equal up to that order only
# (images_data.py --pass-order: mgtrain's bytes are its horizontal-first ones, its own its
# vertical-first ones).
# Under the sanitizers (tests/sanitize sets ASAN_OPTIONS) this part is left out: it runs no
# mgtrain code the part above did not, and would cost the sanitized suite a second environment.
if [ -n "${ASAN_OPTIONS:-}" ]; then
  echo "SKIPPED (part): PyPI's Pillow under the sanitizers (the first tier checks it)"
elif PYPI=$("$MGT_SRC/tests/tools/pillow-python" 2>pypi.log); then
  ver=$("$PYPI" -c "import PIL; print(PIL.__version__)")
  for s in "set train train" "setsq train train" "set test test"; do
    set -- $s
    r=$("$PYPI" "$DATA_PY" stored "$1" "$2" "$3" 48 --pass-order | tail -1)
    [ "${r%%:*}" = ok ] && ok "Pillow $ver, $1 $2: ${r#ok: }" || { bad "Pillow $ver, stored $1 $2"; echo "$r"; }
  done
  for d in dump*/; do
    d=${d%/}
    r=$("$PYPI" "$DATA_PY" crops "$(cat "$d/set.txt")" train "$d" --pass-order | tail -1)
    [ "${r%%:*}" = ok ] && ok "Pillow $ver, $d: ${r#ok: }" || { bad "Pillow $ver, $d"; echo "$r"; }
  done
else
  bad "PyPI's Pillow could not be installed into a virtual environment"; tail -3 pypi.log
fi

# ---- 3. training learns, with top-5 ------------------------------------------------------
cfg() { # cfg NAME ACTIVATION [EXTRA TRAIN KEYS...]
  local name=$1 act=$2; shift 2
  { printf '%s\n' "[input]" "shape = 32,32,3" "mean = 0.485, 0.456, 0.406" "std = 0.229, 0.224, 0.225" \
      "[conv2d]" "filters = 12" "kernel = 3" "stride = 2" "activation = $act" "algo = direct" \
      "[conv2d]" "filters = 24" "kernel = 3" "stride = 2" "activation = $act" "algo = direct" \
      "[global_avgpool]" "[dense]" "units = 10" "[train]" "loss = sparse_categorical_crossentropy" \
      "batch_size = 32" "augment_resized_crop = true" "augment_scale = 0.25, 1" "augment_flip = true"
    printf '%s\n' "$@"; } >"$name.cfg"
}
cfg learn relu "optimizer = adam" "learning_rate = 0.01" "epochs = 4"
mpi 2 --model learn.cfg --data set --verbose 2 --out learn >learn.log 2>&1 || { bad "training on the image set"; tail -5 learn.log; }
grep -q "data: set (images stored whole, short side at most 48 in 14 shards, 170 of 10 classes); evaluation: short side resized to 36, centre 32x32; augmented: random-resized crop (scale 0.25-1, ratio 0.75-1.33) and horizontal flip; normalised" learn.log \
  && ok "the start-up block says how images become inputs" || bad "data line: $(grep 'data:' learn.log)"
"$PY" - learn.log <<'PY' && ok "training on the image set learns: $(grep -o 'Test loss.*' learn.log)" || bad "did not learn: $(grep -o 'Test loss.*' learn.log)"
import re, sys
t = open(sys.argv[1]).read()
m = re.findall(r"Test loss: ([0-9.]+) - test acc: ([0-9.]+) - test top5_acc: ([0-9.]+)", t)
assert m, "no test line with top-5"
loss, acc, top5 = map(float, m[-1])
assert acc >= 0.8 and top5 >= acc, m  # chance: 0.1; measured 1.0 after 4 epochs
assert re.search(r"^Epoch 4/4 - .* - acc: [0-9.]+ - top5_acc: [0-9.]+ - val_loss: .* - val_top5_acc: ", t, re.M)
PY
"$PY" -c "
import json
rows = [json.loads(l) for l in open('learn/metrics.jsonl')]
assert len(rows) == 4 and all(0 <= r['acc'] <= r['top5_acc'] <= 1 and r['val_acc'] <= r['val_top5_acc'] <= 1 for r in rows), rows
assert open('learn/metrics.csv').readline().strip().endswith(',lr,top5_acc,val_top5_acc')" \
  && ok "metrics files hold top5_acc and val_top5_acc" || bad "top-5 in the metrics files"
ev=$(mpi 3 eval --run learn --data set 2>&1) && grep -qE "^40 samples from set .* - acc: [0-9.]+ - top5_acc: [0-9.]+$" <<<"$ev" \
  && ok "eval on 3 ranks: $(grep -o 'loss.*' <<<"$ev")" || { bad "eval"; echo "$ev" | tail -3; }
mpi 2 predict --run learn --data set --output p.npy >/dev/null 2>&1 && "$PY" -c "
import json, numpy as np
p = np.load('p.npy')
y = np.concatenate([np.load('set/' + s['name'] + '_y.npy') for s in json.load(open('set/images.json'))['splits']['test']['shards']])
assert p.shape == (40, 10) and (p.argmax(1) == y).mean() >= 0.8" \
  && ok "predict: 40 x 10 outputs whose argmax matches the labels" || bad "predict"

# ---- 4. the same batches on any rank count, thread count, and after --resume ---------------
cfg smooth tanh "optimizer = sgd" "learning_rate = 0.05" "epochs = 3"
steps=(--model smooth.cfg --data set --epochs 3 --max-steps 16 --verbose 0 --no-tensorboard)
for np in 1 2 3; do
  mpi $np "${steps[@]}" --out aug-np$np >aug$np.log 2>&1 || { bad "augmented run on $np ranks"; tail -3 aug$np.log; }
done
same "random-resized crops: 1 vs 2 ranks" aug-np1/weights.safetensors aug-np2/weights.safetensors 1e-5
same "random-resized crops: 1 vs 3 ranks (32 = 11 + 11 + 10)" aug-np1/weights.safetensors aug-np3/weights.safetensors 1e-5
mpi 2 "${steps[@]}" --loader-threads 1 --out lt1 >/dev/null 2>&1 && mpi 2 "${steps[@]}" --loader-threads 2 --out lt2 >/dev/null 2>&1
same "1 and 2 loader threads: identical" lt1/weights.safetensors lt2/weights.safetensors 0
mpi 2 --model smooth.cfg --data set --epochs 3 --max-steps 9 --verbose 0 --no-tensorboard --out res >/dev/null 2>&1 \
  && mpi 2 "${steps[@]}" --resume --out res >/dev/null 2>&1 || bad "stopped and resumed run"
same "stopped at step 9 (mid-epoch 2) and resumed = straight" res/weights.safetensors lt1/weights.safetensors 0

# ---- 5. bad input ----------------------------------------------------------------------
mkdir -p badtree/a badtree/b
cp train/class_01/000.jpg train/class_01/001.jpg badtree/a/
cp train/class_02/002.png badtree/b/
head -c 2500 train/class_02/000.jpg >badtree/b/cut.jpg
echo "not a picture" >badtree/b/notes.txt
expect_fail "a truncated JPEG stops the conversion, named, with --skip-bad offered" \
  "badtree/b/cut.jpg: truncated JPEG .*; remove or replace the file, or pass --skip-bad" \
  "$MGT_BIN" convert badtree b1 --size 32 --threads 1
rm badtree/b/cut.jpg
expect_fail "a file that is no image" "badtree/b/notes.txt: not a JPEG or PNG image \(it starts with 'not a picture.'\); remove" \
  "$MGT_BIN" convert badtree b2 --size 32
head -c 2500 train/class_02/000.jpg >badtree/b/cut.jpg
out=$("$MGT_BIN" convert badtree b3 --size 32 --skip-bad --verbose 2 2>&1)
[ $? -eq 0 ] && grep -q "skipped 2 unreadable files, listed in b3/train_skipped.txt" <<<"$out" \
  && grep -q "^badtree/b/cut.jpg: truncated JPEG" b3/train_skipped.txt && grep -q "^badtree/b/notes.txt: not a JPEG" b3/train_skipped.txt \
  && "$PY" "$DATA_PY" stored b3 train badtree 32 >/dev/null \
  && ok "--skip-bad leaves out and lists both, and stores the 3 others" || { bad "--skip-bad"; echo "$out" | tail -4; }
rm badtree/b/cut.jpg badtree/b/notes.txt
printf 'GIF89a\x01\x00\x01\x00' >badtree/b/x.gif
expect_fail "another format is named" "badtree/b/x.gif: a GIF image: mgtrain reads JPEG and PNG; convert it first" \
  "$MGT_BIN" convert badtree b4 --size 32
rm badtree/b/x.gif
mkdir badtree/empty
expect_fail "an empty class folder" "badtree/empty: a class folder with no files; add its images or remove the folder" \
  "$MGT_BIN" convert badtree b5 --size 32
rmdir badtree/empty
mkdir flat && cp train/class_01/000.jpg flat/
expect_fail "no class folders" "flat has no class folders: it must hold one folder per class" "$MGT_BIN" convert flat b6
expect_fail "SRC missing" "nothere: No such file or directory; give the folder of class folders" "$MGT_BIN" convert nothere b7
expect_fail "SRC a file" "flat/000.jpg is not a folder" "$MGT_BIN" convert flat/000.jpg b8
touch afile
expect_fail "DST a file" "afile exists and is not a folder" "$MGT_BIN" convert train afile
expect_fail "DST inside SRC" "badtree/out is inside badtree: it would be read as a class folder" \
  "$MGT_BIN" convert badtree badtree/out
[ ! -e badtree/out ] && ok "the refused DST inside SRC is not left there" || bad "badtree/out left behind"
expect_fail "--size too small" "\-\-size 4: expected a whole number of at least 8" "$MGT_BIN" convert train b9 --size 4
expect_fail "convert without DST" "usage: mgtrain convert SRC DST" "$MGT_BIN" convert train
expect_fail "convert under mpirun" "mgtrain convert runs as one process" mpi 2 convert train b10
mkdir -p other/zebra && cp train/class_01/000.jpg other/zebra/
expect_fail "a test split from another tree" "set holds a test split converted from .*/test; converting other over it would replace it" \
  "$MGT_BIN" convert other set --split test --size 48
cp -r set trainonly && rm trainonly/test-* && "$PY" -c "
import json; m = json.load(open('trainonly/images.json')); del m['splits']['test']; json.dump(m, open('trainonly/images.json', 'w'))"
cp trainonly/images.json manifest.before
expect_fail "a test class not among the training classes" "other/zebra: class 'zebra' is not in trainonly/classes.txt" \
  "$MGT_BIN" convert other trainonly --split test --size 48
cmp -s manifest.before trainonly/images.json && ok "the refused split left the manifest as it was" || bad "manifest changed by a refused split"
expect_fail "a split of another size" "set holds images stored at 48 x 48; convert with --size 48" \
  "$MGT_BIN" convert test set --split test --size 64
# Training refuses what does not fit the set, and writes nothing.
sed 's/^shape = 32,32,3/shape = 32,32,1/; /^mean/d; /^std/d' learn.cfg >grey.cfg
expect_fail "a 1-channel model" "set holds RGB images \(3 channels\) but the model's \[input\] shape has 1" "$MGT_BIN" --model grey.cfg --data set --out o1
sed 's/^units = 10/units = 5/' learn.cfg >five.cfg
expect_fail "fewer outputs than classes" "set holds 10 classes \(classes.txt\) but the model's last layer has 5 outputs; give it 10 units" "$MGT_BIN" --model five.cfg --data set --out o2
{ grep -v augment_ learn.cfg; echo "augment_crop = 4"; } >padcrop.cfg
expect_fail "augment_crop on an image set" "augment_crop \(pad and crop at the input's size\) is for data stored at the input's size; set is an image set: use augment_resized_crop" "$MGT_BIN" --model padcrop.cfg --data set --out o3
# --val-split on an image set holds out the same share of every class (test_images checks the
# counts and the seed): int(0.25 x 16) of each of 10 classes, int(0.25 x 26) of class_00's 26.
"$MGT_BIN" --model learn.cfg --data set --val-split 0.25 --max-steps 2 --verbose 2 --no-tensorboard --out o4 >o4.log 2>&1 \
  && grep -q "; validation: 42 held out, the same share of every class" o4.log && grep -q "val_acc" o4.log \
  && ok "--val-split on an image set: 42 held out, validated on" || { bad "--val-split on an image set"; tail -3 o4.log; }
expect_fail "random-resized crops on synthetic data" "augment_resized_crop crops and resizes images stored larger than the input" "$MGT_BIN" --model learn.cfg --data synthetic --out o5
sed 's/^mean = .*/mean = 0.5, 0.5/' learn.cfg >twomeans.cfg
expect_fail "two means for three channels" "\[input\] mean and std give 2 and 3 values" "$MGT_BIN" --model twomeans.cfg --data set --out o6
sed '/^std/d' learn.cfg >nostd.cfg
expect_fail "mean without std" "\[input\] has mean but no std; normalisation needs both" "$MGT_BIN" --model nostd.cfg --data set --out o7
cp -r trainonly noval
expect_fail "no test split" "noval has no test split; convert one into it: mgtrain convert TEST_TREE noval --split test --size 48" "$MGT_BIN" --model learn.cfg --data noval --out o8
"$MGT_BIN" --model learn.cfg --data noval --no-validation --max-steps 2 --verbose 0 --out o9 >o9.log 2>&1 \
  && [ -f o9/weights.safetensors ] && ok "no test split: trains with --no-validation" || { bad "--no-validation without a test split"; tail -3 o9.log; }
head -c 5000 set/train-00004_x.npy >cut && cp -r set damaged && mv cut damaged/train-00004_x.npy
expect_fail "a damaged shard" "damaged/train-00004_x.npy: truncated" "$MGT_BIN" --model learn.cfg --data damaged --out o10
# Limits checked before memory is taken: a 2 GiB file named .jpg (sparse: no disk used) is refused
# from its size and first bytes, without being read.
mkdir -p huge/a && cp train/class_01/000.jpg huge/a/ && cp train/class_01/000.jpg huge/a/big.jpg \
  && truncate -s 2G huge/a/big.jpg
expect_fail "a 2 GiB .jpg is refused unread" "huge/a/big.jpg: a JPEG file of 2.0 GiB, more than the 1 GiB" \
  "$MGT_BIN" convert huge b11 --size 32
rm -rf huge

# ---- 6. convert owns only its own files ---------------------------------------------------
# DST must be absent, empty, or a set converted from the same SRC; anything else is refused
# before a byte is written, and nothing convert did not write is ever removed.
mkdir -p hf && echo parquet >hf/train-00001-of-00003.parquet
expect_fail "a folder of other files" "hf is not empty \(it holds train-00001-of-00003.parquet\) and is not an image set" \
  "$MGT_BIN" convert train hf --size 32
[ "$(ls -A hf)" = train-00001-of-00003.parquet ] && [ "$(cat hf/train-00001-of-00003.parquet)" = parquet ] \
  && ok "the refused folder is as it was (its file kept, no lock, no manifest)" || bad "hf changed: $(ls -A hf)"
mkdir -p npyset && "$PY" -c "import numpy as np; np.save('npyset/train_x.npy', np.zeros((2, 4, 4, 3), np.uint8))"
expect_fail "a folder of .npy data" "npyset is not empty \(it holds train_x.npy\)" "$MGT_BIN" convert train npyset --size 32
cp set/classes.txt classes.before
expect_fail "another tree over a finished set" "set holds a train split converted from .*/train; converting badtree over it would replace it" \
  "$MGT_BIN" convert badtree set --size 48
cmp -s classes.before set/classes.txt && [ ! -e set/mgtrain.lock ] && ok "the set converted from another tree is untouched" \
  || bad "set changed by a refused conversion"
expect_fail "DST two folders down inside SRC" "badtree/x/y is inside badtree" "$MGT_BIN" convert badtree badtree/x/y
[ ! -e badtree/x ] && ok "nothing left in SRC by the refused DST" || bad "badtree/x left behind"
# Output flags never write an image set's files, --overwrite or not.
cp -r set3 set3.before
expect_fail "predict --output onto another image set's shard, --overwrite" \
  "\-\-output set3/train-00000_x.npy is a file of the image set in .*set3 \(mgtrain convert's\)" \
  "$MGT_BIN" predict --run learn --data set --output set3/train-00000_x.npy --overwrite
expect_fail "--timeline onto a set's manifest, --overwrite" "\-\-timeline set3/images.json is a file of the image set" \
  "$MGT_BIN" --model learn.cfg --data set --timeline set3/images.json --overwrite --max-steps 1 --out o11
expect_fail "--algo-cache onto a set's classes.txt" "\-\-algo-cache set3/classes.txt is a file of the image set" \
  "$MGT_BIN" --model learn.cfg --data set --algo-cache set3/classes.txt --max-steps 1 --out o14
expect_fail "training into an image set's folder" "\-\-out set3 holds an image set" \
  "$MGT_BIN" --model learn.cfg --data set --out set3 --max-steps 1
same_files set3.before set3 && cmp -s set3.before/images.json set3/images.json && ok "set3 intact after the refused outputs" || bad "set3 changed"

# Stop signals end a conversion as they end training: the image and shard in hand finished, one
# line, exit 128 + the signal, no lock, no temporary file; the set says it is incomplete until
# the same command finishes it. A closed pipe (| head -1) is SIGPIPE, caught the same way.
stopped_clean() { # stopped_clean NAME DIR RC WANT_RC LOG
  local left; left=$(ls -A "$2" | grep -E 'mgtrain.lock|\.tmp\.' || true)
  [ "$3" -eq "$4" ] && [ "$(grep -c 'interrupted by' "$5")" -eq 1 ] && [ -z "$left" ] \
    && ok "$1: exit $3, one line, nothing left behind" || { bad "$1: exit $3 (want $4), left: $left"; cat "$5"; }
}
"$MGT_BIN" convert train piped --size 64 --threads 1 --shard-size 10 --verbose 2 2>piped.err | head -1 >/dev/null
stopped_clean "a closed pipe (| head -1)" piped "${PIPESTATUS[0]}" 141 piped.err
expect_fail "training on a set whose conversion was stopped" "piped: this image set is incomplete \(the conversion of its train split was stopped before the end\): run convert again" \
  "$MGT_BIN" --model learn.cfg --data piped --out o12
# A tree whose images take a while each (3000 x 2000, linked 12 times), so that a signal sent
# after the first shard lands mid-conversion.
mkdir -p slow/a && "$PY" -c "
from PIL import Image; Image.new('RGB', (3000, 2000), (90, 160, 30)).save('slow/a/000.png')"
for i in $(seq -w 1 11); do ln slow/a/000.png slow/a/0$i.png; done
for sig in TERM INT HUP; do
  "$MGT_BIN" convert slow sig$sig --size 64 --threads 1 --shard-size 1 --verbose 2 >sig.out 2>sig.err &
  pid=$!
  for _ in $(seq 1000); do grep -q "images (" sig.out 2>/dev/null && break; sleep 0.01; done
  kill -$sig $pid
  wait $pid
  stopped_clean "SIG$sig" sig$sig $? $((128 + $(kill -l $sig))) sig.err
done
out=$("$MGT_BIN" convert slow sigTERM --size 64 --threads 1 --shard-size 1 --verbose 2 2>&1)
grep -q "already done, kept" <<<"$out" && grep -q "^train: 12 images of 1 classes" <<<"$out" \
  && ok "the same command finishes the stopped set" || { bad "finishing a stopped set"; echo "$out" | tail -3; }
mkdir -p allbad/a && echo nothing >allbad/a/x.jpg && echo nothing >allbad/a/y.png
expect_fail "--skip-bad with no readable image" "allbad: none of its 2 files is a readable JPEG or PNG image" \
  "$MGT_BIN" convert allbad b12 --skip-bad

# (b1, b2 and b4 stopped at a file during the conversion: they keep what they finished)
left=$(ls -d o1 o2 o3 o5 o6 o7 o8 o10 o11 o12 o14 b5 b6 b7 b8 b9 b10 2>/dev/null)
[ -z "$left" ] && ok "refused starts wrote no output folder" || bad "left behind: $left"
finish
