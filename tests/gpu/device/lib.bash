# shellcheck shell=bash
# lib.bash: what tests/gpu/prepare-device (the development machine's half of the GPU check) and
# tests/gpu/on-device (the GPU machine's half) share, and what tests/gpu/device/test_*.sh check
# on their own: the carried folder's layout, the digest that ties a carried build to the sources
# it was built from, the manifest, the library checks, the NCCL route for two ranks on one GPU,
# the kit's packages derived from the binaries, and the figures read off mgtrain's output.
# Functions only; sourcing it runs nothing.

# shellcheck disable=SC2034 # the settings below are read by the scripts that source this file
# The carried folder (ignored by git, named in the list of folders sent along): build/ holds the
# binaries in the build tree's layout (so bench/peer --build-dir works on it), debs/ the Open MPI
# kit, data/fashion-mnist/ the four .gz files, manifest what the build was made from.
DEV_DIR_DEFAULT=.device
# The binaries the GPU check runs, relative to a build folder: libmgt_gpu.so, the GPU backend
# mgtrain opens (it lies beside mgtrain, and building mgtrain builds it), with them.
DEV_BINARIES=(mgtrain libmgt_gpu.so tests/gpu/test_gpu_fallback tests/gpu/test_gpu_ops
              tests/gpu/test_gpu_seq tests/gpu/test_gpu_train tests/gpu/test_gpu_nccl tests/mgt_compare bench/sgemm_rate
              bench/mgt_allreduce_bench bench/mgt_gpu_kernels)
DEV_DATA_FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz
                t10k-labels-idx1-ubyte.gz)
# The training images and labels the kit carries of Fashion-MNIST's 60,000 (prepare-device).
DEV_TRAIN_KEEP=20000
# The kit: Debian 12's Open MPI and every Debian library the carried programs need that the GPU
# machine lacks, as .debs, derived from the binaries themselves (dev_kit_derive): ldd of every
# carried program and of every file of every package taken, each library mapped to the package
# that holds it here (dpkg -S), until nothing new turns up. Named by hand are only the roots,
# what nothing links to: Open MPI's programs (mpirun) and its data (help texts, MCA defaults).
DEV_DEB_ROOTS=(openmpi-bin openmpi-common)
# What the GPU machine provides itself, and the kit therefore leaves out: Ubuntu 24.04's glibc,
# GCC runtime, zlib, libudev and libcap (the first run's env.log shows each resolved from
# /lib/x86_64-linux-gnu there), named by the Debian packages that hold them here; and the GPU
# libraries, which come from PyTorch's wheels (site-packages/nvidia/*/lib) or the driver, named
# by their sonames since no Debian package holds them.
DEV_MACHINE_DEBS=(libc6 libgcc-s1 libstdc++6 zlib1g libudev1 libcap2)
DEV_MACHINE_SONAMES=('libcuda.so.*' 'libcudart.so.*' 'libcublas.so.*' 'libcublasLt.so.*'
                     'libcudnn*.so.*' 'libnccl.so.*' 'libnvidia-*.so.*' 'libnvrtc*.so.*')
# Open MPI components of the transports the kit does not use (UCX, libfabric, verbs, PSM, PSM2:
# one node talks over shared memory and TCP) and the libraries only they link: use-openmpi
# deletes them from the unpacked kit, so that Open MPI cannot try to load them, and
# dev_kit_derive neither follows nor carries what they need.
DEV_OMPI_DROP=('mca_*_ucx.so' 'libmca_common_ucx.so*' 'mca_*_ofi.so' 'libmca_common_ofi.so*'
               'mca_btl_openib.so' 'libmca_common_verbs.so*' 'mca_mtl_psm.so' 'mca_mtl_psm2.so'
               'mca_btl_usnic.so' 'mca_btl_uct.so')
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

# dev_unsafe_runpath FILE...: "FILE: [ENTRY]" for each entry of a file's RUNPATH or RPATH that is
# neither absolute nor $ORIGIN-relative (the loader reads an empty or relative one from the folder
# a program is started in); nothing when all are sound. prepare-device builds without any.
dev_unsafe_runpath() {
    local f
    for f in "$@"; do
        readelf -d "$f" 2>/dev/null | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]$/\2/p' |
            awk -F: -v f="$f" '{ for (i = 1; i <= NF; i++)
                if ($i !~ /^\// && $i !~ /^\$(ORIGIN|\{ORIGIN\})(\/|$)/) print f ": [" $i "]" }'
    done
}

# ---- the kit, derived from the binaries -----------------------------------------------------

