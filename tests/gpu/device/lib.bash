# shellcheck shell=bash
# lib.bash: what tests/gpu/prepare-device (the development machine's half of the GPU check) and
# tests/gpu/on-device (the GPU machine's half) share, and what tests/gpu/device/test_*.sh check
# on their own: the carried folder's layout, the digest that ties a carried build to the sources
# it was built from, the manifest, the library checks, the NCCL route for two ranks on one GPU,
# and the figures read off mgtrain's output. Functions only; sourcing it runs nothing.

# shellcheck disable=SC2034 # the settings below are read by the scripts that source this file
# The carried folder (ignored by git, named in the list of folders sent along): build/ holds the
# binaries in the build tree's layout (so bench/peer --build-dir works on it), debs/ the Open MPI
# kit, data/fashion-mnist/ the four .gz files, manifest what the build was made from.
DEV_DIR_DEFAULT=.device
# The binaries the GPU check runs, relative to a build folder: libmgt_gpu.so, the GPU backend
# mgtrain opens (it lies beside mgtrain, and building mgtrain builds it), with them.
DEV_BINARIES=(mgtrain libmgt_gpu.so tests/gpu/test_gpu_fallback tests/gpu/test_gpu_ops
              tests/gpu/test_gpu_train tests/gpu/test_gpu_nccl bench/sgemm_rate
              bench/mgt_allreduce_bench)
DEV_DATA_FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz
                t10k-labels-idx1-ubyte.gz)
# The packages of the kit: Open MPI itself and what its core libraries, mpirun and the
# components in use (btl self/vader/tcp, pml ob1, pmix ext3x) link against, then mgtrain's own
# Debian runtime libraries, and libudev and zlib for a machine that lacks its own (use-openmpi
# uses them only there). Left out on purpose: UCX, libfabric, verbs, PSM and libnuma (only for
# the components use-openmpi switches off) and libhwloc-plugins (optional). Expected on any
# Ubuntu image: libc6 libgcc-s1 libstdc++6.
DEV_DEBS=(openmpi-bin openmpi-common libopenmpi3 libpmix2 libmunge2 libhwloc15 libnl-3-200
          libevent-core-2.1-7 libevent-pthreads-2.1-7
          libopenblas0-pthread libgfortran5 libquadmath0 libinih1 libcjson1 libjpeg62-turbo
          libpng16-16 libudev1 zlib1g)
# What can be sent to the GPU machine at most: the working tree and the carried folders together.
DEV_CARRY_LIMIT=$((64 * 1024 * 1024))
# NCCL_MULTI_RANK_GPU_ENABLE (several ranks of a communicator on one GPU, documented as
# experimental) exists from NCCL 2.30.0; version codes are 10000 x major + 100 x minor + patch.
DEV_NCCL_MULTI_RANK_CODE=23000

# dev_digest ROOT: a digest of every file that goes into the binaries (sources, headers, build
# files, the embedded default model). prepare-device writes it into the manifest; on-device
# computes it again over the checkout it received, so a build older than its sources is named.
dev_digest() {
    (
        cd "$1" || exit 1
        find CMakeLists.txt examples/mlp.cfg src cuda bench tests/gpu tests/unit tests/tools \
            -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.in' \
            -o -name '*.cfg' -o -name CMakeLists.txt \) -print0 |
            LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
    )
}

# dev_manifest_get FILE KEY: the value of KEY= in a manifest (read as text, never sourced).
dev_manifest_get() {
    sed -n "s/^$2=//p" "$1" 2>/dev/null | head -n1
}

# dev_version CODE: NCCL's, cuDNN 9's and cuBLASLt's version codes as text (22809: 2.28.9).
dev_version() {
    echo "$(($1 / 10000)).$(($1 % 10000 / 100)).$(($1 % 100))"
}

# dev_nccl_route CODE: how two ranks share one GPU with this NCCL: "multi-rank" (the documented
# NCCL_MULTI_RANK_GPU_ENABLE=1, 2.30 and later) or "hostid" (a different NCCL_HOSTID per rank:
# undocumented; the ranks then count as separate hosts and talk over sockets).
dev_nccl_route() {
    if [ "${1:-0}" -ge "$DEV_NCCL_MULTI_RANK_CODE" ]; then echo multi-rank; else echo hostid; fi
}

