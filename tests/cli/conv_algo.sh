#!/usr/bin/env bash
# labels: cli
# cores: 1
# The convolution algorithm choice: [conv2d] algo = auto|direct|winograd and --conv-algo, with
# their errors. What each algorithm computes is checked in tests/unit/test_winograd.c.
source "$(dirname "$0")/lib.bash"
cfg() { # cfg KERNEL STRIDE ALGO
  printf '[input]\nshape = 12,12,1\n[conv2d]\nfilters = 4\nkernel = %s\nstride = %s\nalgo = %s\n' "$1" "$2" "$3"
  printf '[flatten]\n[dense]\nunits = 3\n[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\nbatch_size = 8\n'
}
run=(--data synthetic --synthetic-samples 32 --max-steps 2 --no-validation --verbose 0)
for a in auto direct winograd; do
  cfg 3 1 $a >a-$a.cfg
  "$MGT_BIN" --model a-$a.cfg "${run[@]}" --out o-$a >o-$a.log 2>&1 && ok "algo = $a trains" \
    || { bad "algo = $a"; tail -3 o-$a.log; }
done
# auto and winograd are the same on the CPU (Winograd wherever it applies); direct differs in
# rounding only: same weights to a few ulps of the largest (the two algorithms' bounds).
same "algo = auto is Winograd" o-auto/weights.safetensors o-winograd/weights.safetensors 0
same "algo = direct agrees with Winograd to rounding" o-auto/weights.safetensors o-direct/weights.safetensors 1e-5
"$MGT_BIN" --model a-auto.cfg "${run[@]}" --conv-algo direct --out o-flag >/dev/null 2>&1
same "--conv-algo direct overrides the file's algo = auto" o-flag/weights.safetensors o-direct/weights.safetensors 0
cfg 5 1 winograd >w5.cfg
expect_fail "algo = winograd on a 5x5 kernel" \
  "w5.cfg:3: .*algo = winograd needs a 3x3 kernel at stride 1 \(this layer has kernel 5,5 and stride 1\); use algo = auto or direct" \
  "$MGT_BIN" --model w5.cfg "${run[@]}" --out o-w5
cfg 3 2 winograd >w2.cfg
expect_fail "algo = winograd at stride 2" "stride 2\); use algo = auto or direct" \
  "$MGT_BIN" --model w2.cfg "${run[@]}" --out o-w2
cfg 3 1 fast >wf.cfg
expect_fail "an unknown algo" "wf.cfg:.*algo.*expected auto, direct or winograd" \
  "$MGT_BIN" --model wf.cfg "${run[@]}" --out o-wf
expect_fail "--conv-algo with an unknown name" "--conv-algo fast: expected auto, direct or winograd" \
  "$MGT_BIN" --model a-auto.cfg "${run[@]}" --conv-algo fast --out o-cf
# --conv-algo winograd leaves the layers Winograd cannot do alone (no error).
cfg 5 1 auto >a5.cfg
"$MGT_BIN" --model a5.cfg "${run[@]}" --conv-algo winograd --out o-a5 >/dev/null 2>&1 \
  && ok "--conv-algo winograd on a 5x5 layer keeps auto" || bad "--conv-algo winograd on a 5x5 layer"
finish
