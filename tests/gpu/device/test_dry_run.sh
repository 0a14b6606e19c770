#!/usr/bin/env bash
# device_dry_run: both halves of the GPU check on this machine, without a GPU, as far as they go.
# prepare-device --dry-run stages this build, downloads the Open MPI kit from Debian's mirror
# (the check of the kit is skipped, and said so, when the mirror does not answer), copies the
# data and writes the manifest; on-device --dry-run then unpacks the kit, finds the GPU libraries
# in a site-packages tree laid out as PyTorch's wheels lay them out (links to this machine's
# CUDA libraries), runs every part up to where a GPU is needed, and writes the summary and the
# tarball. Also: an output folder that holds a run is refused and left as it was, and the kit
# unpacks the same without dpkg (Python's unpacker).
source "$MGT_SRC/tests/cli/lib.bash"
source "$MGT_SRC/tests/gpu/device/lib.bash"
source "$MGT_SRC/tests/gpu/device/testlib.bash"
: "${MGT_BUILD:?}"
OD=$MGT_SRC/tests/gpu/on-device

# 1. The preparation, dry.
out=$(dry_kit "$T/kit")
rc=$?
echo "$out"
[ $rc -eq 0 ] && grep -q "what travels: [0-9.]* MiB of 64.0 MiB" <<<"$out" \
  && ok "prepare-device --dry-run: ready, and under the 64 MiB that can be sent" \
  || bad "prepare-device --dry-run: exit $rc"
missing=0
for b in "${DEV_BINARIES[@]}"; do
  cmp -s "$MGT_BUILD/$b" "$T/kit/build/$b" && [ -x "$T/kit/build/$b" ] || missing=$((missing + 1))
done
[ $missing -eq 0 ] && ok "the ${#DEV_BINARIES[@]} programs are staged in the build tree's layout" \
  || bad "$missing programs missing or different in $T/kit/build"
# the test set whole, the training set's first DEV_TRAIN_KEEP items (the same bytes, the count in
# the header cut to match)
same_data=0
for f in "${DEV_DATA_FILES[@]}"; do
  python3 - "/usr/share/datasets/fashion-mnist/$f" "$T/kit/data/fashion-mnist/$f" "$DEV_TRAIN_KEEP" <<'EOF' \
    && same_data=$((same_data + 1))
import gzip, struct, sys
a, b = (gzip.open(p).read() for p in sys.argv[1:3])
nd = a[3]
n = struct.unpack(">I", a[4:8])[0]
want = min(n, int(sys.argv[3])) if "train-" in sys.argv[1] else n
per = len(a[4 + 4 * nd:]) // n
ok = b[:4] == a[:4] and struct.unpack(">I", b[4:8])[0] == want and b[8:4 + 4 * nd] == a[8:4 + 4 * nd] \
    and b[4 + 4 * nd:] == a[4 + 4 * nd:4 + 4 * nd + want * per]
sys.exit(0 if ok else 1)
EOF
done
[ $same_data -eq 4 ] && ok "the four Fashion-MNIST files: the test set whole, the training set's first $DEV_TRAIN_KEEP" \
  || bad "$same_data of 4 data files as they should be"
for k in commit source_digest glibc_needed cuda cudnn_headers nccl_headers sass; do
  [ -n "$(dev_manifest_get "$T/kit/manifest" "$k")" ] || bad "the manifest has no $k"
done
is_digest=$(dev_manifest_get "$T/kit/manifest" source_digest)
[ "$is_digest" = "$(dev_digest "$MGT_SRC")" ] && ok "the manifest's digest is the sources' ($is_digest)" \
  || bad "manifest digest $is_digest"
KIT=1
if grep -q "SKIPPED: the kit's download" <<<"$out"; then
  KIT=0
  echo "notice: Debian's mirror did not answer: the kit's unpack is not checked in this run"
