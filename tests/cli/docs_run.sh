#!/usr/bin/env bash
# labels: mpi
# timeout: 1500
# The documentation's commands, run as printed: every sh block of README.md and docs/*.md that is
# not marked `<!-- not run: REASON -->`, in page order, the pages in the order of the index
# (docs/README.md), in one folder laid out as the repository (build/mgtrain, examples/, launch/,
# ...), as a reader who goes through them on a CPU-only machine would: by root, in one terminal
# that starts as a fresh shell does (no Open MPI root variables, Debian's PATH, a HOME of its
# own), so that what a block exports holds for the blocks after it, on its page and the next;
# each page starts at the repository's root, and within a page a block starts in the folder the
# one before ended in. Every line must
# succeed, or end with the status its comment names (`# exits 2`); the files the pages give
# (`# shapes.py: ...`) are written where the reader would save them; each output a page shows
# under `<!-- output of the sh block above -->` must be in what that block printed
# (tests/tools/docblocks.py: what may differ between two runs, and by how much). The pages
# must hold at least 50 blocks that run, and every block that does not run must say why.
# MGT_DOC_PAGES="README.md docs/guide.md" runs those pages alone (while writing them).
# Its cost: the quickstart's build of mgtrain (about 2 minutes of the 2 cores) and some 60
# short runs of 2 ranks; 395 s of wall time and 211 CPU-s on 2 cores shared with other builds
# (load average 9), of which the quickstart (its build and one epoch) 119 s.
source "$(dirname "$0")/lib.bash"
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
tool=$MGT_SRC/tests/tools/docblocks.py

# --- the pages and their blocks --------------------------------------------------------------
if python3 "$tool" list "$MGT_SRC" >list.txt; then ok "every block that does not run says why"
else bad "blocks marked without a reason:"; grep -v $'\t' list.txt; fi
nrun=$(grep -c $'\trun\t' list.txt) nskip=$(grep -c $'\tskip\t' list.txt)
nout=$(grep -c $'\toutput\t' list.txt)
[ "$nrun" -ge 50 ] && ok "$nrun sh blocks to run, $nskip marked as not run, $nout outputs to check" ||
  bad "only $nrun sh blocks run (at least 50 wanted; $nskip are marked as not run)"
# Reading order: the front page, then the index's pages in its order, then any page it leaves
# out (docs/cli.md, generated from the help texts, holds no command).
order=(README.md)
while read -r p; do order+=("docs/$p"); done < <(grep -o '](\([a-z0-9-]*\.md\))' "$MGT_SRC/docs/README.md" |
  sed 's/^](//; s/)$//' | awk '!seen[$0]++')
for p in $(cut -d: -f1 list.txt | grep '\.md$' | awk '!seen[$0]++'); do
  [[ " ${order[*]} " == *" $p "* ]] || order+=("$p")
done

# --- the folder the reader works in ----------------------------------------------------------
# A fresh copy of the checkout: the files git tracks, as they are in the working tree (a new file
# counts once it is added, one deleted counts as gone). The README's first block is ./launch/quickstart, which builds
# build/mgtrain there as a new user's does, and the pages after it use that build; run without
# the README (MGT_DOC_PAGES), the pages use this suite's mgtrain.
W=$T/work
mkdir -p "$W" "$T/home"
(cd "$MGT_SRC" && git ls-files -z | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf -) | tar -xf - -C "$W" ||
  { bad "could not copy the checkout's files (git ls-files in $MGT_SRC)"; finish; exit 1; }
