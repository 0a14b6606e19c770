#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# 1, 2 and 3 ranks with the same global batch, seed and data train the same weights (SGD, 50
# steps), with a batch that divides by the rank count (96) and one that leaves a remainder (100).
# Then: dropout masks and synchronised batchnorm do not depend on the rank count either.
# SGD at Keras' default rate (0.01). Rounding differs between rank counts in the last bit, so a
# ReLU input within ~1e-7 of zero can flip for one sample and move that unit's weights by about
# lr/B: at lr 0.05 and B 96 one unit does so around step 33 (the rest still agree to 1e-9).
source "$(dirname "$0")/lib.bash"
for B in 96 100; do
  for np in 1 2 3; do
    mpi $np --model "$MGT_SRC/examples/mlp.cfg" --optimizer sgd --batch-size $B \
      --max-steps 50 --out "b$B-np$np" --verbose 0 >"b$B-np$np.log" 2>&1 || { bad "np $np B $B run"; cat "b$B-np$np.log"; }
  done
  same "B=$B np1 vs np2" b$B-np1/weights.safetensors b$B-np2/weights.safetensors 1e-5
  same "B=$B np1 vs np3" b$B-np1/weights.safetensors b$B-np3/weights.safetensors 1e-5
done
# The loss each run reports is global (all ranks' samples), so it agrees too.
l1=$(grep -o 'loss: [0-9.]*' b100-np1.log | head -1); l3=$(grep -o 'loss: [0-9.]*' b100-np3.log | head -1)
[ -n "$l1" ] && [ "$l1" = "$l3" ] && ok "reported loss np1 = np3 ($l1)" || bad "reported loss np1 '$l1' vs np3 '$l3'"

# Dropout + synchronised batchnorm: a small convnet, 1 vs 2 vs 3 ranks.
cat >drop.cfg <<'CFG'
[input]
shape = 28,28,1
[conv2d]
filters = 4
kernel = 3
stride = 2
activation = relu
[batchnorm]
sync = true
[flatten]
[dropout]
rate = 0.3
[dense]
units = 10
activation = softmax
[train]
optimizer = sgd
learning_rate = 0.05
loss = sparse_categorical_crossentropy
batch_size = 30
CFG
for np in 1 2 3; do
  mpi $np --model drop.cfg --max-steps 20 --out drop-np$np --verbose 0 >drop-np$np.log 2>&1 || { bad "dropout np $np"; cat drop-np$np.log; }
done
same "dropout + sync batchnorm np1 vs np2" drop-np1/weights.safetensors drop-np2/weights.safetensors 1e-4
same "dropout + sync batchnorm np1 vs np3" drop-np1/weights.safetensors drop-np3/weights.safetensors 1e-4
finish