else
  n=$(find "$T/kit/debs" -name '*.deb' | wc -l)
  [ "$n" -gt ${#DEV_DEB_ROOTS[@]} ] && ok "the kit holds $n .debs (tests/gpu/device/test_kit.sh checks which)" \
    || bad "the kit holds $n .debs"
fi

# 2. site-packages/nvidia/{cu13,cudnn,nccl}/lib as PyTorch's wheels have them, holding links to
#    the GPU libraries this build was linked with; python3 finds it through PYTHONPATH as the
#    namespace package "nvidia".
while read -r soname path; do
  case $soname in
    libcudart* | libcublas*) sub=cu13 ;;
    libcudnn*) sub=cudnn ;;
    libnccl*) sub=nccl ;;
    *) continue ;;
  esac
  mkdir -p "$T/sp/nvidia/$sub/lib"
  ln -sf "$path" "$T/sp/nvidia/$sub/lib/$soname"
  # cuDNN loads its sub-libraries from beside itself at run time
  [ "$sub" = cudnn ] && for f in "$(dirname "$path")"/libcudnn_*.so.9; do ln -sf "$f" "$T/sp/nvidia/cudnn/lib/"; done
done < <(ldd "$MGT_BUILD/libmgt_gpu.so" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }')
ls -R "$T/sp"
nccl_code=$(python3 "$MGT_SRC/bench/benchlib.py" gpu-libs "$MGT_BUILD/mgtrain" | awk '$1 == "NCCL" { print $3 }')
route=$(dev_nccl_route "${nccl_code:-0}")

# 3. The GPU machine's half, dry: both commands into one folder, as a window would bring them
#    back.
export PYTHONPATH=$T/sp MGT_OMPI_PREFIX=$T/ompi
t0=$SECONDS
out=$("$OD" speed --dry-run --from "$T/kit" --out "$T/out" --algo-cache "$T/algos.txt" 2>&1)
rc=$?
echo "$out" | tail -n 12
S=$T/out/speed.md
[ $rc -eq 0 ] && [ -f "$S" ] && [ -f "$T/out/speed-logs.tar.gz" ] \
  && ok "on-device speed --dry-run: exit 0 in $((SECONDS - t0)) s, speed.md and speed-logs.tar.gz written" \
  || bad "on-device speed --dry-run: exit $rc"
row "$S" env PASS "no missing library"
row "$S" gpu_speed SKIPPED "stopped where a GPU is needed: mgtrain: --device gpu: no usable GPU"
row "$S" gpt2_124m SKIPPED "stopped where a GPU is needed: mgtrain: --device gpu: no usable GPU"
row "$S" gpt2_124m_own SKIPPED "stopped where a GPU is needed: mgtrain: --device gpu: no usable GPU"
row "$S" gpu_kernels SKIPPED "dry run: SKIPPED: no usable GPU"
grep -q "^- verdict: 1 PASS, 0 FAIL, 4 SKIPPED of 5 parts (finished)" "$S" \
  && ok "speed: $(grep '^- verdict' "$S")" || bad "speed verdict: $(grep '^- verdict' "$S")"
grep -q -- "--algo-cache $T/algos.txt" "$S" && ok "speed: every mgtrain run shares the --algo-cache file" \
  || bad "speed: no --algo-cache in its commands"
t0=$SECONDS
out=$("$OD" truth --dry-run --from "$T/kit" --out "$T/out" --algo-cache "$T/algos.txt" 2>&1)
rc=$?
echo "$out" | tail -n 24
S=$T/out/truth.md
[ $rc -eq 0 ] && [ -f "$S" ] && [ -f "$T/out/truth-logs.tar.gz" ] \
  && ok "on-device truth --dry-run: exit 0 in $((SECONDS - t0)) s, truth.md and truth-logs.tar.gz written" \
  || bad "on-device truth --dry-run: exit $rc"
