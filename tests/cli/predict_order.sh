#!/usr/bin/env bash
# labels: mpi
# predict on 3 ranks gathers rows in dataset order: equal to 1 rank's, row for row; eval agrees.
# The rows' logits are the same dot products on any rank count, but a BLAS kernel may sum a row
# differently for another number of rows: rounding of order u sqrt(K) (~1e-7 here), 1e-6 of the
# largest logit allows for it; a row out of order would differ by O(1).
source "$(dirname "$0")/lib.bash"
mpi 2 --model "$MGT_SRC/examples/smallconv.cfg" --max-steps 30 --batch-size 64 --no-validation --out run --verbose 0 >train.log 2>&1 || { bad train; cat train.log; }
mpi 1 predict --model "$MGT_SRC/examples/smallconv.cfg" --weights run/weights.safetensors --output p1.npy >p1.log 2>&1 || { bad "predict np1"; cat p1.log; }
mpi 3 predict --model "$MGT_SRC/examples/smallconv.cfg" --weights run/weights.safetensors --output p3.npy >p3.log 2>&1 || { bad "predict np3"; cat p3.log; }
same "predictions np1 vs np3" p1.npy p3.npy 1e-6
ev1=$(mpi 1 eval --model "$MGT_SRC/examples/smallconv.cfg" --weights run/weights.safetensors 2>&1)
acc=$(grep -o ' - acc: [0-9.]*' <<<"$ev1" | grep -o '[0-9.]*$')
/usr/bin/python3 - "$acc" <<'PY' && ok "npy: (10000, 10) float32 logits whose argmax accuracy is eval's ($acc)" || bad "npy content"
import gzip, sys, numpy as np
a = np.load("p3.npy")
assert a.shape == (10000, 10) and a.dtype == np.float32, a.shape
y = np.frombuffer(gzip.open("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)
acc = (a.argmax(1) == y).mean()
assert abs(acc - float(sys.argv[1])) < 1e-4, (acc, sys.argv[1])
PY
e1=$(grep -o 'acc: [0-9.]*.*' <<<"$ev1")
e3=$(mpi 3 eval --model "$MGT_SRC/examples/smallconv.cfg" --weights run/weights.safetensors 2>&1 | grep -o 'acc: [0-9.]*.*')
[ -n "$e1" ] && [ "$e1" = "$e3" ] && ok "eval np1 = np3 ($e1)" || bad "eval np1 '$e1' vs np3 '$e3'"
finish
