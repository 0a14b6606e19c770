#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# Checkpoint and resume: 2 epochs straight equal 1 epoch on 2 ranks + 1 resumed epoch on 3 ranks
# (SGD, 1e-5); with the same rank count, resume is bit-exact with any optimizer, also from a
# mid-epoch checkpoint (--save-every, --max-steps).
# The resumed epoch runs on another rank count, so its sums round differently: the model for
# that comparison is smooth (the MLP with tanh), whose 23 SGD steps carry the per-step rounding
# differences (~1e-7 of the updates) without amplifying them, far below 1e-5; with ReLU a gate
# within rounding of zero could flip between rank counts, which is not rounding
# (tests/cli/invariance.sh). The same-world checks are bit-exact and keep the ReLU MLP.
source "$(dirname "$0")/lib.bash"
N="--synthetic-samples 6000 --data synthetic --verbose 0"
sed 's/activation = relu/activation = tanh/' "$MGT_SRC/examples/mlp.cfg" >tanh.cfg
grep -q "activation = tanh" tanh.cfg || bad "could not make the tanh MLP from examples/mlp.cfg"
S=(--model tanh.cfg --optimizer sgd --lr 0.05)
mpi 2 "${S[@]}" --epochs 2 $N --out straight >s.log 2>&1 || { bad "straight"; cat s.log; }
mpi 2 "${S[@]}" --epochs 1 $N --out split >a.log 2>&1 || { bad "first half"; cat a.log; }
mpi 3 "${S[@]}" --epochs 2 $N --out split --resume >b.log 2>&1 || { bad "resumed half"; cat b.log; }
grep -q "resumed from split/checkpoint.safetensors at epoch 2" b.log && ok "resume message" || { bad "resume message"; cat b.log; }
same "SGD 2 ranks + resume on 3 ranks" straight/weights.safetensors split/weights.safetensors 1e-5

# Adam, same world size, resumed mid-epoch from a --save-every checkpoint: bit-exact.
mpi 2 --epochs 2 $N --verbose 2 --out adam-straight >c.log 2>&1 || { bad "adam straight"; cat c.log; }
mpi 2 --epochs 2 $N --out adam-split --max-steps 30 --save-every 10 >d.log 2>&1 || { bad "adam first part"; cat d.log; }
mpi 2 --epochs 2 $N --verbose 2 --out adam-split --resume >e.log 2>&1 || { bad "adam resumed"; cat e.log; }
same "Adam resume, same world, bit-exact" adam-straight/weights.safetensors adam-split/weights.safetensors 0
same "Adam checkpoints at the end agree bit for bit" adam-straight/checkpoint.safetensors adam-split/checkpoint.safetensors 0
# The resumed epoch line reports the same loss as the uninterrupted run's.
a=$(grep -o 'Epoch 2/2.*' c.log | sed 's/ - [0-9]*s - / - /'); b=$(grep -o 'Epoch 2/2.*' e.log | sed 's/ - [0-9]*s - / - /')
[ -n "$a" ] && [ "$a" = "$b" ] && ok "epoch 2 line identical after resume" || bad "epoch lines differ: '$a' vs '$b'"
finish
