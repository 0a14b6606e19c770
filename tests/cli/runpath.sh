#!/usr/bin/env bash
# labels: cli
# timeout: 300
# cores: 1
# No code is loaded from a folder nobody installed it in:
#   1. every ELF file of the build folder and of a `cmake --install` prefix has only absolute and
#      $ORIGIN-relative RUNPATH/RPATH entries (an empty entry, as CMake's padding for rewriting
#      the path at install leaves, or a relative one means the current folder to the loader);
#   2. mgtrain, a copy of it without libmgt_gpu.so beside it, the installed mgtrain, and the C
#      library's example program of docs/library.md run from a folder of decoys (every library
#      they need, libmgt_gpu.so and libmgt.so.0, each with a constructor that leaves a mark)
#      and no decoy runs; a program with an empty RUNPATH entry, run there, shows that the decoys
#      would have run;
#   3. the example of docs/library.md, built with the page's own pkg-config line against the
#      install in ~/.local, starts without LD_LIBRARY_PATH.
# About 15 s (the install, two compilations, two 2-step trainings).
source "$(dirname "$0")/lib.bash"
: "${MGT_BUILD:?}"
unset LD_LIBRARY_PATH

# unsafe FILE: the entries of FILE's RUNPATH and RPATH that are neither absolute nor $ORIGIN-relative.
unsafe() {
  readelf -d "$1" 2>/dev/null | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]$/\2/p' |
    awk -F: '{ for (i = 1; i <= NF; i++) if ($i !~ /^\// && $i !~ /^\$(ORIGIN|\{ORIGIN\})(\/|$)/) printf "[%s] ", $i }'
}
# elf_files DIR [PRUNE]: the ELF files under DIR (but under PRUNE), NUL-separated.
elf_files() {
  python3 - "$@" <<'EOF'
import os, sys
top, prune = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
for d, dirs, files in os.walk(top):
    dirs[:] = [x for x in dirs if os.path.join(d, x) != prune]
    for f in files:
        p = os.path.join(d, f)
        try:
            with open(p, "rb") as h:
                if h.read(4) == b"\x7fELF" and not os.path.islink(p):
                    sys.stdout.write(p + "\0")
        except OSError:
            pass
EOF
}
# scan NAME DIR [PRUNE]: every ELF file under DIR (but PRUNE) checked; says how many.
scan() {
  local name=$1 dir=$2 f u n=0 paths=0 found=""
  while IFS= read -r -d '' f; do
    n=$((n + 1))
    readelf -d "$f" 2>/dev/null | grep -qE '\((RPATH|RUNPATH)\)' || continue
    paths=$((paths + 1))
    u=$(unsafe "$f")
    [ -z "$u" ] || found+="${f#"$dir"/}: $u"$'\n'
  done < <(elf_files "$dir" ${3:+"$3"})
  [ "$n" -gt 0 ] || { bad "$name: no ELF file found under $dir"; return; }
  [ -z "$found" ] && ok "$name: $n ELF files, $paths with a run path, none with an empty or relative entry" ||
    { bad "$name: empty or relative run-path entries:"; printf '%s' "$found"; }
}

# 1. The build folder (the tensorboard test's virtual environment holds PyPI's files, not ours)
# and an install under ~/.local, the prefix docs/library.md shows.
scan "the build folder" "$MGT_BUILD" "$MGT_BUILD/tensorboard-venv"
export HOME=$T/home
mkdir -p "$HOME"
P=$HOME/.local
cmake --install "$MGT_BUILD" --prefix ~/.local >install.log 2>&1 && ok "cmake --install --prefix ~/.local" ||
  { bad "cmake --install"; tail install.log; }
scan "the install" "$P"
for f in "$P/bin/mgtrain" "$P"/lib/libmgt.so.0; do
  [ -e "$f" ] && [ -z "$(unsafe "$f")" ] || bad "not installed, or unsafe: $f"
done

