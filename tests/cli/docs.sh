#!/usr/bin/env bash
# labels: cli
# timeout: 300
# cores: 1
# The documentation against the binary and against itself:
#   1. docs/cli.md is what docs/cli.cmake makes from this mgtrain's help texts, byte for byte;
#   2. every flag of every command `mgtrain --help` lists is in docs/cli.md, and is also named
#      in a written page (README.md or docs/, cli.md aside) that says what it is for;
#   3. every relative link of README.md, docs/*.md, launch/README.md, bench/README.md and the
#      pages of bench/results/ (which the others link to) names a file the repository tracks (one
#      that exists, outside a git checkout), and every #anchor a heading of that page (GitHub's
#      anchors);
#   4. every figure in the README's text (a ratio, a percentage, a size, a rate or a time) is in
#      its Results table or in a page of bench/results/, where it was measured.
#   5. the README's set-up is two commands, the second the tests', and CI (.ci/run) runs that one.
source "$(dirname "$0")/lib.bash"
regen="cmake --build ${MGT_BUILD:-BUILD} --target docs-cli"

# --- 1. the reference is the binary's --------------------------------------------------------
if cmake -DMGTRAIN="$MGT_BIN" -DOUT="$T/cli.md" -P "$MGT_SRC/docs/cli.cmake" >cli.log 2>&1; then
  if cmp -s "$T/cli.md" "$MGT_SRC/docs/cli.md"; then
    ok "docs/cli.md is what docs/cli.cmake makes from mgtrain --help ($(wc -l <cli.md) lines)"
  else
    bad "docs/cli.md differs from mgtrain's help texts; regenerate it with: $regen"
    diff -u "$MGT_SRC/docs/cli.md" "$T/cli.md" | head -40
  fi
else
  bad "docs/cli.cmake failed:"; cat cli.log
fi

# --- 2. every flag documented ----------------------------------------------------------------
commands=$("$MGT_BIN" --help | awk '/^commands:/ { f = 1; next } f && /^$/ { exit } f && /^  [a-z]/ { print $1 }')
[ "$(wc -w <<<"$commands")" -ge 5 ] && ok "mgtrain --help lists the commands: $(echo $commands)" ||
  bad "no command list in mgtrain --help: '$commands'"
