#!/usr/bin/env bash
# device_kit: the kit that travels to the GPU machine (Open MPI and mgtrain's Debian libraries as
# .debs) is derived from the binaries and cannot fall behind them, and its mpirun loads only its
# own components.
#   1. prepare-device --dry-run derives the packages from the carried programs (with the
#      TensorBoard writer's libprotobuf-c and ISA-L, which the first GPU run lacked), leaves out
#      what the GPU machine has and what only the unused transports need, and checks the kit,
#      unpacked, covers every library; the same check names the libraries of a kit that lacks
#      libprotobuf-c1 and libisal2 (the first run's failure).
#   2. The derivation itself: a Debian library a program needs is added; a library no package
#      holds, and one that is missing here too, are refused with a message naming them.
#   3. The kit's mpirun: Open MPI and PMIx search only the kit's component folders (their own
#      verbose output), where the previous settings searched the compiled-in /usr folder first
#      (the GPU machine's own PMIx 5 components, which broke every mpirun there); a component in
#      a folder the kit's PMIx parameter file names is not loaded, while without
#      PMIX_MCA_mca_base_component_path it is, and the detector of Open MPI's and PMIx's error
#      text names it; and two ranks of mgtrain print no Open MPI or PMIx error text.
# The kit's parts need Debian's mirror (apt-get download); without it they are skipped, said so.
source "$MGT_SRC/tests/cli/lib.bash"
source "$MGT_SRC/tests/gpu/device/lib.bash"
source "$MGT_SRC/tests/gpu/device/testlib.bash"
: "${MGT_BUILD:?}"
USE=$MGT_SRC/tests/gpu/device/use-openmpi

# 1. The kit of this build.
out=$(dry_kit "$T/kit")
rc=$?
echo "$out" | grep -E "kit|SKIPPED"
derived=$(sed -n 's/^prepare-device: the kit, derived from the programs: //p' <<<"$out")
[ $rc -eq 0 ] && [ -n "$derived" ] && ok "prepare-device derives the kit: $derived" \
  || bad "prepare-device --dry-run: exit $rc, no derived kit: $(tail -3 <<<"$out")"
for p in openmpi-bin openmpi-common libopenmpi3 libpmix2 libopenblas0-pthread libinih1 libcjson1 \
  libprotobuf-c1 libisal2; do
  [[ " $derived " == *" $p "* ]] || bad "the derived kit lacks $p"
done
for p in libc6 libstdc++6 libgcc-s1 zlib1g libudev1 libcap2 libucx0 libfabric1 libibverbs1 \
  libpsm2-2 libnuma1; do
  [[ " $derived " == *" $p "* ]] && bad "the derived kit holds $p (the GPU machine's, or for an unused transport)"
done
ok "... with mpirun's and mgtrain's libraries, without the GPU machine's own or the unused transports'"
KIT=1
if grep -q "SKIPPED: the kit's download" <<<"$out"; then
  KIT=0
  echo "notice: Debian's mirror did not answer: the downloaded kit is not checked in this run"