# 2. The decoys: one library per name the programs need, each leaving a mark when loaded.
D=$T/decoys
mkdir -p "$D"
cat >decoy.c <<'EOF'
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    int fd = open(MARK, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        (void)!write(fd, NAME "\n", strlen(NAME) + 1);
        close(fd);
    }
}
EOF
needed() { readelf -d "$@" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p'; }
# (glibc's own libraries aside: a decoy of those could not even be loaded.)
names=$( {
  needed "$MGT_BIN" "$P/bin/mgtrain" "$P"/lib/libmgt.so.0
  [ -e "$MGT_BUILD/libmgt_gpu.so" ] && needed "$MGT_BUILD/libmgt_gpu.so"
  echo libmgt_gpu.so; echo libmgt.so.0
} | grep -vE '^(ld-linux|libc|libm|libdl|libpthread|librt)[.-]' | sort -u)
made=0
for so in $names; do
  cc -shared -fPIC -o "$D/$so" -Wl,-soname,"$so" -DNAME="\"$so\"" -DMARK="\"$T/marks\"" decoy.c 2>cc.log &&
    made=$((made + 1)) || { bad "cannot build the decoy $so"; cat cc.log; }
done
ok "$made decoys in $D: $(echo $names)"
# The control: a program that needs libinih.so.1 and has an empty RUNPATH entry, as mgtrain had,
# runs the decoy from the current folder.
echo 'int main(void) { return 0; }' >ctl.c
mkdir ctl-decoys && cp "$D/libinih.so.1" ctl-decoys/
if cc -o ctl ctl.c -Wl,--no-as-needed -linih -Wl,-rpath,/nonexistent: 2>cc.log; then
  (cd ctl-decoys && "$T/ctl") >/dev/null 2>&1
  grep -qx libinih.so.1 marks 2>/dev/null && ok "control: an empty RUNPATH entry loads ./libinih.so.1 (the decoys work)" ||
    bad "control: the decoy did not run; this test could not see the danger"
  rm -f marks
else
  bad "cannot build the control program"; cat cc.log
fi

R=(--data synthetic --synthetic-samples 256 --batch-size 64 --max-steps 2 --verbose 0)
mkdir alone && cp "$MGT_BIN" alone/
runs_clean() { # runs_clean NAME CMD...: CMD, run in the decoys' folder, loads none of them
  local name=$1 out rc
  shift
  out=$(cd "$D" && "$@" 2>&1); rc=$?
  if [ -s marks ]; then bad "$name: ran the decoys $(paste -sd' ' marks)"; rm -f marks
  elif [ $rc -ne 0 ]; then bad "$name: exit $rc:"; echo "$out" | tail -5
  else ok "$name: no decoy ran"; fi
}
runs_clean "mgtrain --version (the GPU backend's line loads libmgt_gpu.so)" "$MGT_BIN" --version
runs_clean "mgtrain trains 2 steps (--device auto)" "$MGT_BIN" "${R[@]}" --out "$T/r1"
runs_clean "a copy of mgtrain without libmgt_gpu.so beside it: --version" "$T/alone/mgtrain" --version
runs_clean "... and 2 steps with --device auto" "$T/alone/mgtrain" "${R[@]}" --out "$T/r2"
runs_clean "the installed mgtrain --version" "$P/bin/mgtrain" --version
alone/mgtrain --version | grep -q "^gpu backend: cannot be loaded here (libmgt_gpu.so: cannot open shared object file: none in $T/alone, " &&
  ok "the copy says where it looked for libmgt_gpu.so" || [ ! -e "$MGT_BUILD/libmgt_gpu.so" ] ||
  { bad "the copy's --version:"; alone/mgtrain --version | grep gpu; }

# 3. The page's example against the install in ~/.local, built with the page's lines, run from
# the folder where the guide trained runs/mlp, then from the decoys.
python3 - "$MGT_SRC/docs/library.md" <<'EOF' >app.c
import re, sys
blocks = re.findall(r"```c\n(.*?)```", open(sys.argv[1]).read(), re.S)
print(next(b for b in blocks if b.startswith("/* app.c */")), end="")
EOF
build=$(sed -n '/^```sh$/,/^```$/p' "$MGT_SRC/docs/library.md" | grep -E '^(export PKG_CONFIG_PATH|cc app\.c)' | sed 's/ *#.*//')
[ "$(wc -l <<<"$build")" = 2 ] && ok "docs/library.md: app.c and its two build lines: $(paste -sd';' <<<"$build")" ||
  bad "docs/library.md's build lines not found: $build"
if grep -q libasan <(ldd "$MGT_BIN"); then
  # As tests/sanitize says of install.sh: ASan refuses to start a program whose first library is
  # not its runtime, and the page's line builds without -fsanitize.
  echo "note: a build with AddressSanitizer; the page's example is not built against it"
elif (eval "$build") >cc.log 2>&1 && [ -x app ]; then
  ok "app.c builds as the page says"
  readelf -d app | grep -q "RUNPATH.*\[$P/lib\]" && ok "app's RUNPATH: $P/lib" || bad "app: $(readelf -d app | grep -i path)"
  "$MGT_BIN" "${R[@]}" --out runs/mlp >train.log 2>&1 || { bad "training runs/mlp"; cat train.log; }
  out=$(./app 2>&1) && [ "$(grep -c '^image [01]: class [0-9]$' <<<"$out")" = 2 ] &&
    ok "./app starts without LD_LIBRARY_PATH: $(paste -sd' ' <<<"$out")" || { bad "./app:"; echo "$out"; }
  cp -r runs "$D/" && runs_clean "the example from the decoys' folder" "$T/app"
else
  bad "app.c does not build as the page says:"; cat cc.log
fi
finish
