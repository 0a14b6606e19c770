#!/usr/bin/env bash
# labels: cli
# `mgtrain summary --floor` and the memory estimate, on the models and batches of the GPU bars
# (nothing runs on a device: the counts are the model's):
#   - ResNet-50 at 256 and Xception at 128 per GPU, BF16, fit an H200 (141 GB) by the estimate
#     (the activation arena is the memory plan's; a build without the GPU backend has no
#     workspace figure, and then no estimate);
#   - the floor table has a row per layer and a step floor, which is the sum of the per-pass
#     floors, the loss and the update printed with it;
#   - BF16's floor (activations in bfloat16) is below TF32's, which is below FP32's;
#   - --floor belongs to summary only; bench/gpu_floor writes its table.
source "$(dirname "$0")/lib.bash"
R50=(--model "$MGT_SRC/examples/resnet50.cfg" --input-shape 224,224,3)
XC=(--model "$MGT_SRC/examples/xception.cfg" --input-shape 224,224,3)

"$MGT_BIN" summary "${R50[@]}" --batch-size 256 --precision bf16 --floor >r50.txt 2>&1 \
  || { bad "summary --floor of ResNet-50"; tail -5 r50.txt; }
"$MGT_BIN" summary "${XC[@]}" --batch-size 128 --precision bf16 --floor >xc.txt 2>&1 \
  || { bad "summary --floor of Xception"; tail -5 xc.txt; }
if "$MGT_BIN" --version | grep -i 'cuda' >/dev/null; then
  for f in r50 xc; do
    line=$(grep '^GPU memory of one rank' "$f.txt")
    grep -q 'fits an H200 (143,771 MiB' <<<"$line" && ok "$f: ${line#GPU memory of one rank }" \
      || bad "$f: no fit: '$line'"
  done
  act=$(sed -n 's/.*= activations \([0-9.]*\) (the memory plan).*/\1/p' r50.txt)
  plan=$(sed -n 's/^Activation memory of one rank training a batch of 256: \([0-9,.]*\) MiB planned.*/\1/p' r50.txt | tr -d ,)
  [ -n "$act" ] && [ "$act" = "$plan" ] && ok "the estimate's activations are the plan's ($act MiB)" \
    || bad "activations '$act' against the plan's '$plan'"
else
  echo "(this build has no GPU backend: no memory estimate to check)"
fi
rows=$(grep -c '^| [0-9]* | ' r50.txt)
layers=$(grep -c '^[a-z0-9_]* (' r50.txt) # the summary's layer table: "name (type) ..."
[ "$rows" -gt 150 ] && [ "$rows" = "$layers" ] && ok "one floor row per layer ($rows)" \
  || bad "floor rows $rows, layers $layers"
# The step floor is the sum of the printed parts (rounding of their printed digits allowed).
python3 - r50.txt <<'EOF' && ok "the step floor adds up its passes" || bad "the step floor does not add up"
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"Step floor: ([\d.]+) ms \(forward ([\d.]+), backward ([\d.]+), loss ([\d.]+), update ([\d.]+)\): at most (\d+) images/s", t)
step, f, b, l, u, ips = map(float, m.groups())
rows = [r for r in t.splitlines() if re.match(r"\| \d+ \| ", r)]
fsum = sum(float(r.split("|")[7].split()[0]) for r in rows if r.split("|")[7].strip() != "-")
assert abs(step - (f + b + l + u)) < 0.005, (step, f, b, l, u)
assert abs(fsum - f) < 0.001 * len(rows), (fsum, f)
assert abs(ips - 256 / (step / 1e3)) < 2, (ips, step)
EOF
floor() { sed -n 's/^Step floor: \([0-9.]*\) ms.*/\1/p' "$1"; }
"$MGT_BIN" summary "${R50[@]}" --batch-size 256 --tf32 --floor >t.txt 2>&1
"$MGT_BIN" summary "${R50[@]}" --batch-size 256 --floor >f.txt 2>&1
awk -v a="$(floor r50.txt)" -v b="$(floor t.txt)" -v c="$(floor f.txt)" 'BEGIN { exit !(a < b && b < c) }' \
  && ok "floors: BF16 $(floor r50.txt) < TF32 $(floor t.txt) < FP32 $(floor f.txt) ms" \
  || bad "floors out of order: BF16 $(floor r50.txt), TF32 $(floor t.txt), FP32 $(floor f.txt)"
expect_fail "--floor is summary's" "--floor" "$MGT_BIN" train --floor --data synthetic
if [ -x "$MGT_BUILD/mgtrain" ]; then
  bash "$MGT_SRC/bench/gpu_floor" --build-dir "$MGT_BUILD" --out floor.md >floor.log 2>&1 \
    && [ "$(grep -c '^| \(resnet50\|xception\|convnet\) |' floor.md)" = 11 ] \
    && ok "bench/gpu_floor writes its 11 configurations" || { bad "bench/gpu_floor"; tail -5 floor.log; }
fi
finish
