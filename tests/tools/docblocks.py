#!/usr/bin/env python3
"""The commands of the documentation, as tests/cli/docs_run.sh runs them.

    docblocks.py list SRC              every page's blocks: what runs, what is marked, and why
    docblocks.py write SRC PAGE DIR    PAGE's blocks as files in DIR, in page order (below)
    docblocks.py compare SHOWN RUN     does a run's output (file RUN) show what the page does?

The pages are README.md and docs/*.md (docs/cli.md, generated from the help texts, holds no
command). In a page, in order:
  - a ```sh block (or ```bash, ```shell) is run, every line as printed, by bash in a folder laid
    out as the repository, one after the other as in one terminal: what a block exports and the
    folder it ends in are the next block's. A block that cannot run on a CPU-only machine in
    seconds has the line `<!-- not run: REASON -->` (REASON its own: needs a GPU, Slurm, several
    nodes, a download...) directly above its fence (blank lines between are allowed);
  - a block of another language whose first line names a file (`# shapes.py: ...`,
    `/* app.c: ... */`, `// app.c`, `; my.cfg`) is written to that file, so that the commands
    below it can use it as the reader would;
  - a plain block under the line `<!-- output of the sh block above -->` is what the last sh
    block above it printed (stdout and stderr): its lines must be a run of the output's lines,
    in order and together (a line `...` stands for any lines), compared as `compare` says.
For `write`, DIR gets NN.sh (a block to run), NN.out (an output to check, of the block before),
NN.file (a file to write: its name on the first line), and index.tsv: NN, kind, line, reason."""
import json
import os
import re
import sys

SHELL = ("sh", "bash", "shell")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.*?)\s*-->\s*$")
OUTPUT = re.compile(r"^\s*<!--\s*output of the sh block above\s*-->\s*$")
NAMED = re.compile(r"^\s*(?:#|//|/\*|;|--)\s*([\w.-]+\.[A-Za-z0-9]+)(?::|\s*\*/|\s*$)")


def pages(src):
    out = ["README.md"]
    out += sorted("docs/" + f for f in os.listdir(os.path.join(src, "docs"))
                  if f.endswith(".md") and f != "cli.md")
    return out


