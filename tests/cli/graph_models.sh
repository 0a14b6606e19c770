#!/usr/bin/env bash
# labels: cli
# timeout: 900
# The example graph models: Keras' parameter counts (keras.applications.Xception: 22,910,480 of
# which 22,855,952 trainable; ResNet50: 25,636,712; BatchNorm moving statistics are the
# non-trainable ones), summary's graph column and memory plan, --input-shape (shapes follow,
# parameters do not change, bad values are refused), and a 224x224x3 Xception trained on 2
# ranks, which prints its step time. Every example model file parses; examples/resnet_small.cfg
# trains a few steps on 1 and 2 ranks. bench/benchlib.py's FLOP count of a model file (bench/peer
# reports GFLOP/s with it) walks the same shapes as mgtrain.
source "$(dirname "$0")/lib.bash"
X=$MGT_SRC/examples/xception.cfg
PY=/usr/bin/python3

for cfg in "$MGT_SRC"/examples/*.cfg; do
  s=$("$MGT_BIN" summary --model "$cfg" 2>&1) && grep -qE "^Total params: [0-9,]+$" <<<"$s" \
    && ok "$(basename "$cfg") parses: $(grep "^Total params" <<<"$s")" \
    || { bad "summary of $(basename "$cfg")"; tail -3 <<<"$s"; }
done

# the small residual network: identity and 1x1 stride-2 shortcuts, 677,482 trainable parameters
# (3x3 convolutions without bias: stem 9*32, stage 1 2*9*32*32, stage 2 9*32*64 + 3*9*64*64
# + 32*64, stage 3 9*64*128 + 3*9*128*128 + 64*128; BatchNorm 2 per channel; dense 128*10 + 10)
R=$MGT_SRC/examples/resnet_small.cfg
s=$("$MGT_BIN" summary --model "$R" 2>&1) || bad "summary of resnet_small.cfg"
grep -q "Trainable params: 677,482" <<<"$s" \
  && grep -qE "^s3b1_add \(add\) +\(7, 7, 128\) relu +0  s3b1_short_bn, s3b1_bn2$" <<<"$s" \
  && ok "resnet_small: 677,482 trainable parameters, 1x1 stride-2 shortcut into s3b1_add" \
  || { bad "resnet_small summary"; grep -E "Trainable|s3b1_add" <<<"$s"; }
for np in 1 2; do
  out=$(mpi $np --model "$R" --batch-size 32 --max-steps 4 --no-validation --out rs$np 2>&1) \
    && grep -qE "^Trained 4 steps in [0-9.]+ s" <<<"$out" \
    && grep -qE "^Epoch 1/[0-9]+ - [0-9]+s - loss: [0-9]+\.[0-9]+ - acc: [0-9.]+( - top5_acc: [0-9.]+)?$" <<<"$out" \
    && [ -s rs$np/weights.safetensors ] \
    && ok "resnet_small trains 4 steps on $np rank(s): $(grep "^Epoch" <<<"$out")" \
    || { bad "resnet_small on $np rank(s)"; tail -5 <<<"$out"; }
done

# bench/benchlib.py's FLOP walk. The seed ConvNet by hand: 3x3 convolutions 1->32 on 26x26,
# 32->256 on 24x24, 256->128 on 22x22, dense 15488->128->10 (exact integers: no tolerance).
want=$((26 * 26 * 32 * 9 + 24 * 24 * 256 * 9 * 32 + 22 * 22 * 128 * 9 * 256 + 15488 * 128 + 128 * 10))
got=$("$PY" "$MGT_SRC/bench/benchlib.py" flops "$MGT_SRC/examples/convnet.cfg" \
  | "$PY" -c "import json, sys; print(json.load(sys.stdin)['fwd_macs'])")
[ "$got" = "$want" ] && ok "FLOP walk of convnet.cfg: $got multiply-adds, as by hand" \
  || bad "FLOP walk of convnet.cfg: $got multiply-adds, by hand $want"
# Xception and ResNet-50 at 224x224x3: every layer's output shape and the trainable parameters
# as mgtrain summary prints them (the walk and mgtrain's shape inference are written apart)
CHECK_WALK='
import json, re, sys
text = open(sys.argv[1]).read()
g = json.load(open(sys.argv[2]))
mgt = {m.group(1): [int(v) for v in m.group(2).split(",")]
       for m in re.finditer(r"^(\S+) \(\w+\) +\(([\d, ]+)\)", text, re.M)}
walk = dict((n, list(s)) for n, s in g["shapes"])
diff = sorted(n for n in set(mgt) | set(walk) if mgt.get(n) != walk.get(n))
params = int(re.search(r"Trainable params: ([\d,]+)", text).group(1).replace(",", ""))
walked, gmacs = g["params"], g["fwd_macs"] / 1e9
if diff or params != walked or len(walk) < 100:
    sys.exit(f"shapes differ at {diff[:5]}; parameters {params} vs {walked}")
print(f"{len(walk)} layers, {gmacs:.3f} G multiply-adds forward")'
for m in xception resnet50; do
  "$MGT_BIN" summary --model "$MGT_SRC/examples/$m.cfg" --input-shape 224,224,3 >sum_$m.txt 2>&1
  "$PY" "$MGT_SRC/bench/benchlib.py" flops "$MGT_SRC/examples/$m.cfg" 224,224,3 >flops_$m.json
  if r=$("$PY" -c "$CHECK_WALK" sum_$m.txt flops_$m.json 2>&1); then
    ok "FLOP walk of $m.cfg at 224x224x3: shapes and parameters as mgtrain's; $r"
  else bad "FLOP walk of $m.cfg: $r"; fi
done

s=$("$MGT_BIN" summary --model "$X" 2>&1) || bad "summary of xception.cfg"
grep -q "Total params: 22,910,480" <<<"$s" && grep -q "Trainable params: 22,855,952" <<<"$s" \
  && grep -q "Non-trainable params: 54,528 (batchnorm moving statistics)" <<<"$s" \
  && ok "Xception: Keras' 22,910,480 parameters, 22,855,952 trainable" || { bad "Xception totals"; tail -5 <<<"$s"; }
grep -qE "^block2_add \(add\) +\(74, 74, 128\) +0  block2_pool, block2_res_bn$" <<<"$s" \
  && grep -qE "^block14_sepconv2 \(separable_conv2d\) +\(10, 10, 2048\) +3,159,552  block14_sepconv1_act$" <<<"$s" \
  && ok "summary shows each layer's inputs, shape and parameters" || { bad "Xception summary rows"; grep -E "block2_add|block14_sepconv2 " <<<"$s"; }
# the planner: Xception's activations at batch 32 take well under half of a buffer per tensor
plan=$(sed -n 's/.*batch of 32: \([0-9,.]*\) MiB planned (\([0-9,.]*\) MiB with a buffer per tensor.*/\1 \2/p' <<<"$s" | tr -d ,)
awk -v p="$plan" 'BEGIN { split(p, a, " "); exit !(a[1] > 0 && a[1] < 0.5 * a[2]) }' \
  && ok "memory plan: $plan MiB (planned, one buffer per tensor)" || { bad "memory plan line: '$plan'"; tail -2 <<<"$s"; }