flags=$(for c in $commands; do "$MGT_BIN" "$c" --help; done | grep -o '^  --[a-z0-9-]*' | tr -d ' ' | sort -u)
nflags=$(wc -l <<<"$flags")
[ "$nflags" -ge 40 ] && ok "$nflags flags in the commands' help texts" || bad "only $nflags flags found"
written=("$MGT_SRC/README.md")
for f in "$MGT_SRC"/docs/*.md; do [ "$(basename "$f")" = cli.md ] || written+=("$f"); done
missing_ref="" missing_doc=""
for f in $flags; do
  grep -qF -- "\`$f" "$MGT_SRC/docs/cli.md" || missing_ref+=" $f"
  grep -qE -- "$f([^a-z0-9-]|$)" "${written[@]}" || missing_doc+=" $f"
done
[ -z "$missing_ref" ] && ok "every flag is in docs/cli.md" ||
  bad "not in docs/cli.md:$missing_ref (regenerate it with: $regen)"
[ -z "$missing_doc" ] && ok "every flag is named in a written page (README.md, docs/ but cli.md)" ||
  bad "no written page names$missing_doc: say what each is for in the page of its topic (docs/README.md lists them)"

# --- 3. links and anchors --------------------------------------------------------------------
if out=$(python3 - "$MGT_SRC" <<'EOF'
import os, re, sys
src = sys.argv[1]
pages = [os.path.join(src, "README.md"), os.path.join(src, "launch", "README.md"),
         os.path.join(src, "bench", "README.md")]
pages += sorted(os.path.join(src, "docs", f) for f in os.listdir(os.path.join(src, "docs"))
                if f.endswith(".md"))
for d, dirs, files in sorted(os.walk(os.path.join(src, "bench", "results"))):
    pages += sorted(os.path.join(d, f) for f in files if f.endswith(".md"))
pages = [p for p in pages if os.path.exists(p)]

# What the repository tracks (a link to a file left in a working tree, or only inside an archive,
# is broken for every other reader); outside a git checkout, what exists.
import subprocess
try:
    listed = subprocess.run(["git", "-C", src, "ls-files", "-z"], capture_output=True,
                            check=True).stdout.decode().split("\0")
    tracked = {os.path.normpath(os.path.join(src, f)) for f in listed if f}
    folders = set()
    for f in tracked:  # every folder above a tracked file
        while f != os.path.normpath(src) and f not in folders:
            f = os.path.dirname(f)
            folders.add(f)
    tracked |= folders
except (OSError, subprocess.CalledProcessError):
    tracked = None

def resolves(dest):
    return os.path.normpath(dest) in tracked if tracked is not None else os.path.exists(dest)

def outside_code(text):
    """The page's lines, with those of fenced code blocks left empty: nothing there is a link
    or a heading."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            out.append("")
        elif m:
            fence = m.group(1)
            out.append("")
        else:
            out.append(line)
    return out

def slug(heading):
    """GitHub's anchor of a heading: its text (a code span's too, a link's text) in lower case,
    without punctuation but - and _, spaces as hyphens."""
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    t = t.replace("`", "").strip().lower()
    t = re.sub(r"[^\w\- ]", "", t)
    return t.replace(" ", "-")

anchors = {}
def anchors_of(path):
    if path not in anchors:
        seen, found = {}, set()
        lines = outside_code(open(path, encoding="utf-8").read())
        for line in lines:
            m = re.match(r"^ {0,3}#{1,6}\s+(.*?)(\s+#+)?\s*$", line)
            if not m:
                continue
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else "%s-%d" % (s, n))
        found.update(re.findall(r'<a\s+(?:id|name)="([^"]+)"', "\n".join(lines)))
        anchors[path] = found
    return anchors[path]

errors, links = [], 0
for page in pages:
    rel = os.path.relpath(page, src)
    for no, line in enumerate(outside_code(open(page, encoding="utf-8").read()), 1):
        line = re.sub(r"(`+)(.+?)\1", "", line)  # code spans
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            links += 1
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not resolves(dest):
                errors.append("%s:%d: %s: no file %s%s" % (
                    rel, no, target, os.path.relpath(dest, src),
                    " in the repository (it is not tracked)" if os.path.exists(dest) else ""))
            elif anchor:
                if not dest.endswith(".md"):
                    errors.append("%s:%d: %s: an anchor into a file that is not a page" % (rel, no, target))
                elif anchor not in anchors_of(dest):
                    errors.append("%s:%d: %s: no heading of %s has the anchor #%s" %
                                  (rel, no, target, os.path.relpath(dest, src), anchor))
print("%d pages, %d relative links" % (len(pages), links))
for e in errors:
    print(e)
sys.exit(1 if errors else 0)
EOF
); then ok "links: $out, every one resolves"
else bad "links that do not resolve:"; echo "$out"; fi

# --- 4. the README's figures -----------------------------------------------------------------
if out=$(python3 - "$MGT_SRC" <<'EOF'
import os, re, sys
src = sys.argv[1]
prose, table, fence, section = [], [], None, ""
for line in open(os.path.join(src, "README.md"), encoding="utf-8").read().split("\n"):
    m = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
    if m or fence:
        fence = None if fence and m else (fence or m.group(1))
        continue
    if line.startswith("## "):
        section = line.strip()
    (table if section == "## Results" and line.startswith("|") else prose).append(line)
# A figure: a number with a unit of measure, or a ratio (code spans are commands: --epochs 2).
FIGURE = re.compile(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)?)(x\b|%|\s?(?:MiB|GiB|KiB|GB|MB|KB|samples/s|"
                    r"images/s|GFLOP/s|TFLOP/s|ms|min|s)\b)")
def figures(text):
    return {(m.group(1), m.group(2).strip()) for m in FIGURE.finditer(text)}
measured = figures("\n".join(table))
for d, dirs, files in os.walk(os.path.join(src, "bench", "results")):
    for f in files:
        if f.endswith(".md"):
            measured |= figures(open(os.path.join(d, f), encoding="utf-8", errors="replace").read())
found = sorted(figures(re.sub(r"`[^`]*`", "", "\n".join(prose))))
missing = [n + ("" if u in ("x", "%") else " ") + u for n, u in found if (n, u) not in measured]
print("%d figures in the README's text, %d rows in its Results table" % (len(found), len(table) - 2))
for f in missing:
    print("README.md: %s is neither in its Results table nor in a page of bench/results/" % f)
sys.exit(1 if missing else 0)
EOF
); then ok "figures: $out; each one is there or under bench/results/"
else bad "figures of the README that no result holds:"; echo "$out"; fi

# --- 5. the set-up's two commands, and CI's ---------------------------------------------------
setup=$(awk '/^## Set-up/ { f = 1; next } /^## / { f = 0 } f' "$MGT_SRC/README.md" |
  awk '/^```sh/ { b = 1; next } /^```/ { b = 0 } b' | sed 's/[[:space:]]*#.*//' | grep -v '^[[:space:]]*$')
tests_cmd=$(sed -n 2p <<<"$setup")
if [ "$(wc -l <<<"$setup")" -eq 2 ] && [ -n "$tests_cmd" ] &&
   grep -qE "^[[:space:]]*${tests_cmd//./\\.}( |$)" "$MGT_SRC/.ci/run"; then
  ok "the README's set-up: $(head -1 <<<"$setup" | tr -s ' '), then $tests_cmd, which .ci/run runs"
else bad "the README's set-up is not two commands whose second .ci/run runs:"; echo "$setup"; fi
finish
