#!/usr/bin/env bash
# labels: cli
# timeout: 600
# cores: 1
# One binary for every x86-64 CPU: the default build (no MGT_ARCH) trains on an emulated CPU
# without AVX2 (qemu-user's Nehalem model), its hot loops taking their baseline variant; and a
# build for a given -march (MGT_ARCH) says in one line, before main, what the CPU lacks instead
# of dying of SIGILL. qemu-x86_64 comes from Debian's qemu-user (tests/run installs it).
source "$(dirname "$0")/lib.bash"
command -v qemu-x86_64 >/dev/null || { bad "qemu-x86_64 is missing (apt-get install qemu-user)"; finish; exit 1; }
old=(qemu-x86_64 -cpu Nehalem)
"${old[@]}" /bin/true || { bad "qemu-x86_64 -cpu Nehalem cannot run /bin/true"; finish; exit 1; }

# 1. The default build on a CPU without AVX, AVX2 or FMA: the MLP and a 3x3 ConvNet (Winograd,
#    im2col, pooling, dropout, Adam) train; the same run natively gives the same loss to within
#    one unit of its 4th printed decimal (the two differ only in the rounding of contracted
#    FMAs, ~1e-7 relative after two steps, which can still carry a printed digit over).
run=(--data synthetic --synthetic-samples 256 --batch-size 64 --max-steps 2 --no-validation
     --verbose 2)
for m in "" "$MGT_SRC/examples/smallconv.cfg"; do
  name=${m:+smallconv}; name=${name:-mlp}
  margs=(); [ -n "$m" ] && margs=(--model "$m")
  out=$("${old[@]}" "$MGT_BIN" "${margs[@]}" "${run[@]}" --out "q-$name" 2>&1); rc=$?
  nat=$("$MGT_BIN" "${margs[@]}" "${run[@]}" --out "n-$name" 2>&1)
  lq=$(sed -n 's/.* - loss: \([0-9.]*\).*/\1/p' <<<"$out"); ln=$(sed -n 's/.* - loss: \([0-9.]*\).*/\1/p' <<<"$nat")
  [ $rc -eq 0 ] && [ -n "$lq" ] && [ -n "$ln" ] &&
    awk -v a="$lq" -v b="$ln" 'BEGIN { d = a - b; exit !(d <= 1e-4 && d >= -1e-4) }' \
    && ok "$name trains on a CPU without AVX2 (loss $lq, as natively)" \
    || { bad "$name on qemu -cpu Nehalem: exit $rc, loss '$lq' vs native '$ln'"; tail -5 <<<"$out"; }
done

# 2. The hot loops really come in two variants, picked by the loader.
if command -v nm >/dev/null; then
  n=$(nm "$MGT_BIN" | grep -c '\.arch_x86_64_v3$')
  [ "$n" -ge 10 ] && ok "$n hot loops carry an x86-64-v3 variant" || bad "only $n x86-64-v3 variants in $MGT_BIN"
fi

# 3. MGT_ARCH=x86-64-v3: CMake finds what that target needs, and the start-up check names what
#    the CPU lacks, in one line, with exit 2 (the check compiled as CMakeLists.txt compiles it).
cfg=$(cmake -S "$MGT_SRC" -B arch-v3 -DMGT_ARCH=x86-64-v3 -DMGT_CUDA=OFF 2>&1)
need=$(sed -n 's/.*MGT_ARCH=x86-64-v3: the binary needs \(.*\)/\1/p' <<<"$cfg")
grep -qw avx2 <<<"$need" && grep -qw fma <<<"$need" && ! grep -qw avx512f <<<"$need" \
  && ok "MGT_ARCH=x86-64-v3 needs: $need" || bad "MGT_ARCH=x86-64-v3: '$need' ($(tail -3 <<<"$cfg"))"
printf 'int main(void) { return 0; }\n' >main.c
cc -O2 -march=x86-64 -mtune=generic "-DMGT_ISA_REQUIRED=\"$need\"" '-DMGT_ARCH_NAME="x86-64-v3"' \
  "$MGT_SRC/src/isa_check.c" main.c -o isa || bad "cannot compile src/isa_check.c"
out=$("${old[@]}" ./isa 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] \
  && grep -q "built for -march=x86-64-v3, but this CPU lacks avx, avx2.*fma" <<<"$out" \
  && ok "on a CPU without AVX2 the check says so in one line: $out" || bad "ISA check on Nehalem: exit $rc: $out"
./isa && ok "... and lets this CPU through" || bad "the ISA check refused this machine's CPU"
finish