row "$S" env PASS "no missing library"
row "$S" test_gpu_fallback PASS "checks passed"
row "$S" test_gpu_ops SKIPPED "dry run: SKIPPED: no usable GPU"
row "$S" test_gpu_seq SKIPPED "dry run: SKIPPED: no usable GPU"
row "$S" test_gpu_train SKIPPED "dry run: SKIPPED: no usable GPU"
row "$S" gpu_fallback_cli PASS "[1-9] ok, 0 failed"
row "$S" nccl_1rank SKIPPED "dry run: SKIPPED: no usable GPU"
if [ "$route" = multi-rank ]; then
  row "$S" nccl_2ranks_one_gpu_multirank SKIPPED "dry run: SKIPPED: no usable GPU"
else
  row "$S" nccl_2ranks_one_gpu_hostid SKIPPED "dry run: SKIPPED: no usable GPU"
  grep -q "two ranks on one GPU: NCCL $(dev_version "$nccl_code") predates NCCL_MULTI_RANK_GPU_ENABLE" "$S" \
    && ok "the summary says which route two ranks on one GPU took, and why" || bad "no route note"
fi
# the training runs, the graphs part and the image set's wait got as far as choosing the GPU
# (every flag accepted)
for p in graphs_resnet50_bf16 convnet_bf16_fashion convnet_fp32_fashion mlp_tf32_fashion_hostdata \
  convnet_reproducible_twice images_data_wait; do
  row "$S" "$p" SKIPPED "stopped where a GPU is needed: mgtrain: --device gpu: no usable GPU"
done
# the parts of several ranks sharing the GPU (tests/gpu/share_gpu.sh, whose first run checks the
# flags every section uses)
for p in share_route share_compare share_repro share_kill share_pipeline share_refuse; do
  row "$S" "$p" SKIPPED "dry run: SKIPPED: no usable GPU \(mgtrain: --device gpu: no usable GPU"
done
grep -q "^- verdict: 3 PASS, 0 FAIL, 17 SKIPPED of 20 parts (finished)" "$S" \
  && ok "truth: $(grep '^- verdict' "$S")" || bad "truth verdict: $(grep '^- verdict' "$S")"
nbf16=$(sed -n '/^# \(convnet_bf16_fashion\)$/{n;p}' "$S" | grep -c -- ' --precision bf16')
[ "$nbf16" -eq 1 ] && grep -q -- "--algo-cache $T/algos.txt" "$S" \
  && ok "the bf16 run carries --precision bf16, and the runs the shared --algo-cache" \
  || bad "$nbf16 bf16 commands; $(grep -c -- '--algo-cache' "$S") with --algo-cache"
# What comes back from the GPU machine: at most 8 files, none above 16 MiB, no folders; ready to
# be committed as it is: no path of the checkout or of the work folder in any of it.
nfiles=$(find "$T/out" -type f | wc -l)
big=$(find "$T/out" -type f -size +16M | wc -l)
dirs=$(find "$T/out" -mindepth 1 -type d | wc -l)
[ "$nfiles" -le 8 ] && [ "$big" -eq 0 ] && [ "$dirs" -eq 0 ] \
  && ok "$nfiles files come back from both commands, none above 16 MiB, no folders: $(find "$T/out" -type f -printf "%f " )" \
  || bad "the output: $nfiles files, $big above 16 MiB, $dirs folders"
grep -q "^- files: truth.md, truth-logs.tar.gz; kept in the repository as they are, in bench/results/gpu-[0-9]\{4\}-[0-9][0-9]-[0-9][0-9]-gpu/$" "$S" \
  && ok "the summary names the folder under bench/results/: $(grep '^- files' "$S")" || bad "files line: $(grep '^- files' "$S")"
for lib in "cu13/lib/libcudart.so.13" "cudnn/lib/libcudnn.so.9" "nccl/lib/libnccl.so.2"; do
  grep -q "^- libraries: .*($T/sp/nvidia/$lib)" "$S" && ok "found $lib in the site-packages tree" \
    || bad "not found in $T/sp: $lib ($(grep '^- libraries' "$S"))"
