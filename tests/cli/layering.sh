#!/usr/bin/env bash
# labels: cli
# cores: 1
# The sources keep the layering docs/architecture.md writes down (tests/tools/layering.py): no file
# includes a header of a layer above its own, no two src/ modules include each other around a
# circle, and every source file has its line in the file map. Then the check itself, on a copy of
# the sources: a planted upward include, a circle, a file without a line and a line without a file
# must each fail with a message naming them.
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
