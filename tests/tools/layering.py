#!/usr/bin/env python3
"""The layering of docs/architecture.md, checked against the sources.

    layering.py [REPO]    (default: the repository this file is in)

docs/architecture.md names the layers in order, from the bottom up (its "## Layers" list), and
gives every source file a layer (its file map: one line per file, a glob for a folder of files
alike). This reads both and fails, with one line per finding, when
  - a source file (.c, .h, .cu, .h.in under src/, cuda/, include/, tests/, bench/) has no layer
    (a new file must be placed), or the map names a file that does not exist;
  - a file includes ("#include "...") a header of a layer above its own (a layer may use its own
    and the ones below it);
  - a file includes a project header that cannot be found (the check would not see it);
  - two modules of src/ (a module: x.c with x.h) include each other, directly or around a circle.
Exit status 0 when all is well, 1 with the findings, 2 when the document cannot be read."""
import fnmatch
import os
import re
import sys

EXTENSIONS = (".c", ".h", ".cu", ".cuh", ".cpp", ".h.in")
SCANNED = ("src", "cuda", "include", "tests", "bench")
# Where "#include "x"" looks after the including file's own folder (the build's include paths).
INCLUDE_DIRS = ("src", "include", "cuda")
# Headers the build generates: default_model.h from its template; protoc-c's from proto/ (not
# a layer of ours: generated code that includes nothing of mgtrain).
GENERATED = {"default_model.h": "src/default_model.h.in"}
GENERATED_EXTERNAL = re.compile(r"\.pb-c\.h$")

LAYER_LINE = re.compile(r"^\d+\.\s+\*\*([a-z_]+)\*\*")
FOLDER_HEADING = re.compile(r"^##\s+`([^`]+/)`")
FILE_LINE = re.compile(r"^- ((?:`[^`]+`(?:,\s*|\s+and\s+|\s+)?)+)\s+—\s+\*([a-z_]+)\*")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def fail_doc(msg):
    print("docs/architecture.md: " + msg)
    sys.exit(2)


def read_doc(repo):
    """The layers, bottom first, and [(pattern, layer, line)] of the file map."""
    path = os.path.join(repo, "docs", "architecture.md")
    try:
        lines = open(path, encoding="utf-8").read().split("\n")
    except OSError as e:
        fail_doc("cannot read it: %s" % e)
    layers, entries, section, folder = [], [], None, None
    for n, line in enumerate(lines, 1):
        if line.startswith("## "):
            section = line
            m = FOLDER_HEADING.match(line)
            folder = m.group(1) if m else None
            continue
        if section and section.strip() == "## Layers":
            m = LAYER_LINE.match(line)
            if m:
                layers.append(m.group(1))
            continue
        if folder and line.startswith("- `"):
            m = FILE_LINE.match(line)
            if not m:
                fail_doc("line %d: a file line reads - `file` — *layer* — what it is: %s" %
                         (n, line[:80]))
            for name in re.findall(r"`([^`]+)`", m.group(1)):
                entries.append((folder + name, m.group(2), n))
    if not layers:
        fail_doc("no '## Layers' list (1. **name** — ...)")
    for pattern, layer, n in entries:
        if layer not in layers:
            fail_doc("line %d: %s is given layer '%s', which the '## Layers' list does not name" %
                     (n, pattern, layer))
    return layers, entries


def sources(repo):
    out = []
    for top in SCANNED:
        for d, dirs, files in os.walk(os.path.join(repo, top)):
            dirs[:] = sorted(x for x in dirs if not x.startswith((".", "build")))
            for f in sorted(files):
                if f.endswith(EXTENSIONS):
                    out.append(os.path.relpath(os.path.join(d, f), repo))
    return out


def assign(files, entries, findings):
    """Each file's layer: its own line, else the one glob that matches it."""
    exact = {p: (l, n) for p, l, n in entries if "*" not in p}
    globs = [(p, l, n) for p, l, n in entries if "*" in p]
    layer_of = {}
    for f in files:
        if f in exact:
            layer_of[f] = exact[f][0]
            continue
        hits = [(p, l) for p, l, n in globs if fnmatch.fnmatchcase(f, p)]
        if len(hits) == 1:
            layer_of[f] = hits[0][1]
        elif not hits:
            findings.append("%s: no layer; give it a line in docs/architecture.md's file map" % f)
        elif len({l for p, l in hits}) > 1:
            findings.append("%s: matched by %s with different layers; name it on a line of its "
                            "own" % (f, ", ".join(p for p, l in hits)))
        else:
            layer_of[f] = hits[0][1]
    present = set(files)
    for p, l, n in entries:
        if "*" in p and not any(fnmatch.fnmatchcase(f, p) for f in files):
            findings.append("docs/architecture.md:%d: %s matches no file" % (n, p))
        elif "*" not in p and p not in present:
            findings.append("docs/architecture.md:%d: %s does not exist" % (n, p))
    return layer_of


def resolve(repo, f, name):
    """The repository path of header `name` as included by file f, or None."""
    if os.path.basename(name) in GENERATED:
        return GENERATED[os.path.basename(name)]
    for d in (os.path.dirname(f),) + INCLUDE_DIRS:
        p = os.path.normpath(os.path.join(d, name))
        if os.path.isfile(os.path.join(repo, p)):
            return p
    return None


def module(path):
    for ext in EXTENSIONS:
        if path.endswith(ext):
            return path[: -len(ext)]
    return path


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    layers, entries = read_doc(repo)
    rank = {l: i for i, l in enumerate(layers)}
    findings = []
    files = sources(repo)
    layer_of = assign(files, entries, findings)
    edges = {}
    for f in files:
        if f not in layer_of:
            continue
        text = open(os.path.join(repo, f), encoding="utf-8", errors="replace").read()
        for name in INCLUDE.findall(text):
            if GENERATED_EXTERNAL.search(name):
                continue
            h = resolve(repo, f, name)
            if h is None:
                if layer_of[f] != layers[-1]:
                    findings.append('%s: #include "%s" is no file of the repository' % (f, name))
                continue
            if h not in layer_of:
                continue  # reported above as a file without a layer
            if rank[layer_of[h]] > rank[layer_of[f]]:
                findings.append('%s (layer %s) includes "%s", %s of layer %s above it' %
                                (f, layer_of[f], name, h, layer_of[h]))
            a, b = module(f), module(h)
            if a != b and a.startswith("src/") and b.startswith("src/"):
                edges.setdefault(a, set()).add(b)
    for comp in cycles(edges):
        findings.append("modules that include each other in a circle: " + " ".join(comp))
    for line in findings:
        print(line)
    if findings:
        print("%d finding%s: see docs/architecture.md (## Layers, and the file map)" %
              (len(findings), "" if len(findings) == 1 else "s"))
        return 1
    print("layering: %d files in %d layers; no upward include, no circle among src/ modules" %
          (len(layer_of), len(layers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
