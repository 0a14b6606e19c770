#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# What the rank count does and does not change, stated as docs/exactness.md states it.
#
# 1. One step: the summed gradients (MGT_DUMP_GRADIENTS) of 1, 2, 3 and 4 ranks from the same
#    weights agree within float32 rounding of a sum, 2 u sqrt(K) of each tensor's largest element
#    for K addends (tests/tools/gradcmp.py says why), for the MLP and for a ConvNet with dropout
#    and synchronised BatchNorm, with batches of 99 and 100 (remainders on 2, 3 and 4 ranks).
#    The ConvNet is smooth (tanh, average pooling) and its convolutions direct: a ReLU or a max
#    at its threshold, or Winograd's rounding residue where an image is exactly zero, would turn a
#    last-bit difference of the forward pass into a different gate, which is not rounding. Its
#    convolutions in front of the BatchNorm have no bias: the gradient of such a bias is zero in
#    exact arithmetic (BatchNorm removes any per-channel shift), so its computed value is pure
#    rounding noise, which no relative measure can compare.
# 2. Many steps of that smooth model: the weights after 30 SGD steps agree to 1e-5 of each
#    tensor. Each step's gradient agrees to 2 u sqrt(K) <= 3.1e-5 of its size (conv1's K) and the
#    30 steps move the weights by a fraction of their size at this rate (lr 0.05), while a smooth
#    loss's SGD map does not amplify differences (lr times its curvature is small): the
#    differences stay near 3e-5 times the total update, a few 1e-6 of the weights; 1e-5 leaves a
#    3x allowance.
# 3. Many steps of ReLU models: the weights need NOT agree. A pre-activation within rounding of
#    zero takes its gate one way on one rank count and the other way on another; that unit's
#    weights then differ by about one sample's gradient times the rate (6e-4 of a bias was
#    measured after 50 SGD steps of the MLP at rate 0.01 under OpenBLAS's Haswell kernel; the
#    runs below take 0.05, which reaches ~68% test accuracy in 50 steps). The training is the same all the same: the mean
#    training loss over the 50 steps and the test loss agree within 1e-3 relative (a flipped unit
#    is one of 256 and moves the loss by about its share times that 6e-4, far below; 1e-3 allows
#    for tens of flips) and the test accuracy within 0.2% (20 of the 10000 test images: only an
#    image whose two largest logits are closer than that perturbation can change its answer).
# Dropout masks do not depend on the rank count: they are keyed by the seed, the step and each
# sample's position in the global batch (checked by part 1, which has dropout).
source "$(dirname "$0")/lib.bash"
GRADCMP=(/usr/bin/python3 "$MGT_SRC/tests/tools/gradcmp.py")
if [ -f "$DATA/train-images-idx3-ubyte.gz" ] || [ -f "$DATA/train-images-idx3-ubyte" ]; then
  data=(--data "$DATA")
else
  data=(--data synthetic); echo "notice: no Fashion-MNIST; synthetic data"
fi

SMOOTH="$MGT_SRC/tests/cli/smooth.cfg"

