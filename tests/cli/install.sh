#!/usr/bin/env bash
# labels: e2e
# timeout: 900
# cores: 1
# `cmake --install` into a temporary prefix, then mgtrain used from there only: the binary, the
# launch scripts, the man page (rendered by man), libmgt (its SONAME and exports) and its header
# and pkg-config file. C programs built with `pkg-config --cflags --libs mgtrain` against the
# install: predict_installed reproduces `mgtrain predict`'s outputs bit for bit (the MLP, and a
# ConvNet with BatchNorm, dropout and a softmax output), and reports bad weights as errors; train_installed trains through
# mgt_train_argv exactly as the command line does, on 2 ranks, with MPI started by the library or
# by the caller.
source "$(dirname "$0")/lib.bash"
# Where OpenBLAS falls back to an old kernel on a CPU it does not know, mgtrain runs itself again
# with the kernel the CPU calls for, which libmgt cannot do (tests/cli/blas_kernel.sh): the
# bit-for-bit comparisons of the two below run both under the kernel mgtrain runs.
if [ -z "${OPENBLAS_CORETYPE+x}" ]; then
  OPENBLAS_CORETYPE=$(OPENBLAS_VERBOSE=2 "$MGT_BIN" --version 2>&1 >/dev/null | sed -n 's/^Core: //p' | tail -1)
  export OPENBLAS_CORETYPE
fi
: "${MGT_BUILD:?}"
[ -d "$DATA" ] || { bad "Fashion-MNIST is not installed (tests/run installs dataset-fashion-mnist)"; finish; exit 1; }
P=$T/prefix
cmake --install "$MGT_BUILD" --prefix "$P" >install.log 2>&1 && ok "cmake --install --prefix $P" || { bad "cmake --install"; cat install.log; }
for f in bin/mgtrain bin/mgtrun share/mgtrain/mgtrain.sbatch include/mgtrain/mgt.h \
         lib/pkgconfig/mgtrain.pc share/man/man1/mgtrain.1 share/mgtrain/examples/mlp.cfg; do
  [ -s "$P/$f" ] || bad "not installed: $f"
done
[ -x "$P/bin/mgtrun" ] && [ -x "$P/share/mgtrain/mgtrain.sbatch" ] && ok "launch scripts installed, executable" || bad "launch scripts"
soname=$(readelf -d "$P/lib/libmgt.so" | grep -o 'SONAME.*\[.*\]')
[ -L "$P/lib/libmgt.so" ] && [ -e "$P/lib/libmgt.so.0" ] && grep -q 'libmgt.so.0\]' <<<"$soname" \
  && ok "libmgt.so -> libmgt.so.0 ($soname)" || bad "libmgt: $soname; $(ls -l "$P"/lib)"
# Exported: the header's functions, nothing else (the internal modules stay inside).
exported=$(nm -D --defined-only "$P/lib/libmgt.so" | awk '$2 == "T" {sub(/@.*/, "", $3); print $3}' | sort)
declared=$(grep -oE '\bmgt_[a-z_]+\(' "$P/include/mgtrain/mgt.h" | tr -d '(' | sort -u)
[ "$exported" = "$declared" ] && ok "libmgt exports exactly the $(wc -l <<<"$declared") functions of mgt.h" \
  || { bad "exports differ from mgt.h:"; diff <(echo "$declared") <(echo "$exported"); }

# The man page renders, and holds every flag of every command's --help.
"$MGT_SRC/launch/install-deps" man-db >/dev/null # what a user reads it with
LC_ALL=C MANWIDTH=100 man -l "$P/share/man/man1/mgtrain.1" >man.txt 2>man.err
grep -q '^NAME' man.txt && grep -q 'mgtrain - data-parallel' man.txt && ok "man -l renders mgtrain.1 ($(wc -l <man.txt) lines)" || { bad "man -l:"; head man.txt man.err; }
missing=""
for cmd in train eval predict summary; do
  for fl in $("$P/bin/mgtrain" $cmd --help | grep -oE '^  --[a-z0-9-]+'); do
    grep -q -- "$fl" man.txt || missing+=" $cmd$fl"
  done
done
[ -z "$missing" ] && ok "the man page has every flag of train, eval, predict, summary" || bad "man page lacks:$missing"

# Train with the installed mgtrun (it finds the installed mgtrain beside it), predict with the
# installed mgtrain on one rank, and the same from C.
root=(); [ "$(id -u)" -eq 0 ] && root=(--as-root)
export PKG_CONFIG_PATH=$P/lib/pkgconfig
cflags=$(pkg-config --cflags --libs mgtrain) && ok "pkg-config --cflags --libs mgtrain: $cflags" || bad "pkg-config mgtrain"
cc -std=c17 -Wall -Wextra -Werror -o predict_installed "$MGT_SRC/tests/install/predict_installed.c" \
  $(pkg-config --cflags --libs mgtrain) -lz >cc.log 2>&1 && ok "predict_installed.c builds against the install" || { bad "cc:"; cat cc.log; }