else
  grep -q "^prepare-device: the kit: [0-9]* .debs, .*; unpacked, it covers every library$" <<<"$out" \
    && ok "the kit, downloaded and unpacked, covers every library of every carried program" \
    || bad "no coverage line: $(grep 'the kit' <<<"$out")"
  n=$(find "$T/kit/debs" -name '*.deb' | wc -l)
  [ "$n" -eq "$(wc -w <<<"$derived")" ] && ok "the kit holds the $n derived .debs" || bad "the kit holds $n .debs"
  # The first GPU run's kit: the same, less the TensorBoard writer's libraries.
  mkdir -p short
  cp "$T"/kit/debs/*.deb short/ && rm short/libprotobuf-c1_*.deb short/libisal2_*.deb
  MGT_OMPI_PREFIX=$T/short-p bash -c '. "$0" "$1"' "$USE" "$T/short" || bad "the short kit does not unpack"
  miss=$(dev_kit_uncovered "$T/short-p" "$T/kit/build/mgtrain" | sed "s|^$T/kit/build/||" | sort | paste -sd'|')
  [ "$miss" = "mgtrain: libisal.so.2 (/lib/x86_64-linux-gnu/libisal.so.2)|mgtrain: libprotobuf-c.so.1 (/lib/x86_64-linux-gnu/libprotobuf-c.so.1)" ] \
    && ok "a kit without libprotobuf-c1 and libisal2 is named for exactly those two libraries" \
    || bad "the short kit's check says: '$miss'"
fi

# 2. The derivation's decisions, on one program at a time (no roots: only its own libraries).
derive() { (DEV_DEB_ROOTS=() && dev_kit_derive "$@") 2>derive.err; }
zstd=$(ldconfig -p | awk '$1 == "libzstd.so.1" && /x86-64/ { print $NF; exit }')
if [ -n "$zstd" ] && printf 'int main(void) { return 0; }\n' >m.c &&
  cc -o needs_zstd m.c -Wl,--no-as-needed "$zstd"; then
  got=$(derive "$T/needs_zstd" | paste -sd' ')
  [ "$got" = "libzstd1" ] && ok "a program that needs libzstd.so.1: libzstd1 is added" \
    || bad "needs_zstd: derived '$got' ($(cat derive.err))"
else
  bad "cannot build a program linked to libzstd.so.1"
fi
MGT_KEEP_GONE=1 build_needs_gone "$T/needs_own" || bad "cannot build a program with a library of its own"
if LD_LIBRARY_PATH=$T derive "$T/needs_own" >/dev/null; then
  bad "a library no Debian package holds was accepted"
else
  grep -q "^$T/needs_own needs libmgtgone.so.1 ($T/libmgtgone.so.1), which no Debian package holds" derive.err \
    && ok "a library no Debian package holds is refused, named: $(head -c 120 derive.err)..." \
    || bad "refusal: $(cat derive.err)"
fi
if derive "$T/needs_own" >/dev/null; then
  bad "a library missing here was accepted"
else
  grep -q "^$T/needs_own needs libmgtgone.so.1, which is not found here either" derive.err \
    && ok "a library missing here is refused, named" || bad "refusal: $(cat derive.err)"
fi

# 3. The kit's mpirun and its components.
if [ $KIT = 1 ]; then
  P=$T/ompi
  # shellcheck disable=SC2016 # expanded by the inner shell
  kit_run() { # mgtrain on 2 ranks with the kit into $OUTDIR, less the variables UNSET names,
    #           with both libraries' component search verbose
    env MGT_OMPI_PREFIX="$P" bash -c '. "$0" "$1" || exit 9; shift; for v in "$@"; do unset "$v"; done
      PMIX_MCA_mca_base_verbose=stderr,level:100 OMPI_MCA_mca_base_verbose=stderr,level:100 \
        mpirun -np 2 --oversubscribe "$MGT_BIN" train --device cpu --data synthetic \
        --synthetic-samples 256 --batch-size 64 --max-steps 2 --verbose 0 --out "$OUTDIR"' \
      "$USE" "$T/kit/debs" "${UNSET[@]}" 2>&1
  }
  UNSET=()
  out=$(OUTDIR=$T/r1 kit_run) && [ -f "$T/r1/weights.safetensors" ] \
    && ok "mgtrain runs 2 ranks with the kit's mpirun" || bad "2 ranks with the kit: $(tail -5 <<<"$out")"
  pmix=$(grep -o 'opening components at pmix@[^ ]*' <<<"$out" | sort -u)
  own=$(grep -oE '(^|[ :@"=])/usr/lib/x86_64-linux-gnu/(openmpi|pmix2)[^ :]*' <<<"$out" | sort -u)
  [ -n "$pmix" ] && [ -z "$own" ] && [ "$pmix" = "opening components at pmix@$P/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix:$P/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix" ] \
    && grep -q "examining dynamic btl MCA component \"tcp\" at path $P/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_btl_tcp" <<<"$out" \
    && ok "PMIx and Open MPI search only the kit's folders ($pmix)" \
    || bad "component search: PMIx '$pmix'; outside the kit: '$own'"
  # The previous settings (Open MPI relocated by OPAL_PREFIX, PMIx only given the parameter):
  # the compiled-in folder first, where the GPU machine has its own PMIx's components.
  UNSET=(PMIX_PREFIX PMIX_PKGLIBDIR PMIX_PKGDATADIR PMIX_SYSCONFDIR OMPI_MCA_mca_base_component_path)
  out=$(OUTDIR=$T/r2 kit_run)
  grep -q "opening components at pmix@/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix:" <<<"$out" \
    && ok "... where PMIx without PMIX_PKGLIBDIR searches the compiled-in /usr folder first" \
    || bad "the control: $(grep -o 'opening components at [^ ]*' <<<"$out" | sort -u)"
  # A foreign PMIx component (one that does not load: an undefined symbol, as the GPU machine's
  # PMIx 5 components in PMIx 4.2) in a folder the kit's parameter file names (the kit's file,
  # not the machine's: PMIX_SYSCONFDIR; were the machine's read, the change would show nothing).
  mkdir -p foreign
  printf 'extern int pmix_no_such_symbol(void);\nint foreign(void) { return pmix_no_such_symbol(); }\n' >f.c
  cc -shared -fPIC -Wl,-z,now -o foreign/pmix_mca_pcompress_foreign.so f.c || bad "cannot build the foreign component"
  conf=$P/usr/lib/x86_64-linux-gnu/pmix2/share/pmix-mca-params.conf
  grep -q "^mca_base_component_path = /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix$" "$conf" \
    && ok "Debian's pmix-mca-params.conf names the compiled-in folder" || bad "$conf: $(grep -v '^#' "$conf")"
  sed -i "s|^mca_base_component_path = .*|mca_base_component_path = $T/foreign|" "$conf"
  UNSET=()
  out=$(OUTDIR=$T/r3 kit_run)
  banners=$(dev_mpi_banners <<<"$out")
  [ -f "$T/r3/weights.safetensors" ] && [ -z "$banners" ] && ! grep -q foreign <<<"$out" \
    && ok "with a foreign component on the parameter file's path: not searched, no error text" \
    || bad "foreign component: $banners"
  UNSET=(PMIX_MCA_mca_base_component_path)
  out=$(OUTDIR=$T/r4 kit_run)
  banners=$(dev_mpi_banners <<<"$out")
  grep -q "pmix_mca_base_component_repository_open: unable to open $T/foreign/pmix_mca_pcompress_foreign" <<<"$banners" \
    && ok "... which PMIx tries to load without PMIX_MCA_mca_base_component_path, and the detector names" \
    || bad "without the parameter: banners '$banners'"
  # The run with use-openmpi's settings as they are, without verbose output: no error text.
  out=$(MGT_OMPI_PREFIX=$P bash -c '. "$0" "$1" && mpirun -np 2 --oversubscribe "$2" train \
    --device cpu --data synthetic --synthetic-samples 256 --batch-size 64 --max-steps 2 \
    --verbose 0 --out "$3"' "$USE" "$T/kit/debs" "$MGT_BIN" "$T/r5" 2>&1)
  [ -f "$T/r5/weights.safetensors" ] && [ -z "$(dev_mpi_banners <<<"$out")" ] \
    && ok "2 ranks with the kit print no Open MPI or PMIx error text" || bad "error text: $out"
fi
finish