# 1. One step's gradient sums.
for B in 99 100; do
  # addends per tensor: samples for dense layers, samples x output pixels for the convolutions
  # (26x26 for conv1, 12x12 for conv2) and for the BatchNorm after conv2
  k_mlp=(dense_="$B")
  k_cnn=(conv1=$((B * 26 * 26)) conv2=$((B * 12 * 12)) bn=$((B * 12 * 12)) fc="$B")
  for np in 1 2 3 4; do
    MGT_DUMP_GRADIENTS=$PWD/mlp-b$B-np$np.st mpi $np --model "$MGT_SRC/examples/mlp.cfg" \
      "${data[@]}" --optimizer sgd --batch-size $B --max-steps 1 --no-validation --verbose 2 \
      --out mlp-b$B-np$np >mlp-b$B-np$np.log 2>&1 || { bad "MLP B=$B np $np"; tail -3 mlp-b$B-np$np.log; }
    MGT_DUMP_GRADIENTS=$PWD/cnn-b$B-np$np.st mpi $np --model "$SMOOTH" "${data[@]}" \
      --batch-size $B --max-steps 1 --no-validation --verbose 0 \
      --out cnn-b$B-np$np >cnn-b$B-np$np.log 2>&1 || { bad "ConvNet B=$B np $np"; tail -3 cnn-b$B-np$np.log; }
  done
  for np in 2 3 4; do
    out=$("${GRADCMP[@]}" mlp-b$B-np1.st mlp-b$B-np$np.st "${k_mlp[@]}" 2>&1) \
      && ok "MLP, B=$B: one step's gradients, 1 vs $np ranks: $(sort -t' ' -k5 -g <<<"$out" | tail -1)" \
      || { bad "MLP, B=$B: one step's gradients, 1 vs $np ranks"; echo "$out"; }
    out=$("${GRADCMP[@]}" cnn-b$B-np1.st cnn-b$B-np$np.st "${k_cnn[@]}" 2>&1) \
      && ok "ConvNet with dropout and sync BatchNorm, B=$B: 1 vs $np ranks: $(sort -t' ' -k5 -g <<<"$out" | tail -1)" \
      || { bad "ConvNet, B=$B: one step's gradients, 1 vs $np ranks"; echo "$out"; }
  done
done
# The loss each run reports is global (all ranks' samples), so it agrees too.
l1=$(grep -o 'loss: [0-9.]*' mlp-b100-np1.log | head -1); l3=$(grep -o 'loss: [0-9.]*' mlp-b100-np3.log | head -1)

# 2. Thirty steps of the smooth model.
for np in 1 2 3 4; do
  mpi $np --model "$SMOOTH" "${data[@]}" --max-steps 30 --no-validation --verbose 0 \
    --out s30-np$np >s30-np$np.log 2>&1 || { bad "30 steps, np $np"; tail -3 s30-np$np.log; }
done
for np in 2 3 4; do
  same "smooth ConvNet, 30 SGD steps: weights, 1 vs $np ranks" s30-np1/weights.safetensors \
    s30-np$np/weights.safetensors 1e-5
done

# 3. Fifty steps of the ReLU MLP: the same training, weights free to differ where gates flip.
within() { # within A B REL: |A - B| <= REL * |A|
  awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; exit !(a != "" && b != "" && d <= r * m) }'
}
for B in 96 100; do
  for np in 1 2 3 4; do
    mpi $np --model "$MGT_SRC/examples/mlp.cfg" "${data[@]}" --optimizer sgd --lr 0.05 \
      --batch-size $B --max-steps 50 --verbose 2 --out relu-b$B-np$np >relu-b$B-np$np.log 2>&1 \
      || { bad "ReLU MLP B=$B np $np"; tail -3 relu-b$B-np$np.log; }
  done
  get() { sed -n "s/.*$1: \([0-9.]*\).*/\1/p" "$2" | head -1; }
  L1=$(get " - loss" relu-b$B-np1.log); T1=$(get "Test loss" relu-b$B-np1.log); A1=$(get "test acc" relu-b$B-np1.log)
  for np in 2 3 4; do
    f=relu-b$B-np$np.log
    L=$(get " - loss" $f); T=$(get "Test loss" $f); A=$(get "test acc" $f)
    if within "$L1" "$L" 1e-3 && within "$T1" "$T" 1e-3 &&
       awk -v a="$A1" -v b="$A" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 0.002) }'; then
      ok "ReLU MLP, B=$B, 50 steps: 1 vs $np ranks train alike (loss $L1/$L, test loss $T1/$T, test acc $A1/$A)"
    else
      bad "ReLU MLP, B=$B, 50 steps, 1 vs $np ranks: loss $L1/$L, test loss $T1/$T, test acc $A1/$A"
    fi
  done
done
[ -n "$l1" ] && within "${l1#loss: }" "${l3#loss: }" 1e-4 \
  && ok "the reported step loss is global: np1 $l1, np3 $l3" || bad "reported loss np1 '$l1' vs np3 '$l3'"
finish