# No LD_LIBRARY_PATH: the RUNPATH that pkg-config's Libs give leads to the install's lib/.
unset LD_LIBRARY_PATH
libs=$(ldd predict_installed)
grep -q "libmgt.so.0 => $P/lib/libmgt.so.0" <<<"$libs" && ok "it loads $P/lib/libmgt.so.0 (its RUNPATH)" || { bad "ldd:"; echo "$libs"; }
cat >bnconv.cfg <<'EOF2'
[input]
shape = 28,28,1
[conv2d]
filters = 8
kernel = 3
[batchnorm]
[activation]
type = relu
[maxpool]
[flatten]
[dropout]
rate = 0.3
[dense]
units = 10
activation = softmax
[train]
optimizer = sgd
learning_rate = 0.1
loss = sparse_categorical_crossentropy
batch_size = 100
EOF2
for model in mlp bnconv; do
  cfg=$P/share/mgtrain/examples/$model.cfg
  [ -f "$cfg" ] || cfg=$PWD/$model.cfg
  timeout 600 "$P/bin/mgtrun" -np 2 "${root[@]}" --model "$cfg" --max-steps 12 --verbose 0 \
    --no-validation --out "$model" >"$model.log" 2>&1 && [ -s "$model/weights.safetensors" ] \
    && ok "$model: trained by the installed mgtrun and mgtrain" || { bad "$model: training"; cat "$model.log"; }
  grep -q "^+ mpirun .*$P/bin/mgtrain" "$model.log" || bad "$model: mgtrun did not run $P/bin/mgtrain: $(grep '^+' "$model.log")"
  timeout 600 "$P/bin/mgtrain" predict --model "$cfg" --weights "$model/weights.safetensors" \
    --output "$model.npy" >"$model.predict.log" 2>&1 || { bad "$model: mgtrain predict"; cat "$model.predict.log"; }
  if ./predict_installed "$cfg" "$model/weights.safetensors" "$DATA" "$model.npy" >"$model.c.log" 2>&1; then
    ok "$model: $(grep -c '^ok' "$model.c.log") checks of predict_installed: $(grep 'bit for bit' "$model.c.log")"
  else bad "$model: predict_installed:"; cat "$model.c.log"; fi
done

# Training from C: the same weights as the command line's, bit for bit, on 2 ranks.
cc -std=c17 -Wall -Wextra -Werror -o train_installed "$MGT_SRC/tests/install/train_installed.c" \
  $(pkg-config --cflags --libs mgtrain ompi-c) >cc2.log 2>&1 && ok "train_installed.c builds" || { bad "cc:"; cat cc2.log; }
S=(--data synthetic --synthetic-samples 2048 --batch-size 128 --max-steps 5 --verbose 0)
mpi 2 "${S[@]}" --out cli >cli.log 2>&1 || { bad "mgtrain on 2 ranks"; cat cli.log; }
timeout 600 mpirun --oversubscribe --bind-to none -np 2 ./train_installed "${S[@]}" --out lib >lib.log 2>&1 \
  && ok "mgt_train_argv on 2 ranks returns 0" || { bad "train_installed"; cat lib.log; }
same "mgt_train_argv trains what mgtrain does" cli/weights.safetensors lib/weights.safetensors 0
timeout 600 mpirun --oversubscribe --bind-to none -np 2 ./train_installed --caller-mpi lib3 "${S[@]}" --out lib2 >own.log 2>&1 \
  && grep -q "MPI still up after training" own.log && ok "MPI started by the caller: two trainings, MPI left running" || { bad "--caller-mpi"; cat own.log; }
same "first training with the caller's MPI" cli/weights.safetensors lib2/weights.safetensors 0
same "second training with the caller's MPI" cli/weights.safetensors lib3/weights.safetensors 0
timeout 600 mpirun -np 1 ./train_installed --twice "${S[@]}" --out twice >twice.log 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "initialise MPI yourself" twice.log && [ -s twice/weights.safetensors ] \
  && ok "a second call after MPI ended returns 2 and says why" || { bad "--twice: exit $rc"; cat twice.log; }
./train_installed --help >help.log 2>&1 && grep -q -- "--no-tensorboard" help.log && ok "mgt_train_argv --help lists the flags" || { bad "--help"; cat help.log; }
expect_fail "a bad flag through mgt_train_argv" "unknown flag --epoch .*did you mean --epochs" ./train_installed --epoch 3
finish