done
grep -q "^LD_LIBRARY_PATH=$T/sp/nvidia/cu13/lib:$T/sp/nvidia/cudnn/lib:$T/sp/nvidia/nccl/lib" "$S" \
  && ok "the nvidia/*/lib folders lead LD_LIBRARY_PATH" || bad "LD_LIBRARY_PATH: $(grep '^LD_LIBRARY_PATH' "$S")"
grep -q "^- build: .*; matches these sources" "$S" && ok "the build matches these sources" \
  || bad "build line: $(grep '^- build' "$S")"

mkdir -p "$T/x" && tar -xzf "$T/out/truth-logs.tar.gz" -C "$T/x" || bad "truth-logs.tar.gz does not unpack"
named=$(grep -rlF -e "$MGT_SRC" -e "/tmp/mgt-on-device." "$T/out/truth.md" "$T/out/speed.md" "$T/x" 2>/dev/null)
[ -z "$named" ] && grep -q "<checkout>" "$T/x/env.log" \
  && ok "no file names the checkout's path or the work folder (<checkout>, <logs> instead)" \
  || bad "paths of this machine in: $named"
n=0
while read -r part; do
  [ -s "$T/x/$part.log" ] || n=$((n + 1))
done < <(sed -n 's/^| \([a-z0-9_-]*\) | \*\*[A-Z]*\*\* .*/\1/p' "$S")
[ $n -eq 0 ] && cmp -s "$T/x/truth.md" "$S" && ok "the tarball holds the summary and every part's log" \
  || bad "$n part logs missing from the tarball, or its summary differs"
grep -q "^SKIPPED: no usable GPU" "$T/x/nccl_1rank.log" && grep -q "libnccl.so.2 => $T/sp/nvidia/nccl/lib/libnccl.so.2" "$T/x/env.log" \
  && ok "test_gpu_nccl ran under mpirun, loading NCCL from the site-packages tree" \
  || bad "nccl_1rank.log / env.log: $(head -5 "$T/x/nccl_1rank.log")"
if [ $KIT = 1 ]; then
  grep -q "^- Open MPI: 4\.1\.[0-9]* from the kit, unpacked into $T/ompi" "$S" \
    && grep -q "libmpi.so.40 => $T/ompi/usr/lib/x86_64-linux-gnu/libmpi.so.40" "$T/x/env.log" \
    && ok "Open MPI came from the kit (mpirun and libmpi)" || bad "Open MPI: $(grep '^- Open MPI' "$S")"
fi

# 4. An output folder that holds a run of the same command is refused, and left as it was.
sum0=$(sha256sum "$S" "$T/out/truth-logs.tar.gz")
expect_fail "a second truth run into the same folder is refused" \
  "^on-device: $T/out already holds a truth run \(truth.md\); name an empty folder" \
  "$OD" truth --dry-run --from "$T/kit" --out "$T/out"
[ "$(sha256sum "$S" "$T/out/truth-logs.tar.gz")" = "$sum0" ] && ok "... and the first run's files are untouched" \
  || bad "the first run's files changed"

# 5. Without dpkg (MGT_OMPI_UNPACK=python): the same files, and a working mpirun.
if [ $KIT = 1 ]; then
  out=$(MGT_OMPI_PREFIX=$T/ompi-py MGT_OMPI_UNPACK=python bash -c \
        ". '$MGT_SRC/tests/gpu/device/use-openmpi' '$T/kit/debs' && mpirun -np 2 --oversubscribe printenv OMPI_COMM_WORLD_RANK" 2>&1)
  rc=$?
  if [ $rc -eq 0 ] && [ "$(sort <<<"$out" | paste -sd' ')" = "0 1" ] &&
     diff <(cd "$T/ompi" && find . ! -name .mgt-ompi | sort) <(cd "$T/ompi-py" && find . ! -name .mgt-ompi | sort) >/dev/null; then
    ok "the kit unpacked by Python holds dpkg's files, and its mpirun starts 2 ranks"
  else
    bad "the Python unpack (exit $rc): $out"
  fi
fi

finish