def blocks(path):
    """[(kind, line, text, extra)] of a page: kind "run" (extra None), "skip" (extra: the
    reason), "output", "file" (extra: the name), "other"; line: the fence's line."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence)) and
                                      lines[j].strip().strip(fence[0]) == ""):
            j += 1
        body = [l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[i + 1:j]]
        text = "\n".join(body) + "\n"
        above = i - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        mark = lines[above] if above >= 0 else ""
        skip, output = NOT_RUN.match(mark), OUTPUT.match(mark)
        if lang in SHELL:
            out.append(("skip", i + 1, text, skip.group(1)) if skip else ("run", i + 1, text, None))
        elif output:
            out.append(("output", i + 1, text, None))
        elif body and lang and NAMED.match(body[0]):
            out.append(("file", i + 1, text, NAMED.match(body[0]).group(1)))
        else:
            out.append(("other", i + 1, text, None))
        i = j + 1
    return out


def cmd_list(src):
    total = {"run": 0, "skip": 0, "output": 0, "file": 0}
    bad = 0
    for page in pages(src):
        for kind, line, text, extra in blocks(os.path.join(src, page)):
            if kind == "other":
                continue
            total[kind] += 1
            if kind == "skip" and not extra:
                print("%s:%d: `<!-- not run: -->` without its reason" % (page, line))
                bad += 1
            print("%s:%d\t%s\t%s" % (page, line, kind, extra or ""))
    print(json.dumps(total))
    return 1 if bad else 0


def cmd_write(src, page, outdir):
    os.makedirs(outdir, exist_ok=True)
    rows, last_run = [], None
    for n, (kind, line, text, extra) in enumerate(blocks(os.path.join(src, page)), 1):
        if kind == "other":
            continue
        name = "%02d" % n
        if kind == "run":
            open(os.path.join(outdir, name + ".sh"), "w").write(text)
            last_run = name
        elif kind == "output":
            if last_run is None:
                print("%s:%d: an output block with no sh block above it" % (page, line))
                return 1
            open(os.path.join(outdir, name + ".out"), "w").write(text)
            extra = last_run
        elif kind == "file":
            open(os.path.join(outdir, name + ".file"), "w").write(extra + "\n" + text)
        rows.append("%s\t%s\t%d\t%s" % (name, kind, line, (extra or "").replace("\t", " ")))
    open(os.path.join(outdir, "index.tsv"), "w").write("".join(r + "\n" for r in rows))
    return 0


# --- comparing an output ---------------------------------------------------------------------
# What a page shows of a run is compared with what the run printed, line by line, with what
# differs between two runs of the same commands left out of the comparison:
#   - durations and rates ("8s", "7.6 s", "(7965 samples/s)", "ETA: 4s", "0.032 s"): any number;
#   - the host's name in the start-up block ("rank 0: host, node 0"), the OpenBLAS kernel the
#     CPU gets ("OpenBLAS Zen kernel"), the process ids and times in a lock's owner: any word;
#   - the figures a run learns (loss, accuracy, top-5 accuracy: "loss: 0.5452"), which another
#     OpenBLAS kernel, another CPU, changes in their last bits at every step: within 0.01.
#     The test set of Fashion-MNIST has 10,000 images, so an accuracy of 0.85 has a sampling
#     error of sqrt(0.85 * 0.15 / 10000) = 0.0036 (one standard deviation): two runs that differ
#     in rounding alone land within about two of those of each other, while a page showing
#     another model, another data set or another version's training misses by more.
# Every other word and number must be the same: counts, shapes, parameters, steps, sizes, names.
NUMBER = r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?"
FREE = [
    (re.compile(r"(ETA: )%s ?s\b" % NUMBER), r"\1<time>"),
    (re.compile(r"(?<![\w.])%s ?(s|ms|us|min)\b" % NUMBER), r"<time>"),
    (re.compile(r"(?<![\w.])%s (samples|images|steps)/s\b" % NUMBER), r"<rate> \1/s"),
    (re.compile(r"\b(rank \d+: )[\w.-]+,"), r"\1<host>,"),
    (re.compile(r"\bOpenBLAS \w+ kernel\b"), r"OpenBLAS <kernel> kernel"),
    (re.compile(r"\b(pid|process) \d+\b"), r"\1 <pid>"),
]
LEARNED = re.compile(r"\b((?:val_|test )?(?:loss|acc|top5_acc|accuracy)[:=] ?)(%s)" % NUMBER)
TOLERANCE = 0.01


def normalise(line):
    """(the line with free fields masked and learned figures cut out, [learned figures])."""
    for pat, rep in FREE:
        line = pat.sub(rep, line)
    figures = [float(m.group(2)) for m in LEARNED.finditer(line)]
    line = LEARNED.sub(lambda m: m.group(1) + "<learned>", line)
    return line.rstrip(), figures


def line_matches(shown, ran):
    a, fa = normalise(shown)
    b, fb = normalise(ran)
    return a == b and len(fa) == len(fb) and all(abs(x - y) <= TOLERANCE for x, y in zip(fa, fb))


def match_from(shown, ran, i, j):
    """Whether shown[i:] matches ran[j:] (shown's lines in order, together; "..." any lines)."""
    while i < len(shown):
        if shown[i].strip() == "...":
            return any(match_from(shown, ran, i + 1, k) for k in range(j, len(ran) + 1))
        if j >= len(ran) or not line_matches(shown[i], ran[j]):
            return False
        i, j = i + 1, j + 1
    return True


def cmd_compare(shown_path, ran_path):
    shown = open(shown_path, encoding="utf-8").read().rstrip("\n").split("\n")
    ran = open(ran_path, encoding="utf-8", errors="replace").read().rstrip("\n").split("\n")
    for j in range(len(ran)):
        if match_from(shown, ran, 0, j):
            return 0
    # Say where it parts: the longest run of the page's lines the output has.
    best, at = 0, 0
    for j in range(len(ran)):
        k = 0
        while k < len(shown) and j + k < len(ran) and shown[k].strip() != "..." and \
                line_matches(shown[k], ran[j + k]):
            k += 1
        if k > best:
            best, at = k, j
    if best == 0 and shown:  # no line matches: the run's nearest to the page's first
        import difflib
        near = normalise(shown[0])[0]
        at = max(range(len(ran)), key=lambda j: difflib.SequenceMatcher(
            None, near, normalise(ran[j])[0]).ratio(), default=0)
    print("the page's output is not in the run's: its first %d line(s) match the run's from line "
          "%d; then" % (best, at + 1))
    print("  page: %s" % (shown[best] if best < len(shown) else "(end)"))
    print("  run:  %s" % (ran[at + best] if at + best < len(ran) else "(end of the output)"))
    print("  (compared as: %s / %s)" % (normalise(shown[best])[0] if best < len(shown) else "",
                                         normalise(ran[at + best])[0] if at + best < len(ran)
                                         else ""))
    return 1


def main():
    a = sys.argv[1:]
    if a[:1] == ["list"] and len(a) == 2:
        return cmd_list(a[1])
    if a[:1] == ["write"] and len(a) == 4:
        return cmd_write(a[1], a[2], a[3])
    if a[:1] == ["compare"] and len(a) == 3:
        return cmd_compare(a[1], a[2])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
