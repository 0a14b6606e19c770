# shellcheck shell=bash
# testlib.bash: what the tests of the GPU check (tests/gpu/device/test_*.sh) share, on top of
# tests/cli/lib.bash (ok, bad, finish, $T) and lib.bash.

# row SUMMARY PART STATUS [FIGURES_REGEX]: the summary's row for PART has STATUS and, in its
# key figures, FIGURES_REGEX (grep -E).
row() {
  local line
  line=$(grep -E "^\| $2 \| " "$1")
  if grep -qE -- "^\| $2 \| \*\*$3\*\* \| [0-9]+ \| .*${4:-}" <<<"$line"; then
    ok "row $2: $3${4:+ (/$4/)}"
  else
    bad "row $2: wanted $3${4:+ and /$4/}, got '$line'"
  fi
}

# dry_kit DEST: the kit of `prepare-device --dry-run` for this build in DEST; prints what it
# printed and returns its exit status. Under CTest it was made once for the tests that use it
# (device_prepare_dry.sh, the fixture device_kit_dry) and is copied; otherwise it is made here.
dry_kit() {
  local K=$MGT_BUILD/device-kit-dry
  if [ -f "$K.rc" ]; then
    cp -a "$K" "$1" || return 1
    cat "$K.log"
    return "$(cat "$K.rc")"
  fi
  "$MGT_SRC/tests/gpu/prepare-device" --dry-run --build-dir "$MGT_BUILD" --dest "$1" 2>&1
}

# build_needs_gone OUT: builds the program OUT linked to libmgtgone.so.1 (in the current folder),
# which it calls. With MGT_KEEP_GONE=1 the library stays; otherwise it is removed at once, so OUT
# stands for a program whose library the machine lacks.
build_needs_gone() {
  cat >gone.c <<'EOC'
int mgt_gone(void) { return 7; }
EOC
  cat >needs_gone.c <<'EOC'
int mgt_gone(void);
int main(void) { return mgt_gone() == 7 ? 0 : 1; }
EOC
  cc -shared -fPIC -Wl,-soname,libmgtgone.so.1 -o libmgtgone.so.1 gone.c &&
    ln -sf libmgtgone.so.1 libmgtgone.so && cc -o "$1" needs_gone.c -L. -lmgtgone || return 1
  rm -f libmgtgone.so
  [ "${MGT_KEEP_GONE:-0}" = 1 ] || rm -f libmgtgone.so.1
}
