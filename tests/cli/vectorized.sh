#!/usr/bin/env bash
# labels: cli
# The optimizer's update is a streaming pass that is fast only when the compiler vectorises it
# (src/cpu/cpu_optim.c): Adam's loop once stayed scalar in the AVX2 and baseline clones (a
# short-circuit && in its rule kept GCC from turning the branches into selects) and took 1.4 ms
# of a 4.7 ms MLP step on a 2-core EPYC, against 0.19 vectorised. Checked in the binary itself:
# each optimizer loop's clone for every instruction-set level (MGT_SIMD: x86-64-v4, v3 and the
# baseline) works on packed floats (the ...ps instructions), Adam's and RMSprop's square root and
# division included. Where the build has no such clones (another compiler or architecture), is
# not a release build, or has the sanitizers' instrumentation (which changes what GCC
# vectorises), it says so.
source "$(dirname "$0")/lib.bash"
objdump -d --no-show-raw-insn "$MGT_BIN" >all.s
fn() { # fn SYMBOL: the disassembly of one function of the binary
  awk -v f="<$1>:" '$2 == f {p = 1; next} p && /^$/ {exit} p' all.s
}
ldd "$MGT_BIN" >libs 2>&1; nm "$MGT_BIN" >syms 2>&1 # (files: grep -q would end a pipe early)
type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$MGT_BUILD/CMakeCache.txt" 2>/dev/null)
if grep -q 'libasan\|libubsan' libs; then
  echo "note: a build with the sanitizers; what the compiler vectorises there is not the release build's"
elif [ "$type" != Release ] && [ "$type" != RelWithDebInfo ]; then
  echo "note: a ${type:-plain} build, not optimised as a release build is; nothing to check"
elif ! grep -q ' loop_ADAM\.default$' syms; then
  echo "note: no per-instruction-set clones of the optimizer's loops in this build ($(uname -m)); nothing to check"
else
  for loop in SGD RMSPROP ADAM; do
    for clone in arch_x86_64_v4 arch_x86_64_v3 default; do
      fn "loop_$loop.$clone" >asm
      want='mulps'
      [ $loop != SGD ] && want='mulps sqrtps divps'
      miss=
      for op in $want; do grep -q "v\?$op" asm || miss="$miss $op"; done
      [ -s asm ] && [ -z "$miss" ] && ok "loop_$loop.$clone works on packed floats ($want)" \
        || bad "loop_$loop.$clone: no packed${miss:- anything} in its $(wc -l <asm) instructions"
    done
  done
fi
finish