# dev_ldd_missing FILE...: one line "FILE: SONAME" for every library ldd cannot find, one
# "FILE: undefined symbol NAME" for every symbol no loaded library defines (ldd -r: a library
# older than the headers the program was built with), and "FILE: ldd failed (...)" when ldd
# cannot read FILE at all.
dev_ldd_missing() {
    local f out
    for f in "$@"; do
        if ! out=$(ldd -r "$f" 2>&1); then
            echo "$f: ldd failed ($(head -n1 <<<"$out"))"
            continue
        fi
        awk -v f="$f" '/=> not found/ { print f ": " $1 }
                       /^undefined symbol: / { print f ": undefined symbol " $3 }' <<<"$out"
    done
}

# dev_glibc_needed FILE...: the newest GLIBC_x.y symbol version the files ask for.
dev_glibc_needed() {
    local f
    for f in "$@"; do
        objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//'
    done | sort -t. -k1,1n -k2,2n -k3,3n | tail -n1
}

# dev_version_ge A B: whether dotted version A >= B.
dev_version_ge() {
    [ "$(printf '%s\n%s\n' "$1" "$2" | sort -t. -k1,1n -k2,2n -k3,3n | tail -n1)" = "$1" ]
}

# dev_profile_figures LOG: rank 0's phases from mgtrain's --profile table, as
# "step S ms: data D, forward F, backward B, allreduce A (P%), update U" (means, ms).
dev_profile_figures() {
    awk '
        /^Profile \(ms per step/ { in_table = 1; next }
        in_table && $1 == "rank" { n = 0; for (i = 2; i <= NF; i++) name[++n] = $i; next }
        in_table && $1 == "0" {
            gsub("/", " / ")
            $0 = $0
            # each phase is "mean / p95" (3 fields), then the step mean and the all-reduce share
            phases = n - 2
            out = ""
            for (k = 1; k <= phases; k++) {
                v = $(2 + 3 * (k - 1))
                out = out (k > 1 ? ", " : "") name[k] " " v
                if (name[k] == "allreduce") out = out " (" $(2 + 3 * phases + 1) ")"
            }
            printf "step %s ms: %s\n", $(2 + 3 * phases), out
            exit
        }' "$1"
}

# dev_train_figures LOG: the figures of one mgtrain run: steps, seconds and samples/s of the
# training, test accuracy (when it validated), peak GPU memory and the profile.
dev_train_figures() {
    local log=$1 trained acc mem prof epochs
    trained=$(sed -n 's/^Trained \([0-9]*\) steps in \([0-9.]*\) s (\([0-9]*\) samples\/s); total \([0-9.]*\) s.*/\1 steps in \2 s, \3 samples\/s (\4 s in all)/p' "$log" | tail -n1)
    epochs=$(grep -c '^Epoch [0-9]*/[0-9]* - ' "$log")
    acc=$(sed -n 's/^Test loss: \([0-9.]*\) - test acc: \([0-9.]*\)\( - test top5_acc: [0-9.]*\)\{0,1\}$/test acc \2 (loss \1)/p' "$log" | tail -n1)
    mem=$(sed -n 's/^Peak GPU memory: \([0-9.]*\) MiB.*/peak GPU memory \1 MiB/p' "$log" | tail -n1)
    prof=$(dev_profile_figures "$log")
    local parts=()
    [ -n "$trained" ] && parts+=("$trained")
    [ -n "$acc" ] && parts+=("$acc after $epochs epoch(s)")
    [ -n "$prof" ] && parts+=("$prof")
    [ -n "$mem" ] && parts+=("$mem")
    local IFS=';' joined
    joined="${parts[*]}"
    echo "${joined//;/; }"
}

# dev_check_figures LOG: the verdict of a GPU test: a C test's last line ("N checks passed", "K
# checks FAILED, N passed") or its SKIPPED line, else a script's count of "ok:" and "FAIL"
# lines; with the first failed check when there is one.
dev_check_figures() {
    local last first
    last=$(grep -E 'checks (passed|FAILED)|^SKIPPED|passed, [0-9]+ failed' "$1" | tail -n1)
    if [ -z "$last" ] && grep -qE '^(ok: |FAIL)' "$1"; then
        last="$(grep -c '^ok: ' "$1") ok, $(grep -c '^FAIL' "$1") failed"
    fi
    first=$(grep -m1 '^FAIL' "$1")
    echo "${last:-no verdict}${first:+; first failure: $first}"
}
