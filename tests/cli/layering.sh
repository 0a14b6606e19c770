#!/usr/bin/env bash
# labels: cli
# cores: 1
# The sources keep the layering docs/architecture.md writes down (tests/tools/layering.py): no file
# includes a header of a layer above its own, no two src/ modules include each other around a
# circle, no file of src/ or cuda/ calls a function of a layer above its own, no two modules of src/ or
# of cuda/ call each other around a circle, and every source file has its line in the file map. Then the check
# itself, on a copy of the sources: a planted upward include, a circle of includes, an upward
# call (direct, and through a macro), two files calling each other (in src/ and in cuda/), a file without a line and a
# line without a file must each fail with a message naming them, and an op table's pointer to a
# function (no call) must pass. A few seconds.
source "$(dirname "$0")/lib.bash"
check="$MGT_SRC/tests/tools/layering.py"

out=$(python3 "$check" "$MGT_SRC" 2>&1) && ok "the sources keep the layering: ${out##*$'\n'}" \
  || { bad "the sources break the layering:"; echo "$out"; }

# planted REGEX: a copy of the sources, changed by the commands on stdin, must fail naming REGEX.
planted() {
  local name=$1 pat=$2
  rm -rf copy && mkdir copy
  cp -r "$MGT_SRC"/{src,cuda,include,tests,bench,docs} copy/
  (cd copy && bash) || { bad "$name: could not plant it"; return; }
  local rc=0
  out=$(python3 "$check" copy 2>&1) || rc=$?
  if [ "$rc" -eq 1 ] && grep -qE -- "$pat" <<<"$out"; then ok "$name is refused"
  else bad "$name: exit $rc, wanted 1 and /$pat/:"; echo "$out" | tail -5; fi
}

planted "an upward include (the model reaching up to the training loop)" \
  '^src/model\.c \(layer model\) includes "fit\.h", src/fit\.h of layer loop above it$' <<'EOF'
echo '#include "fit.h"' >>src/model.c
EOF
planted "a circle between two modules of one layer" \
  'in a circle: src/checkpoint src/replica$' <<'EOF'
sed -i 's/#include "comm.h"/#include "comm.h"\n#include "replica.h"/' src/checkpoint.h
grep -q '"replica.h"' src/checkpoint.h
EOF
planted "an upward call (the base layer's exact sums calling the training loop)" \
  '^src/exactsum\.c \(layer base\) calls mgt_fit of src/fit\.c, layer loop above it$' <<'EOF'
printf 'void mgt_planted(void);\nvoid mgt_planted(void) { mgt_fit(0, 0, 0, 0); }\n' >>src/exactsum.c
EOF
planted "an upward call through a macro of a header" \
  '^src/tb\.c \(layer base\) calls mgt_fit of src/fit\.c, layer loop above it$' <<'EOF'
printf '#define MGT_PLANTED_FIT(e) mgt_fit((e), 0, 0, 0)\n' >>src/util.h
printf 'void mgt_planted(void);\nvoid mgt_planted(void) { MGT_PLANTED_FIT(0); }\n' >>src/tb.c
EOF
planted "two files of one layer calling each other" \
  '^modules that call each other in a circle: src/exactsum src/tb: src/exactsum\.c calls mgt_tb_frame \(src/tb\.c\); src/tb\.c calls mgt_xs_round \(src/exactsum\.c\)$' <<'EOF'
printf 'void mgt_planted_a(void);\nvoid mgt_planted_a(void) { mgt_tb_frame(0, 0, 0); }\n' >>src/exactsum.c
printf 'void mgt_planted_b(void);\nvoid mgt_planted_b(void) { mgt_xs_round(0, 0, 0); }\n' >>src/tb.c
EOF
planted "two files of the GPU backend calling each other" \
  '^modules that call each other in a circle: cuda/gpu_pool cuda/gpu_reduce: ' <<'EOF'
printf 'void mgt_planted_a(void) { mgt_k_colreduce(0, 0, 0, 0, 0); }\n' >>cuda/gpu_pool.cu
printf 'void mgt_planted_b(void) { mgt_gpu_avgpool_bwd(0, 0, 0, 0); }\n' >>cuda/gpu_reduce.cu
EOF
# An op table names its functions without calling them (the CPU backend's table is how the model
# reaches the ops): a table in one file holding a function of another that calls back is no
# circle.
rm -rf copy && mkdir copy && cp -r "$MGT_SRC"/{src,cuda,include,tests,bench,docs} copy/
printf 'void (*const mgt_planted_table[1])(size_t, int64_t *, float *) = {mgt_xs_round};\n' >>copy/src/tb.c
printf 'void mgt_planted_b(void);\nvoid mgt_planted_b(void) { mgt_tb_frame(0, 0, 0); }\n' >>copy/src/exactsum.c
out=$(python3 "$check" copy 2>&1) && ok "a function's address in a table is no call" ||
  { bad "a function's address in a table was taken for a call:"; echo "$out" | tail -3; }
planted "a new file with no line in the file map" \
  '^src/newpart\.c: no layer' <<'EOF'
printf '#include "util.h"\n' >src/newpart.c
EOF
planted "a line for a file that is gone" \
  'architecture\.md:[0-9]+: src/plot\.h does not exist' <<'EOF'
rm src/plot.h
EOF
planted "an include of a header that is not there" \
  '^src/fit\.c: #include "nowhere\.h" is no file' <<'EOF'
echo '#include "nowhere.h"' >>src/fit.c
EOF
finish