s=$("$MGT_BIN" summary --model "$MGT_SRC/examples/resnet50.cfg" 2>&1) || bad "summary of resnet50.cfg"
grep -q "Total params: 25,636,712" <<<"$s" && ok "ResNet-50: Keras' 25,636,712 parameters" || { bad "ResNet-50 totals"; tail -5 <<<"$s"; }

s=$("$MGT_BIN" summary --model "$X" --input-shape 224,224,3 2>&1) || bad "summary --input-shape"
grep -qE "^input +\(224, 224, 3\)" <<<"$s" && grep -qE "^block14_sepconv2_act \(activation\) +\(7, 7, 2048\)" <<<"$s" \
  && grep -q "Total params: 22,910,480" <<<"$s" && ok "--input-shape 224,224,3: shapes follow, parameters unchanged" \
  || { bad "--input-shape 224,224,3"; grep -E "^input|block14_sepconv2_act|Total" <<<"$s"; }
expect_fail "--input-shape not three numbers" "--input-shape 224,224: expected three positive whole numbers H,W,C" \
  "$MGT_BIN" summary --model "$X" --input-shape 224,224
expect_fail "--input-shape too small for the model" "xception.cfg:[0-9]+: .*does not fit" \
  "$MGT_BIN" summary --model "$X" --input-shape 4,4,3

# the seed's run, small per-rank batch (the CPU step of batch 32 per rank is a benchmark)
out=$(mpi 2 --model "$X" --data synthetic --input-shape 224,224,3 --synthetic-samples 64 --batch-size 4 \
  --max-steps 2 --no-validation --out x224 2>&1) || { bad "Xception 224x224x3 on 2 ranks"; tail -5 <<<"$out"; }
grep -qE "^Trained 2 steps in [0-9.]+ s" <<<"$out" && grep -qE "^Step time: [0-9.]+ s \(mean of 2 steps\)" <<<"$out" \
  && ok "Xception 224x224x3, 2 ranks, batch 2 per rank: $(grep "^Step time" <<<"$out")" \
  || { bad "no step time"; tail -5 <<<"$out"; }
finish
