#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# Gradient clipping bounds the applied update. One plain SGD step (learning rate 1, no momentum,
# no weight decay, batch 128) from the same random weights, without clipping and with:
#   - clip_norm C set to a quarter of the unclipped mean gradient's norm: the step moves the
#     weights by exactly lr * C in norm, in the unclipped step's direction (global norm: one
#     scale for every tensor, as PyTorch's clip_grad_norm_, not per tensor);
#   - clip_value V set to a quarter of the largest unclipped element: every element of the step
#     is the unclipped one clamped to [-lr V, lr V].
# Bounds (u = 2^-24): the all-reduced sums are scaled by f = (float)(limit / norm) (one rounding
# of f, one of each product), divided by 128 and multiplied by lr = 1 (exact), then subtracted
# from the weight (one rounding of the new weight): each element of the clipped step is within
# gamma(2) = 2u/(1-2u) of the exact clipped one, plus u |w_new|. So | |step| - lr C | <= gamma(2)
# lr C + u |w_new|, and each normalised step is within 2 r of the exact direction, r its
# relative error. By value, nothing rounds but the subtraction: |step_i - clamp| <= u (|new_i| +
# |unclipped new_i|). Then: clipping gives the same weights on 1 and 3 ranks (it acts on the
# all-reduced gradient), to the invariance test's 1e-5, and on the GPU path (tests/gpu/emu).
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/regime.bash"
N=(--data synthetic --synthetic-samples 1024 --batch-size 128 --verbose 0 --no-validation)
mlp_cfg sgd optimizer=sgd learning_rate=1.0 momentum=0

# Random starting weights with the model's names and shapes (from a one-step run's file).
"$MGT_BIN" train --model sgd.cfg "${N[@]}" --max-steps 1 --out shape >shape.log 2>&1 || { bad "shape run"; cat shape.log; }
"$PY" - shape/weights.safetensors w0.safetensors <<'PY' || bad "writing w0.safetensors"
import sys
import numpy as np
import weights
t, _ = weights.load(sys.argv[1])
rng = np.random.default_rng(7)
weights.write(sys.argv[2], {k: rng.standard_normal(v.shape) * 0.05 for k, v in sorted(t.items())})
PY
step() { # step OUT ARGS...: one step from w0
  local out=$1; shift
  "$MGT_BIN" train --model sgd.cfg "${N[@]}" --max-steps 1 --init-weights w0.safetensors --out "$out" "$@" \
    >"$out.log" 2>&1 || { bad "one step ($out)"; tail -3 "$out.log"; }
}
step plain
read -r C V < <("$PY" - <<'PY'
import numpy as np
from weights import flat
d = flat("plain/weights.safetensors") - flat("w0.safetensors")
print(f"{0.25 * np.linalg.norm(d):.6g} {0.25 * np.abs(d).max():.6g}")
PY
)
echo "unclipped step: clip_norm $C and clip_value $V are a quarter of its norm and largest element"
step norm --clip-norm "$C"
step value --clip-value "$V"

if "$PY" - "$C" "$V" >check.log 2>&1 <<'PY'; then
import sys
import numpy as np
from weights import flat as load
u = 2.0 ** -24
g = lambda k: k * u / (1 - k * u)
w0, wp, wn, wv = (load(f) for f in ("w0.safetensors", "plain/weights.safetensors",
                                      "norm/weights.safetensors", "value/weights.safetensors"))
C, V = float(np.float32(sys.argv[1])), float(np.float32(sys.argv[2]))   # the floats parsed
dp, dn, dv = wp - w0, wn - w0, wv - w0
# by norm: the step's length and direction
nn, np_ = np.linalg.norm(dn), np.linalg.norm(dp)
tol = g(2) * C + u * np.linalg.norm(wn)
print(f"clip_norm {C:.6g}: step norm {nn:.9g} (unclipped {np_:.6g}), |difference| {abs(nn - C):.3g} <= {tol:.3g}")
assert abs(nn - C) <= tol
r_n = tol / C
r_p = (g(1) * np_ + u * np.linalg.norm(wp)) / np_
chord = np.linalg.norm(dn / nn - dp / np_)
print(f"direction: |dn/|dn| - dp/|dp|| = {chord:.3g} <= {2 * (r_n + r_p):.3g}")
assert chord <= 2 * (r_n + r_p)
# by value: the unclipped step clamped, element by element
want = np.clip(dp, -V, V)
err = np.abs(dv - want)
bound = u * (np.abs(wv) + np.abs(wp))
print(f"clip_value {V:.6g}: largest step {np.abs(dv).max():.9g}, {int((np.abs(dp) > V).sum())} elements clipped, worst error/bound {np.max(err / np.maximum(bound, 1e-300)):.3g}")
assert np.all(err <= bound) and np.abs(dv).max() <= V * (1 + g(1)) + u * np.abs(wv).max()
PY
  ok "one clipped SGD step: $(tr '\n' ';' <check.log)"
else bad "clipped step: $(cat check.log)"; fi

# The same clipping on 1 and 3 ranks (B = 96 divides by 3), ten steps with momentum.
mlp_cfg mom optimizer=sgd learning_rate=0.05 momentum=0.9
for np in 1 3; do
  mpi $np train --model mom.cfg "${N[@]}" --batch-size 96 --max-steps 10 --clip-norm 0.05 --clip-value 0.002 \
    --out np$np >np$np.log 2>&1 || { bad "np $np clipped run"; tail -3 np$np.log; }
done
same "clip_norm and clip_value: 3 ranks against 1" np3/weights.safetensors np1/weights.safetensors 1e-5
mpi 1 train --model mom.cfg "${N[@]}" --batch-size 96 --max-steps 10 --out noclip >noclip.log 2>&1
"$MGT_COMPARE" np1/weights.safetensors noclip/weights.safetensors 1e-3 >/dev/null \
  && bad "clipping changed nothing: the limits are not active" || ok "and clipping changed the weights"

expect_fail "a negative clip_norm" "--clip-norm -1: expected a positive number \(0: off\)" \
  "$MGT_BIN" train "${N[@]}" --clip-norm -1 --out bad
finish
