#!/usr/bin/env bash
# labels: cli
# timeout: 900
# The example graph models: Keras' parameter counts (keras.applications.Xception: 22,910,480 of
# which 22,855,952 trainable; ResNet50: 25,636,712; BatchNorm moving statistics are the
# non-trainable ones), summary's graph column and memory plan, --input-shape (shapes follow,
# parameters do not change, bad values are refused), and a 224x224x3 Xception trained on 2
# ranks, which prints its step time.
source "$(dirname "$0")/lib.bash"
X=$MGT_SRC/examples/xception.cfg
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
