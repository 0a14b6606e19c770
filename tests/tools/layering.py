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
  - two modules of src/ (a module: x.c with x.h) include each other, directly or around a circle;
  - a file of src/ or cuda/ calls a function defined in a layer above its own, or two modules of
    src/ or of cuda/ call each other, directly or around a circle (calls, below).
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
# The folders whose calls are checked: the program and its backends. tests/ and bench/ (the
# tools layer) may use anything, and their C++ (the emulated CUDA stack) is not read here.
CALL_CHECKED = ("src/", "cuda/")
# The folders whose modules may not call each other around a circle. cuda/'s op families take
# the workspace and the event waits from gpu_memory.c, below both them and the backend's file.
CIRCLE_CHECKED = ("src/", "cuda/")
# Words followed by "(" that are no call.
NOT_CALLS = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "_Alignof",
             "__alignof__", "offsetof", "typeof", "__typeof__", "_Generic", "_Static_assert",
             "static_assert", "__attribute__", "__declspec", "defined", "__builtin_offsetof",
             "__asm__", "asm", "__launch_bounds__", "decltype", "catch", "noexcept", "alignas",
             "__align__"}


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


# --- Calls -----------------------------------------------------------------------------------
# Includes say what a file may see; calls say what it uses. A call is a name followed by "(" in a
# function body (or by "<<<", a CUDA kernel launch), or one inside a macro the body uses
# (CHECK_CUDA's call of the failure printer is its user's call). Taking a function's address
# (an op table's `.fwd = name`) is no call: that is how a lower layer hears from a higher one.
# The function called is found by name among the definitions of every file checked: the file's
# own first (static ones included), then one of its folder (the GPU backend's library borrows
# a few of the core's names), then any other. A good enough C reader, not a compiler: comments,
# strings and preprocessor lines are dropped, and both branches of an #if are read.
TOKEN = re.compile(r"[A-Za-z_]\w*|<<<|->|[{}()\[\];=,.#<>]|\S")
MACRO = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(\([^)]*\))?(.*)$")


COMMENT_OR_LITERAL = re.compile(r"""/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'""", re.S)


def strip_c(text):
    """text without comments and string or character literals (kept as ""), its preprocessor
    lines cut out and returned apart as {macro name: body}."""
    def blank(m):
        t = m.group(0)
        if t[0] in "\"'":
            return '""'
        return "\n" * t.count("\n") if t.startswith("/*") else ""
    code, macros = [], {}
    for line in COMMENT_OR_LITERAL.sub(blank, text).replace("\\\n", " ").split("\n"):
        if line.lstrip().startswith("#"):
            m = MACRO.match(line)
            if m:
                macros[m.group(1)] = m.group(3)
            code.append("")
        else:
            code.append(line)
    return "\n".join(code), macros


def called(tokens):
    """The names a run of tokens calls, and the names it mentions (for the macros among them)."""
    out, words = set(), set()
    for k, t in enumerate(tokens):
        if not (t[0].isalpha() or t[0] == "_"):
            continue
        words.add(t)
        nxt = tokens[k + 1] if k + 1 < len(tokens) else ""
        if nxt not in ("(", "<<<") or t in NOT_CALLS:
            continue
        if k > 0 and tokens[k - 1] in (".", "->"):
            continue  # a member: a function pointer of a table, never a definition
        out.add(t)
    return out, words