ok "a copy of the checkout: $(cd "$W" && find . -type f | wc -l) files"
# What a fresh root shell on Debian has, and what this machine's containers need of Open MPI.
clean_env=(env -i HOME="$T/home" USER=root LOGNAME=root LANG=C.UTF-8 SHELL=/bin/bash
           PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
for v in $(compgen -e | grep -E '^(OMPI_MCA_|OPENBLAS_CORETYPE$|ASAN_|LSAN_|UBSAN_)'); do
  clean_env+=("$v=${!v}")
done

# run_block PAGE FILE LOG STATE: FILE's lines in a shell that starts from STATE (its exports and
# folder, written back at the end). A line ending in `# exits N` must exit N.
run_block() {
  local page=$1 file=$2 log=$3 state=$4
  awk '{
    if (match($0, /#[ \t]*exits [0-9]+/) && $0 !~ /\\$/) {
      want = substr($0, RSTART, RLENGTH); sub(/.*exits /, "", want)
      cmd = substr($0, 1, RSTART - 1)
      printf "{ %s\n} && __rc=0 || __rc=$?; [ \"$__rc\" -eq %d ] || { echo \"docs_run: exit $__rc, not %d: %s\" >&2; false; }\n", cmd, want, want, cmd
    } else print
  }' "$file" >"$file.run"
  cat >"$file.wrap" <<EOF
cd "\$(cat "$state/pwd")"
source "$state/env"
trap 'export -p | grep -vE "^declare -x (OLDPWD|PWD|SHLVL|_)=" >"$state/env"; pwd >"$state/pwd"' EXIT
trap 'echo "docs_run: \$BASH_COMMAND: exit \$?" >&2' ERR
set -eE -o pipefail
source "$file.run"
EOF
  timeout 1500 "${clean_env[@]}" bash "$file.wrap" </dev/null >"$log" 2>&1
}

# MGT_DOC_PAGES="README.md docs/guide.md" runs those pages alone (while writing them).
[ -n "${MGT_DOC_PAGES:-}" ] && read -ra order <<<"$MGT_DOC_PAGES"
if [ "${order[0]}" != README.md ]; then
  mkdir -p "$W/build" && ln -s "$MGT_BIN" "$W/build/mgtrain"
fi
for page in "${order[@]}"; do
  B=$T/blocks/${page//\//_}
  python3 "$tool" write "$MGT_SRC" "$page" "$B" >write.log 2>&1 || { bad "$page: $(cat write.log)"; continue; }
  [ -s "$B/index.tsv" ] || continue
  S=$T/state # the terminal: its exports carry on from page to page
  mkdir -p "$S" && touch "$S/env" && echo "$W" >"$S/pwd"
  stopped=""
  while IFS=$'\t' read -r n kind line extra; do
    where="$page:$line"
    if [ -n "$stopped" ] && [ "$kind" != skip ]; then
      bad "$where: not run, as the block at $stopped failed"; continue
    fi
    case $kind in
      file)
        name=$(head -1 "$B/$n.file")
        tail -n +2 "$B/$n.file" >"$(cat "$S/pwd")/$name" && ok "$where: $name written" ||
          bad "$where: could not write $name"
        ;;
      run)
        start=$(date +%s%N)
        if run_block "$page" "$B/$n.sh" "$B/$n.log" "$S"; then
          ms=$(( ($(date +%s%N) - start) / 1000000 ))
          ok "$where ($((ms / 1000)).$((ms % 1000 / 100)) s): $(head -c 90 "$B/$n.sh" | tr '\n' ';')"
        else
          bad "$where: the block failed:"; sed 's/^/    | /' "$B/$n.sh"; echo "    its output, the end:"
          tail -25 "$B/$n.log" | sed 's/^/    > /'
          stopped=$where
        fi
        ;;
      output)
        if out=$(python3 "$tool" compare "$B/$n.out" "$B/$extra.log"); then
          ok "$where: the output shown is what the block printed"
        else
          bad "$where: the output shown is not what the block printed: $out"
          tail -30 "$B/$extra.log" | sed 's/^/    > /'
        fi
        ;;
    esac
  done <"$B/index.tsv"
done

# The quickstart a second time, as a user may run it: into a run folder of its own again.
if [ "${order[0]}" = README.md ] && [ -x "$W/build/mgtrain" ]; then
  if (cd "$W" && timeout 1500 "${clean_env[@]}" ./launch/quickstart) >quickstart2.log 2>&1 &&
     grep -q "out: runs/quickstart-2$" quickstart2.log && [ -s "$W/runs/quickstart/weights.safetensors" ] &&
     [ -s "$W/runs/quickstart-2/weights.safetensors" ] && [ -s "$W/build/mgtrain.1" ]; then
    ok "./launch/quickstart again: runs/quickstart-2, runs/quickstart kept; build/mgtrain.1 built"
  else bad "./launch/quickstart a second time:"; tail -20 quickstart2.log; fi
fi
finish
