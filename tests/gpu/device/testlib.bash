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