# dev_is_elf FILE: whether FILE (through links) is an ELF object.
dev_is_elf() { # (read, a builtin: a kit's packages hold hundreds of files)
    local magic
    [ -f "$1" ] && LC_ALL=C IFS= read -r -d '' -n 4 magic <"$1" 2>/dev/null
    [ "${magic:-}" = $'\x7fELF' ]
}

# dev_machine_soname SONAME: whether the GPU machine provides this library by name.
dev_machine_soname() {
    local g
    for g in "${DEV_MACHINE_SONAMES[@]}"; do
        # shellcheck disable=SC2053 # a glob on purpose
        [[ $1 == $g ]] && return 0
    done
    return 1
}

# dev_machine_deb PACKAGE: whether the GPU machine has this Debian package's libraries.
dev_machine_deb() {
    local d
    for d in "${DEV_MACHINE_DEBS[@]}"; do [ "$d" = "$1" ] && return 0; done
    return 1
}

# dev_kit_dropped FILE: whether use-openmpi deletes FILE from the unpacked kit (DEV_OMPI_DROP).
dev_kit_dropped() {
    local g base=${1##*/}
    for g in "${DEV_OMPI_DROP[@]}"; do
        # shellcheck disable=SC2053 # a glob on purpose
        [[ $base == $g ]] && return 0
    done
    return 1
}

# dev_kit_libpath PREFIX: the library folders of a kit unpacked into PREFIX, as use-openmpi puts
# them on LD_LIBRARY_PATH.
dev_kit_libpath() {
    local L=$1/usr/lib/x86_64-linux-gnu
    echo "$L:$L/openblas-pthread:$1/lib/x86_64-linux-gnu"
}

# dev_needs FILE...: one line "FILE<tab>SONAME<tab>PATH" for every library ldd resolves for FILE
# (PATH "not found" where it finds none); files that are not dynamic give nothing.
dev_needs() {
    local f
    for f in "$@"; do
        ldd "$f" 2>/dev/null | awk -v f="$f" '$2 == "=>" {
            print f "\t" $1 "\t" ($3 == "not" ? "not found" : $3) }'
    done
}