def read_functions(text):
    """(the functions a file defines: {name: static?}, the names its bodies call and mention,
    its macros)."""
    code, macros = strip_c(text)
    toks = TOKEN.findall(code)
    defs, body = {}, []
    kinds = []  # per open brace: "fn", "pass" (extern "C", a namespace), "anon" or "other"
    k, n = 0, len(toks)
    while k < n:
        t = toks[k]
        in_fn = "fn" in kinds
        if t == "{":
            kind = "other"
            if not in_fn:
                # A definition: NAME ( ... ) [qualifiers, attributes] { at the top level.
                j = k - 1
                while j >= 0 and toks[j] not in (")", ";", "}", "{", "="):
                    j -= 1
                if j >= 0 and toks[j] == ")":
                    d, m = 0, j
                    while m >= 0:
                        d += toks[m] == ")"
                        d -= toks[m] == "("
                        if d == 0:
                            break
                        m -= 1
                    name = toks[m - 1] if m > 0 else ""
                    if (name[:1].isalpha() or name[:1] == "_") and name not in NOT_CALLS:
                        start = m - 1
                        while start > 0 and toks[start - 1] not in (";", "}", "{", ")"):
                            start -= 1
                        prefix = toks[start:m - 1]
                        # static, or a C++ template or a function of an anonymous namespace
                        # (file-local in the GPU backend's kernel files).
                        defs[name] = ("static" in prefix or "template" in prefix or
                                      "anon" in kinds)
                        kind = "fn"
                        # __attribute__((...)) before a definition closes a paren too: NAME is
                        # then "__attribute__", refused above, and the body still counts.
                    elif name in NOT_CALLS:
                        kind = "fn"
                elif k > 0 and toks[k - 1] == "namespace":
                    kind = "anon"
                elif k > 0 and (toks[k - 1] == '""' or (k > 1 and toks[k - 2] == "namespace")):
                    kind = "pass"
            kinds.append(kind)
        elif t == "}":
            if kinds:
                kinds.pop()
        elif in_fn:
            body.append(t)
        k += 1
    calls, words = called(body)
    return defs, calls, words, macros


def call_findings(repo, files, layer_of, rank):
    """Upward calls, and modules that call each other."""
    checked = [f for f in files if f.startswith(CALL_CHECKED) and f in layer_of]
    info, macros = {}, {}
    for f in checked:
        text = open(os.path.join(repo, f), encoding="utf-8", errors="replace").read()
        info[f] = read_functions(text)
        for name, mbody in info[f][3].items():
            macros.setdefault(name, mbody)
    # What each macro calls, through the macros it uses in turn.
    mcalls = {}

    def macro_calls(name, seen=()):
        if name not in mcalls:
            mcalls[name] = set()
            c, w = called(TOKEN.findall(macros[name]))
            for x in w:
                if x in macros and x not in seen and x != name:
                    c |= macro_calls(x, seen + (name,))
            mcalls[name] = c
        return mcalls[name]

    where = {}
    for f in checked:
        for name, static in info[f][0].items():
            if not static or f.endswith((".h", ".cuh")):
                where.setdefault(name, []).append(f)
    edges, findings = {}, []
    for f in checked:
        defs, calls, words, _ = info[f]
        calls = set(calls)
        for w in words:
            if w in macros:
                calls |= macro_calls(w)
        for name in sorted(calls):
            if name in defs:
                continue
            cands = where.get(name, [])
            near = [g for g in cands if os.path.dirname(g) == os.path.dirname(f)]
            for g in near or cands:
                a, b = module(f), module(g)
                if a == b:
                    continue
                edges.setdefault(a, {}).setdefault(b, (f, name, g))
                if rank[layer_of[g]] > rank[layer_of[f]]:
                    findings.append("%s (layer %s) calls %s of %s, layer %s above it" %
                                    (f, layer_of[f], name, g, layer_of[g]))
    for comp in cycles({a: {b for b in bs if b.startswith(CIRCLE_CHECKED)}
                        for a, bs in edges.items() if a.startswith(CIRCLE_CHECKED)}):
        inside = set(comp)
        why = ["%s calls %s (%s)" % (f, name, g) for a in comp
               for b, (f, name, g) in sorted(edges.get(a, {}).items()) if b in inside]
        findings.append("modules that call each other in a circle: %s: %s" %
                        (" ".join(comp), "; ".join(why)))
    return findings, sum(len(b) for b in edges.values())


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
    found, ncalls = call_findings(repo, files, layer_of, rank)
    findings += found
    for line in findings:
        print(line)
    if findings:
        print("%d finding%s: see docs/architecture.md (## Layers, and the file map)" %
              (len(findings), "" if len(findings) == 1 else "s"))
        return 1
    print("layering: %d files in %d layers; no upward include, no circle of includes among src/ "
          "modules; %d calls between modules of src/ and cuda/, none upward, no circle" %
          (len(layer_of), len(layers), ncalls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