# dev_debs_lookup PATH...: finds the Debian package that holds each library path here, with one
# dpkg -S for all (it reads the whole package database each time), trying each path as ldd
# printed it and its target, each also with /usr added or removed (merged /usr). Answers are
# remembered for dev_deb_of.
declare -gA _DEV_DEB_OF=()
dev_debs_lookup() {
    local -A cand=()
    local p o c out pkg path
    for p in "$@"; do
        [ -n "${_DEV_DEB_OF[$p]+x}" ] && continue
        _DEV_DEB_OF[$p]=""
        for o in "$p" "$(readlink -f "$p")"; do
            for c in "$o" "${o#/usr}" "/usr$o"; do cand[$c]+="$p"$'\n'; done
        done
    done
    [ ${#cand[@]} -gt 0 ] || return 0
    while IFS= read -r out; do # "pkg[:arch][, pkg...]: path"
        pkg=${out%%: /*} && pkg=${pkg%%,*} && pkg=${pkg%%:*} && path=${out#*: }
        while IFS= read -r p; do
            [ -n "$p" ] && [ -z "${_DEV_DEB_OF[$p]}" ] && _DEV_DEB_OF[$p]=$pkg
        done <<<"${cand[$path]:-}"
    done < <(dpkg -S "${!cand[@]}" 2>/dev/null | grep -v '^diversion')
}

# dev_deb_of PATH: that package; nothing when no package holds the file.
dev_deb_of() {
    dev_debs_lookup "$1"
    echo "${_DEV_DEB_OF[$1]}"
}

# dev_kit_derive FILE...: the kit's packages for these carried programs: DEV_DEB_ROOTS and, until
# nothing new turns up, the package of every library that the programs or any file of a package
# taken need (ldd here: the packages must be installed here, as launch/install-deps does), less
# what the GPU machine provides (DEV_MACHINE_DEBS, DEV_MACHINE_SONAMES) and the files
# use-openmpi deletes (DEV_OMPI_DROP). Prints the packages, one a line, sorted. Status 1 when a
# library cannot be placed (not found here, or held by no Debian package), each named on stderr
# with the file that needs it.
dev_kit_derive() {
    local -A taken=()
    local queue=() files=("$@") needs=() bad=0 f soname path pkg
    for pkg in "${DEV_DEB_ROOTS[@]}"; do
        if ! dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep 'ok installed' >/dev/null; then
            echo "the kit's package $pkg is not installed here: run launch/install-deps $pkg" >&2
            return 1
        fi
        taken[$pkg]=1 && queue+=("$pkg")
    done
    while :; do
        mapfile -t needs < <(dev_needs "${files[@]}")
        # shellcheck disable=SC2046 # one path a word
        dev_debs_lookup $(printf '%s\n' "${needs[@]}" | cut -f3 | grep '^/' | sort -u)
        while IFS=$'\t' read -r f soname path; do
            [ -n "$f" ] || continue
            dev_machine_soname "$soname" && continue
            if [ "$path" = "not found" ]; then
                echo "$f needs $soname, which is not found here either: install the Debian" \
                    "package that holds it, so that the kit can take it along" >&2
                bad=1 && continue
            fi
            pkg=$(dev_deb_of "$path")
            if [ -z "$pkg" ]; then
                echo "$f needs $soname ($path), which no Debian package holds: the kit cannot" \
                    "take it along (link against a Debian library, or add it to the machine's" \
                    "own in tests/gpu/device/lib.bash if the GPU machine has it)" >&2
                bad=1 && continue
            fi
            dev_machine_deb "$pkg" && continue
            [ -n "${taken[$pkg]+x}" ] || { taken[$pkg]=1 && queue+=("$pkg"); }
        done < <(printf '%s\n' "${needs[@]}")
        [ ${#queue[@]} -gt 0 ] || break
        files=()
        for pkg in "${queue[@]}"; do
            while IFS= read -r f; do
                [ -L "$f" ] || dev_kit_dropped "$f" || ! dev_is_elf "$f" || files+=("$f")
            done < <(dpkg -L "$pkg" 2>/dev/null)
        done
        queue=()
    done
    [ $bad = 0 ] || return 1
    printf '%s\n' "${!taken[@]}" | sort
}

# dev_kit_uncovered PREFIX FILE...: with the kit unpacked into PREFIX (use-openmpi's layout and
# library path), one line "FILE: SONAME (PATH)" for every library that FILE or any ELF file of
# the kit needs and that neither the kit holds nor the GPU machine provides: what would not load
# there. Nothing when the kit covers it all.
dev_kit_uncovered() {
    local P=$1 f soname path pkg
    shift
    local files=("$@")
    while IFS= read -r f; do dev_is_elf "$f" && files+=("$f"); done < <(find "$P" -type f | sort)
    local needs=()
    mapfile -t needs < <(LD_LIBRARY_PATH=$(dev_kit_libpath "$P") dev_needs "${files[@]}")
    # shellcheck disable=SC2046 # one path a word
    dev_debs_lookup $(printf '%s\n' "${needs[@]}" | cut -f3 | grep '^/' | grep -v "^$P/" | sort -u)
    while IFS=$'\t' read -r f soname path; do
        [ -n "$f" ] || continue
        dev_machine_soname "$soname" && continue
        case $path in "$P"/*) continue ;; esac
        if [ "$path" != "not found" ]; then
            pkg=$(dev_deb_of "$path")
            [ -n "$pkg" ] && dev_machine_deb "$pkg" && continue
        fi
        echo "$f: $soname ($path)"
    done < <(printf '%s\n' "${needs[@]}")
}

# dev_mpi_banners [FILE...]: the error text Open MPI and PMIx print, one line each: a component
# they could not load ("...component_repository_open: unable to open ..."), an error log line,
# and the title line of every framed help message (show_help's banners, between lines of
# dashes: "PMIx was unable to find a usable compression library", "mpirun noticed that ...").
# A run that passes prints none. Reads standard input without FILEs.
# shellcheck disable=SC2120 # called with and without files
dev_mpi_banners() {
    awk '/^-+$/ && length($0) >= 60 { if (!inside) { inside = 1; title = 1 } else inside = 0; next }
         title && NF { print "banner: " $0; title = 0; next }
         /component_repository_open: unable to open|ORTE_ERROR_LOG|OPAL_ERROR|PMIX ERROR|PMIX_ERROR/ { print }' "$@"
}

# dev_mpi_failures [FILE...] and dev_mpi_harmless [FILE...]: dev_mpi_banners' lines split in two.
# Harmless: PMIx's compression banner and the failed load of its zlib component behind it (a
# machine with a PMIx of its own, whose pcompress component the kit's PMIx tried and could not
# load: "undefined symbol: pmix_output_info"), which only means that PMIx does not compress its
# large data streams; the kit silences it (use-openmpi), and where it still shows, it is a note
# of the run, not a failure of the part. Every other line is a failure.
DEV_MPI_HARMLESS='pmix_mca_pcompress_|PMIx was unable to find a usable compression library'
# shellcheck disable=SC2120 # called with and without files
dev_mpi_failures() {
    dev_mpi_banners "$@" | grep -vE "$DEV_MPI_HARMLESS"
}
# shellcheck disable=SC2120
dev_mpi_harmless() {
    dev_mpi_banners "$@" | grep -E "$DEV_MPI_HARMLESS"
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
