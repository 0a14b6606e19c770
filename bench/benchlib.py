"""benchlib: what bench/peer, bench/allreduce and bench/scaling share.

Building the programs, composing mpirun lines, running commands while keeping the exact command
lines and their output, describing the machine and the library versions, mgtrain's per-step
times from its --timeline, the FLOP count of the seed models, and writing the results (markdown,
PNG, JSON, raw log) atomically under bench/results/.

Standard library only; matplotlib is imported when a chart is drawn (installed through
launch/install-deps python3-matplotlib when missing and a package manager is there).
"""
import datetime
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"

# The seed models: config file, global batch of the peer comparison, and the FLOP of one sample
# for forward + backward = 3 x forward, counting a multiply-add as 2 FLOP and only the GEMM-shaped
# layers (dense, conv): element-wise ops, pooling and the optimizer are left out. The trainable
# parameter count guards the table: if the model file changes, the FLOP formula must too.
MODELS = {
    "mlp": {
        "cfg": "examples/mlp.cfg",
        "batch": 256,
        "params": 269322,
        # dense 784->256, 256->256, 256->10
        "fwd_macs": 784 * 256 + 256 * 256 + 256 * 10,
        "formula": "3 x 2 x (784*256 + 256*256 + 256*10)",
    },
    "convnet": {
        "cfg": "examples/convnet.cfg",
        "batch": 128,
        "params": 2353738,
        # conv 3x3 1->32 on 26x26, 3x3 32->256 on 24x24, 3x3 256->128 on 22x22; dense 15488->128->10
        "fwd_macs": 26 * 26 * 32 * 9 + 24 * 24 * 256 * 9 * 32 + 22 * 22 * 128 * 9 * 256
        + 15488 * 128 + 128 * 10,
        "formula": "3 x 2 x (26*26*32*9 + 24*24*256*288 + 22*22*128*2304 + 15488*128 + 128*10)",
    },
}
for _m in MODELS.values():
    _m["flop_per_sample"] = 3 * 2 * _m["fwd_macs"]

# The graph models, at the input shape the comparison uses (the product owner's 224x224x3, as
# ImageNet-size inputs are fed to them) and a batch per RANK: the global batch grows with the
# ranks, as a Horovod or DDP user scales out. Their FLOP count is too long to type in: it is
# computed from the model file's layers (graph_flops below), and bench/peer checks every layer's
# output shape against mgtrain summary's before using it.
GRAPH_MODELS = {
    "xception": {"cfg": "examples/xception.cfg", "batch_per_rank": 32,
                 "input_shape": "224,224,3"},
    "resnet50": {"cfg": "examples/resnet50.cfg", "batch_per_rank": 32,
                 "input_shape": "224,224,3"},
}


def _pair(text, what):
    """A model-file size: "3" (square) or "3,1" (height, width)."""
    try:
        v = [int(x) for x in str(text).split(",")]
    except ValueError:
        v = []
    if len(v) not in (1, 2) or min(v) < 1:
        raise ValueError(f"{what} = {text}: expected N or H,W (positive whole numbers)")
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _out_size(n, k, s, same):
    """Output length of a window k, stride s: "same" is TensorFlow's ceil(n / s)."""
    return -(-n // s) if same else (n - k) // s + 1


def model_layers(cfg):
    """A model file's [input] shape, its layer sections in order as (line, type, {key: value}),
    and its [train] keys. One section per layer, so a plain line reader (sections repeat)."""
    shape, layers, cur, train = None, [], None, {}
    for no, raw in enumerate(Path(cfg).read_text().splitlines(), 1):
        line = raw.split("#")[0].split(";")[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            cur = None if m.group(1) in ("input", "train") else {}
            if cur is not None:
                layers.append((no, m.group(1), cur))
            section = m.group(1)
        elif "=" in line:
            k, v = (x.strip() for x in line.split("=", 1))
            if section == "input" and k == "shape":
                shape = tuple(int(x) for x in v.split(","))
            elif section == "train":
                train[k] = v
            elif cur is not None:
                cur[k] = v
    return shape, layers, train


def graph_flops(cfg, input_shape=None):
    """Walks a model file's graph (docs/model-files.md, Graphs) from `input_shape` ("H,W,C";
    default its [input] shape) and counts the multiply-adds of one sample's forward pass in
    every convolution and dense layer:
      conv2d             H_out * W_out * kh * kw * C_in * filters
      depthwise_conv2d   H_out * W_out * kh * kw * C
      separable_conv2d   the depthwise part, then a pointwise H_out * W_out * C_in * filters
      dense              inputs * units
    BatchNorm, activations, pooling, additions and the bias adds are left out (element-wise:
    a few FLOP per output, under 1% of these models' total), as they are in the seed models'
    formulas. Returns the total, the sums per kind, the count of layers behind each, the
    trainable parameters and every layer's output shape (H, W, C), or (N,) once flat."""
    shape, layers, _ = model_layers(cfg)
    if input_shape:
        shape = tuple(int(x) for x in str(input_shape).split(","))
    shapes, prev = {"input": shape}, "input"
    macs = {"conv2d": 0, "depthwise": 0, "pointwise": 0, "dense": 0}
    count = dict.fromkeys(macs, 0)
    params, rows, seen = 0, [], {}
    for no, kind, kv in layers:
        seen[kind] = seen.get(kind, 0) + 1
        name = kv.get("name", f"{kind}_{seen[kind]}")
        ins = [x.strip() for x in kv.get("inputs", kv.get("input", prev)).split(",")]
        where = f"{cfg}:{no}: [{kind}] {name}"
        if any(i not in shapes for i in ins):
            raise ValueError(f"{where}: an input of {ins} is not a layer above it")
        x = shapes[ins[0]]
        bias = kv.get("use_bias", "true") == "true"
        if kind in ("conv2d", "depthwise_conv2d", "separable_conv2d", "maxpool", "avgpool"):
            h, w, c = x
            if kind.endswith("pool"):
                k = _pair(kv.get("size", "2"), f"{where}: size")
                s = _pair(kv.get("stride", kv.get("size", "2")), f"{where}: stride")
            else:
                k = _pair(kv["kernel"], f"{where}: kernel")
                s = _pair(kv.get("stride", "1"), f"{where}: stride")
            same = kv.get("padding", "valid") == "same"
            ho, wo = _out_size(h, k[0], s[0], same), _out_size(w, k[1], s[1], same)
            if ho < 1 or wo < 1:
                raise ValueError(f"{where}: a {h}x{w} input is too small for its {k[0]}x{k[1]} "
                                 "window: give a larger input shape")
            f = c if kind in ("depthwise_conv2d", "maxpool", "avgpool") else int(kv["filters"])
            if kind == "conv2d":
                macs["conv2d"] += ho * wo * k[0] * k[1] * c * f
                count["conv2d"] += 1
                params += k[0] * k[1] * c * f + f * bias
            elif kind != "maxpool" and kind != "avgpool":  # depthwise, alone or separable
                macs["depthwise"] += ho * wo * k[0] * k[1] * c
                count["depthwise"] += 1
                params += k[0] * k[1] * c
                if kind == "separable_conv2d":
                    macs["pointwise"] += ho * wo * c * f
                    count["pointwise"] += 1
                    params += c * f
                params += f * bias
            y = (ho, wo, f)
        elif kind == "zeropad":
            p = [int(v) for v in kv["pad"].split(",")]
            p = p * 4 if len(p) == 1 else [p[0], p[0], p[1], p[1]] if len(p) == 2 else p
            y = (x[0] + p[0] + p[1], x[1] + p[2] + p[3], x[2])
        elif kind == "concat":
            y = x[:-1] + (sum(shapes[i][-1] for i in ins),)
        elif kind == "global_avgpool":
            y = (x[-1],)
        elif kind == "flatten":
            y = (math.prod(x),)
        elif kind == "dense":
            n, units = math.prod(x), int(kv["units"])
            macs["dense"] += n * units
            count["dense"] += 1
            params += n * units + units * bias
            y = (units,)
        elif kind == "batchnorm":
            params += 2 * x[-1]  # gamma and beta; the moving statistics are not trained
            y = x
        elif kind in ("activation", "dropout", "add"):
            y = x
        else:
            raise ValueError(f"{where}: no FLOP rule for [{kind}] (add one to graph_flops)")
        shapes[name], prev = y, name
        rows.append((name, y))
    return {"fwd_macs": sum(macs.values()), "macs": macs, "layers": count, "params": params,
            "shapes": rows, "input_shape": shape}


def graph_formula(g):
    """The FLOP formula of a graph model as the results header prints it."""
    parts = [f"{kind} {g['macs'][kind] / 1e6:,.1f} M ({g['layers'][kind]} layers)"
             for kind in ("conv2d", "depthwise", "pointwise", "dense") if g["layers"][kind]]
    return ("3 x 2 x (" + " + ".join(parts) + " multiply-adds; from the model file at "
            + "x".join(map(str, g["input_shape"])) + ": H_out*W_out*kh*kw*C_in*F per conv2d, "
            "H_out*W_out*kh*kw*C per depthwise, H_out*W_out*C_in*F per pointwise, in*units "
            "per dense)")


for _name, _m in GRAPH_MODELS.items():
    _g = graph_flops(REPO / _m["cfg"], _m["input_shape"])
    _m.update(params=_g["params"], fwd_macs=_g["fwd_macs"], flop_per_sample=6 * _g["fwd_macs"],
              formula=graph_formula(_g), shapes=_g["shapes"])
    MODELS[_name] = _m


def read_idx(path):
    """An IDX file (gzipped or not) as a numpy array: the peers' Fashion-MNIST reader (numpy is
    imported here, so that benchlib itself needs the standard library only)."""
    import gzip
    import struct
    import numpy as np
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def die(msg):
    print(f"{Path(sys.argv[0]).name}: {msg}", file=sys.stderr)
    sys.exit(2)


def int_list(text):
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"expected a comma-separated list of whole numbers, got {text!r}")
    if not out or min(out) < 1:
        raise SystemExit(f"expected positive whole numbers, got {text!r}")
    return out


def name_list(text, allowed):
    out = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in out if x not in allowed]
    if bad or not out:
        raise SystemExit(f"unknown name(s) {bad or text!r}: choose from {', '.join(allowed)}")
    return out


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


class Session:
    """One benchmark run: the commands it ran (exactly), their output (the raw log) and the
    results folder. Every command goes through run() so the report can list it. A session can
    also be restored from a run's JSON (--replot) to write its markdown and chart again."""

    def __init__(self, name, args, meta=None):
        self.name = name
        self.args = args
        self.results = Path(args.results_dir).resolve()
        self.build = Path(args.build_dir).resolve()
        self.log = []
        self.peak_rss_mib = None  # of the last run(peak_rss=True)
        self.t0 = time.monotonic()
        if meta:  # a finished run, from its JSON
            self.started = datetime.datetime.fromisoformat(meta["started"])
            self.elapsed_s = meta["elapsed_s"]
            self.load = tuple(meta["load"])
            self.commands = meta["commands"]
            self.invocation = meta["invocation"]
            return
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.elapsed_s = None
        self.load = (os.getloadavg()[0], None)
        self.commands = []
        self.invocation = "bench/" + Path(sys.argv[0]).name + (
            " " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")

    def finish(self):
        """Fixes the run's duration and final load average (call once the measuring is done)."""
        if self.elapsed_s is None:
            self.elapsed_s = time.monotonic() - self.t0
            self.load = (self.load[0], os.getloadavg()[0])

    def meta(self):
        return {"started": self.started.isoformat(), "elapsed_s": self.elapsed_s,
                "load": list(self.load), "commands": self.commands,
                "invocation": self.invocation}

    def env_prefix(self, env):
        return " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())

    def run(self, argv, env=None, check=True, record=True, peak_rss=False):
        """Runs argv (a list) in the checkout with the extra environment `env`, keeping the
        command line (record=False: set-up steps such as the build, left out of the report) and
        its output for the log; returns (rc, stdout, stderr). check: a failure ends the script.
        peak_rss: run it under `benchlib.py peak-rss` and keep the peak resident memory of its
        largest process in self.peak_rss_mib."""
        env = env or {}
        if peak_rss:
            argv = [sys.executable, BENCH / "benchlib.py", "peak-rss", *argv]
        line = (self.env_prefix(env) + " " if env else "") + shlex.join(str(a) for a in argv)
        if record:
            self.commands.append(line)
        print(f"+ {line}", flush=True)
        load, t = os.getloadavg()[0], time.monotonic()
        p = subprocess.run([str(a) for a in argv], env={**os.environ, **env}, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
        rc, out, err = p.returncode, p.stdout, p.stderr
        if peak_rss:
            m = re.search(rf"^{PEAK_RSS_TAG} (\d+)\n\Z", err, re.M)
            self.peak_rss_mib = int(m.group(1)) / 1024 if m else None
        self.log.append(f"$ {line}\n# rc={rc}, {time.monotonic() - t:.1f} s, load average "
                        f"before {load:.2f}\n{out}" + (f"# stderr:\n{err}" if err.strip() else ""))
        if check and rc != 0:
            sys.stderr.write(out[-3000:] + err[-3000:])
            die(f"this command failed (exit status {rc}):\n  {line}")
        return rc, out, err

    def elapsed(self):
        return self.elapsed_s if self.elapsed_s is not None else time.monotonic() - self.t0

    # ---- writing results ------------------------------------------------------------------
    def path(self, suffix):
        return self.results / f"{self.name}{suffix}"

    def write(self, suffix, text):
        self.results.mkdir(parents=True, exist_ok=True)
        p = self.path(suffix)
        fd, tmp = tempfile.mkstemp(dir=self.results, prefix=p.name + ".", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        print(f"wrote {p.relative_to(REPO) if p.is_relative_to(REPO) else p}")
        return p

    def write_log(self):
        return self.write(".log", "\n".join(self.log))

    def write_json(self, data):
        """The run's data, its arguments and its session (dates, commands): all --replot needs."""
        blob = {"data": data, "args": vars(self.args), "session": self.meta()}
        return self.write(".json", json.dumps(blob, indent=1, default=str) + "\n")

    def save(self, data, md, plot):
        """Writes NAME.json and NAME.log (a new run only), NAME.png (plot(plt) returns the figure;
        left out without matplotlib) and NAME.md."""
        self.finish()
        replot = getattr(self.args, "replot", None)
        if not replot:
            self.write_json(data)
            self.write_log()
        plt = pyplot(self)
        if plt:
            save_chart(self, plot(plt), plt)
            md = md.replace("<!--chart-->", f"![chart]({self.name}.png)")
        else:
            md = md.replace("<!--chart-->", "(no chart: matplotlib was not available; run "
                            f"{self.invocation.split()[0]} --replot {self.name}.json where it is)")
        files = f"Data of every run: [{self.name}.json]({self.name}.json)"
        if not replot or self.path(".log").exists():
            files += f"; raw output of every command: [{self.name}.log]({self.name}.log)"
        self.write(".md", md + "\n\n" + files + "\n" + self.commands_md())


    def header_md(self, title, info, notes=()):
        """The header every results file starts with: date, machine, versions, commands."""
        lines = [f"# {title}", ""]
        if getattr(self.args, "quick", False):
            lines += ["**QUICK MODE: a smoke test with few steps, not a measurement.**", ""]
        lines += [
            f"- date: {self.started.strftime('%Y-%m-%d %H:%M UTC')} "
            f"(run took {self.elapsed() / 60:.1f} min)",
            f"- machine: {info['cpu']}, {info['cores']} cores ({info['cpu_detail']}), "
            f"{info['mem_gib']:.0f} GiB memory; {info['os']}",
        ]
        if info.get("gpus"):
            lines.append(f"- GPUs: {info['gpus']}")
        la0, la1 = self.load[0], self.load[1] if self.load[1] is not None else os.getloadavg()[0]
        lines.append(f"- load average (1 min) at start {la0:.2f}, at end {la1:.2f} "
                     f"(anything near the core count or above means the figures are disturbed)")
        lines.append("- versions: " + "; ".join(f"{k} {v}" for k, v in info["versions"].items()))
        lines += [f"- {n}" for n in notes]
        lines += ["", "Command (this file was written by it; every command it ran is listed at "
                  "the end):", "", "```", self.invocation, "```", ""]
        return "\n".join(lines)

    def commands_md(self):
        """The footer: every command the run recorded, exactly as run, in order."""
        return "\n".join(["", f"## Every command run, in order ({len(self.commands)})", "",
                          "```", *self.commands, "```", ""])


def replot_session(path):
    """--replot FILE.json: the arguments, session and data of a finished run."""
    import argparse
    p = Path(path).resolve()
    blob = json.loads(p.read_text())
    args = argparse.Namespace(**blob["args"])
    args.replot, args.results_dir = str(p), str(p.parent)
    return Session(p.stem, args, blob["session"]), args, blob["data"]


# ---- the machine --------------------------------------------------------------------------
def _first(cmd):
    try:
        out = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             timeout=30).stdout
        return out.strip().splitlines()[0] if out.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def mgtrain_version():
    """mgtrain's version and the checkout's commit (and whether it has local changes)."""
    v = "?"
    m = re.search(r"project\(mgtrain VERSION ([\d.]+)", (REPO / "CMakeLists.txt").read_text())
    if m:
        v = m.group(1)
    commit = _first(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    if commit and re.fullmatch(r"[0-9a-f]+", commit):
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain",
                                "--untracked-files=no"], text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL).stdout.strip()
        v += f" (git {commit}{', with local changes' if dirty else ''})"
    elif os.environ.get("MGT_SOURCE_COMMIT"):
        # A checkout copied without its .git (a GPU machine): the commit the carried build was
        # made from, as tests/gpu/on-device reads it from the build's manifest.
        v += f" (git {os.environ['MGT_SOURCE_COMMIT']}, from the build's manifest)"
    return v


def machine_info(extra_versions=None, gpu=False, binary=None):
    """The machine and the versions of what a run used; `binary`: the program whose linked
    OpenBLAS is reported."""
    cpu, flags = platform.processor() or "unknown CPU", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        cpu = m.group(1).strip() if m else cpu
        m = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
        flags = set(m.group(1).split()) if m else set()
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
           if f in flags]
    detail = ", ".join(isa) if isa else "no AVX2"
    lscpu = _first(["bash", "-c", "lscpu | grep -E '^(Thread|Core)\\(s\\) per' | tr -s ' ' | "
                    "paste -sd ';'"])
    if lscpu:
        detail += "; " + lscpu
    if "hypervisor" in flags:
        detail += "; virtual machine"
    mem = 0.0
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        mem = int(m.group(1)) / 2**20 if m else 0.0
    except OSError:
        pass
    osname = platform.platform()
    try:
        m = re.search(r'^PRETTY_NAME="?([^"\n]+)', Path("/etc/os-release").read_text(), re.M)
        osname = f"{m.group(1)}, Linux {platform.release()}" if m else osname
    except OSError:
        pass
    versions = {"mgtrain": mgtrain_version()}
    mpi = _first(["mpirun", "--version"])
    versions["Open MPI"] = mpi.replace("mpirun (Open MPI) ", "") if mpi else "not found"
    blas = linked_version(binary, "libopenblas") if binary else None
    m = re.search(r"(\d+\.\d+\.\d+)", blas or "")
    versions["OpenBLAS"] = (m.group(1) + (" (pthread)" if "openblasp" in blas else "")) if m \
        else "not linked"
    cc = _first(["cc", "--version"])
    if cc:
        versions["compiler"] = cc
    versions.update(extra_versions or {})
    info = {"cpu": cpu, "cores": os.cpu_count(), "cpu_detail": detail, "mem_gib": mem,
            "os": osname, "versions": versions, "host": platform.node()}
    if gpu:
        info["gpus"] = "; ".join(subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version",
             "--format=csv,noheader"], text=True, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL).stdout.strip().splitlines()) if shutil.which(
            "nvidia-smi") else "nvidia-smi not found"
    return info


def gpu_count():
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL).stdout
    n = sum(1 for line in out.splitlines() if line.startswith("GPU"))
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        n = min(n, len([v for v in vis.split(",") if v.strip()]))
    return n


def ldd_paths(binary):
    """{soname: the file it resolves to, or None where ldd says "not found"} for `binary`."""
    out = subprocess.run(["ldd", str(binary)], text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL).stdout
    paths = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)\s*=>\s*(\S+)", line)
        if m:
            paths[m.group(1)] = None if m.group(2) == "not" else m.group(2)
    return paths


def linked_version(binary, lib):
    """The real file name of `lib` (e.g. libopenblasp-r0.3.21.so) that `binary` loads, via ldd."""
    for soname, path in ldd_paths(binary).items():
        if soname.startswith(lib) and path and os.path.exists(path):
            return os.path.basename(os.path.realpath(path))
    return None


# The GPU libraries a CUDA build of mgtrain loads, and the call through which each reports its
# own version. The file names do not tell (pip's wheels ship libnccl.so.2 and libcudnn.so.9
# only). None of these calls needs a GPU or a driver: they read constants of the library.
#   (name, soname prefix, function, signature: "size_t f(void)" or "status f(int *)")
GPU_LIBS = [("cudart", "libcudart.so", "cudaRuntimeGetVersion", "int_out"),
            ("cuBLASLt", "libcublasLt.so", "cublasLtGetVersion", "size_t"),
            ("cuDNN", "libcudnn.so", "cudnnGetVersion", "size_t"),
            ("NCCL", "libnccl.so", "ncclGetVersion", "int_out")]


def version_text(name, code):
    """cudart codes are 1000 x major + 10 x minor (13000: 13.0); cuBLASLt, cuDNN 9 and NCCL 2.9+
    codes are 10000 x major + 100 x minor + patch (22809: 2.28.9)."""
    if name == "cudart":
        return f"{code // 1000}.{code % 1000 // 10}"
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def gpu_lib_versions(binary):
    """{name: {"version", "code", "path"}} of the GPU libraries `binary` resolves to (ldd, so
    LD_LIBRARY_PATH counts), each asked for its version through ctypes. mgtrain opens its GPU
    backend, libmgt_gpu.so beside it, at run time: that library's are counted with its own."""
    import ctypes
    paths = ldd_paths(binary)
    plugin = Path(binary).parent / "libmgt_gpu.so"
    if plugin.is_file():
        paths.update(ldd_paths(plugin))
    found = {}
    for name, prefix, func, sig in GPU_LIBS:
        path = next((p for s, p in paths.items() if s.startswith(prefix) and p), None)
        if not path:
            continue
        try:
            fn = getattr(ctypes.CDLL(path), func)
            if sig == "size_t":
                fn.restype = ctypes.c_size_t
                code = int(fn())
            else:
                out = ctypes.c_int(0)
                status = fn(ctypes.byref(out))
                code = out.value if status == 0 else None
        except (OSError, AttributeError) as e:
            found[name] = {"version": f"? ({e})", "code": None, "path": path}
            continue
        found[name] = {"version": version_text(name, code) if code else "?", "code": code,
                       "path": path}
    return found


# ---- building and launching ---------------------------------------------------------------
def add_common_args(p, default_name):
    p.add_argument("--build-dir", default=str(REPO / "build-bench"),
                   help="CMake build folder of mgtrain and the bench programs (default: "
                        "build-bench in the checkout; configured and built unless --no-build)")
    p.add_argument("--no-build", action="store_true",
                   help="use the programs already in --build-dir (e.g. a build carried to a GPU "
                        "machine that has no compiler or MPI headers)")
    p.add_argument("--results-dir", default=str(RESULTS), help="where results go (bench/results)")
    p.add_argument("--name", default=None,
                   help=f"base name of the result files (default: {default_name})")
    p.add_argument("--quick", action="store_true",
                   help="a short smoke test (few steps and sizes); results get a -quick suffix")
    p.add_argument("--replot", metavar="NAME.json", default=None,
                   help="measure nothing: write NAME.md and NAME.png again from a run's JSON "
                        "(e.g. where the run had no matplotlib)")


# The line `benchlib.py peak-rss` ends its stderr with: the peak RSS in KiB.
PEAK_RSS_TAG = "benchlib-peak-rss-kib"


def peak_rss_main(argv):
    """benchlib.py peak-rss CMD...: runs CMD and then prints the peak resident memory (KiB) of
    the largest process of its tree. Linux's RUSAGE_CHILDREN maxrss is the largest of every
    waited-for descendant (mpirun's ranks, torch.multiprocessing's workers), and this process
    has no other children, so the figure is CMD's alone."""
    import resource
    if not argv:
        die("usage: benchlib.py peak-rss CMD [ARGS...]")
    try:
        rc = subprocess.run(argv).returncode
    except OSError as e:
        die(f"cannot run {argv[0]}: {e.strerror}")
    sys.stdout.flush()
    print(f"{PEAK_RSS_TAG} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}",
          file=sys.stderr, flush=True)
    return rc if rc >= 0 else 128 - rc


def install_deps(sess, *extra):
    """launch/install-deps (the build's Debian packages plus `extra`): a no-op when they are all
    installed; skipped where there is no apt-get (a GPU machine with a carried build)."""
    if shutil.which("apt-get") and shutil.which("dpkg-query"):
        sess.run([REPO / "launch" / "install-deps", *extra], record=False)


def build(sess, targets, cuda=False):
    """The targets, built in sess.build (configured first where it is new: Release, and the GPU
    backend only where `cuda` asks for it, since nvcc takes longer than the rest of the build).
    The build's progress is shown as it goes; a build that has nothing to do takes a second."""
    b = sess.build
    if not sess.args.no_build:
        install_deps(sess)
        new = not (b / "CMakeCache.txt").exists()
        if new or cuda:
            flags = ["-DMGT_CUDA=ON"] if cuda else ["-DMGT_CUDA=OFF"] if new else []
            sess.run(["cmake", "-S", REPO, "-B", b, "-DCMAKE_BUILD_TYPE=Release", *flags],
                     record=False)
        print(f"bench: building {', '.join(targets)} in {b}" +
              (" (a new build: about two minutes on 2 cores" +
               (", and nvcc's GPU backend several more)" if cuda else ")") if new else ""),
              flush=True)
        t = time.monotonic()
        # Make's own lines ("[ 42%] Building C object ...") are the progress; not captured.
        rc = subprocess.run(["cmake", "--build", str(b), "-j", str(os.cpu_count() or 2),
                             "--target", *targets], cwd=REPO).returncode
        if rc != 0:
            die(f"the build failed (above): cmake --build {b} --target {' '.join(targets)}")
        print(f"bench: built in {time.monotonic() - t:.0f} s", flush=True)
    paths = {"mgtrain": b / "mgtrain", "sgemm_rate": b / "bench" / "sgemm_rate",
             "mgt_allreduce_bench": b / "bench" / "mgt_allreduce_bench"}
    for t in targets:
        if not paths[t].exists():
            die(f"{paths[t]} is not built: run without --no-build, or build it with "
                f"cmake --build {b} --target {t}")
    return paths


def mpi_env():
    """Open MPI refuses root unless told; the benchmark machines run as root."""
    if os.geteuid() == 0:
        return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return {}


def mpirun(np, argv, bind="none", cores_per_rank=None):
    """mpirun line for np ranks on this node. bind="none": ranks float over all cores and share
    them out (mgtrain gives each rank cores/ranks BLAS threads); bind="core": each rank is pinned
    to cores_per_rank cores of its own (and uses that many threads)."""
    if not shutil.which("mpirun"):
        die("mpirun not found: install openmpi-bin (launch/install-deps), or on a GPU machine "
            "with no MPI run tests/gpu/on-device, which brings Open MPI from the kit that "
            "tests/gpu/prepare-device carries in .device/")
    cmd = ["mpirun", "-np", str(np), "--oversubscribe"]
    if bind == "core":
        cmd += ["--map-by", f"slot:PE={cores_per_rank or 1}", "--bind-to", "core"]
    else:
        cmd += ["--bind-to", "none"]
    return cmd + [str(a) for a in argv]


def sgemm_ceiling(sess, sgemm_rate, world, size, reps, wrap=lambda argv: argv):
    """The GEMM rate of `world` ranks on this machine, measured now: `world` sgemm_rate processes
    at once, each with its share of the cores as threads (wrap: a prefix for the command, such
    as chrt)."""
    _, out, _ = sess.run(wrap(mpirun(world, [sgemm_rate, "--size", size, "--reps", reps])),
                         env=mpi_env())
    r = json.loads(out.strip().splitlines()[-1])
    return {"gflops": r["gflops"], "openblas": r["openblas"], "core": r.get("core"),
            "what": f"OpenBLAS SGEMM {r['size']}^3, {world} process(es) x "
                    f"{r['threads_per_rank']} thread(s) at once"}


def step_gflop(sess, mgtrain, cfg, batch):
    """The GFLOP of one training step of a model file at a global batch: the forward and
    backward of every layer, mgtrain summary --floor's "all layers" row (the matrix products
    but for a few element-wise passes' tenths of a percent)."""
    argv = [mgtrain, "summary", "--model", cfg, "--batch-size", batch, "--floor"]
    _, out, _ = sess.run(argv, record=False)
    m = re.search(r"^\| \| \*\*all layers\*\* \| \| \| ([\d.]+) \| [\d.]+ \| [^|]+\| ([\d.]+) \|",
                  out, re.M)
    if not m:
        die(f"{shlex.join(map(str, argv))} printed no 'all layers' row")
    return float(m.group(1)) + float(m.group(2))


def model_summary(sess, mgtrain, cfg, input_shape=None):
    """mgtrain summary's trainable parameters and each layer's output shape {name: tuple}."""
    argv = [mgtrain, "summary", "--model", cfg]
    argv += ["--input-shape", input_shape] if input_shape else []
    _, out, _ = sess.run(argv, record=False)
    m = re.search(r"Trainable params:\s*([\d,]+)", out)
    if not m:
        die(f"{shlex.join(map(str, argv))} printed no 'Trainable params' line")
    shapes = {r.group(1): tuple(int(v) for v in r.group(2).split(","))
              for r in re.finditer(r"^(\S+) \(\w+\) +\(([\d, ]+)\)", out, re.M)}
    return int(m.group(1).replace(",", "")), shapes


def check_model_table(sess, mgtrain, model):
    """The FLOP formula in MODELS is only right for the model file it was written for: the
    trainable parameters must match, and for a graph model, whose count is computed from its
    file, so must every layer's output shape (the walk's H_out, W_out and channels)."""
    spec = MODELS[model]
    n, shapes = model_summary(sess, mgtrain, spec["cfg"], spec.get("input_shape"))
    if n != spec["params"]:
        die(f"{spec['cfg']} now has {n} trainable parameters, not {spec['params']}: update the "
            f"FLOP formula of '{model}' in bench/benchlib.py to the new layer sizes")
    for name, shape in spec.get("shapes", ()):
        if shapes.get(name) != shape:
            die(f"{spec['cfg']}: layer {name} has output shape {shapes.get(name)} in mgtrain "
                f"summary but {shape} in graph_flops (bench/benchlib.py): fix the rule of its "
                "layer type there")
    return n


# ---- mgtrain's step times -----------------------------------------------------------------
def timeline_steps(path, rank=0):
    """Per-step phase durations (seconds) of one rank from mgtrain's --timeline Chrome trace:
    {step: {"data": s, "forward": s, ..., "start": s, "end": s}}."""
    with open(path) as f:
        trace = json.load(f)
    steps = {}
    for ev in trace["traceEvents"]:
        # tid 0: the step's phases; tid 1 holds the bucket requests in flight, which overlap them
        if ev.get("ph") != "X" or ev.get("pid") != rank or ev.get("tid", 0) != 0:
            continue
        s = steps.setdefault(ev["args"]["step"], {"start": float("inf"), "end": 0.0})
        s[ev["name"]] = s.get(ev["name"], 0.0) + ev["dur"] * 1e-6
        s["start"] = min(s["start"], ev["ts"] * 1e-6)
        s["end"] = max(s["end"], (ev["ts"] + ev["dur"]) * 1e-6)
    return steps


def batch_at(step, batch, n=60000):
    """Samples in mgtrain's global batch number `step` (counted over epochs): every epoch of n
    samples has ceil(n / batch) steps and keeps its last, shorter batch (src/data/shard.h)."""
    per_epoch = -(-n // batch)
    return min(batch, n - (step % per_epoch) * batch)


def timed_steps(steps, warmup, batch, n=60000):
    """The steps after the first `warmup` ones: their count, samples, total seconds, and the mean
    step and phase times (ms) over the full-batch ones (an epoch's short last batch would pull
    the means down)."""
    keys = sorted(steps)[warmup:]
    if not keys:
        die(f"the timeline has {len(steps)} steps, none after {warmup} warm-up steps")
    full = [k for k in keys if batch_at(k, batch, n) == batch] or keys
    span = {k: steps[k]["end"] - steps[k]["start"] for k in keys}
    phases = {}
    for k in full:
        for ph, d in steps[k].items():
            if ph not in ("start", "end"):
                phases[ph] = phases.get(ph, 0.0) + 1e3 * d / len(full)
    return {"steps_timed": len(keys), "samples": sum(batch_at(k, batch, n) for k in keys),
            "seconds": sum(span.values()), "step_ms": 1e3 * sum(span[k] for k in full) / len(full),
            "phase_ms": phases, "steps_total": len(steps)}


def trained_line(out):
    """mgtrain's own summary line: (steps, seconds, samples/s)."""
    m = re.search(r"Trained (\d+) steps in ([\d.]+) s \(([\d.]+) samples/s\)", out)
    return (int(m.group(1)), float(m.group(2)), float(m.group(3))) if m else None


def run_mgtrain(sess, mgtrain, np, args, warmup, batch, bind="none", cores_per_rank=None,
                env=None, prefix=()):
    """Runs mgtrain (global batch `batch`, 60,000 training samples) with a timeline in a scratch
    folder; returns the timing of the steps after `warmup`, measured on rank 0 as the sum of each
    step's span (data loading to the end of the update), so epoch-end evaluation and checkpoints
    are not counted, and samples/s = their samples / that time. prefix: what runs mpirun (e.g.
    chrt -f N); test_acc: the accuracy of the run's final test, where it printed one."""
    with tempfile.TemporaryDirectory(prefix="mgt-bench-") as tmp:
        tl = Path(tmp) / "timeline.json"
        argv = [mgtrain, *args, "--batch-size", batch, "--verbose", "2", "--out",
                Path(tmp) / "out", "--timeline", tl]
        _, out, _ = sess.run([*prefix, *mpirun(np, argv, bind, cores_per_rank)],
                             env={**mpi_env(), **(env or {})}, peak_rss=True)
        r = timed_steps(timeline_steps(tl), warmup, batch)
    r["peak_rss_mib"] = sess.peak_rss_mib
    r["samples_per_s"] = r["samples"] / r["seconds"]
    r["trained_line"] = trained_line(out)
    m = re.search(r"^Test loss: [\d.]+ - test acc: ([\d.]+)", out, re.M)
    r["test_acc"] = float(m.group(1)) if m else None
    m = re.search(r"Peak GPU memory: ([\d.]+) MiB", out)
    r["peak_gpu_mem_mb"] = float(m.group(1)) if m else None
    r["load_avg"] = os.getloadavg()[0]
    return r


# ---- charts -------------------------------------------------------------------------------
def pyplot(sess):
    """matplotlib.pyplot with the Agg backend, installing python3-matplotlib if it is missing;
    None (and a notice) where it cannot be had, so the markdown is still written."""
    try:
        import matplotlib
    except ImportError:
        if sys.executable.startswith("/usr/bin/python3"):  # Debian's packages serve this one
            print("matplotlib is missing: installing python3-matplotlib", flush=True)
            install_deps(sess, "python3-matplotlib")
            import importlib
            importlib.invalidate_caches()
        try:
            import matplotlib
        except ImportError:
            print("notice: no matplotlib for this Python (apt-get install python3-matplotlib, "
                  "or pip install matplotlib): the chart is left out", file=sys.stderr)
            return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"figure.dpi": 110, "font.size": 9, "axes.grid": True,
                         "grid.alpha": 0.3, "axes.spines.top": False,
                         "axes.spines.right": False})
    return plt


def save_chart(sess, fig, plt):
    sess.results.mkdir(parents=True, exist_ok=True)
    p = sess.path(".png")
    tmp = p.with_name(p.name + ".tmp.png")
    fig.savefig(tmp, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, p)
    print(f"wrote {p}")
    return p


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


if __name__ == "__main__":
    # python3 bench/benchlib.py gpu-libs BINARY: one line per GPU library BINARY loads,
    # "name version code path" (tests/gpu/on-device logs these and picks its NCCL route by code).
    # python3 bench/benchlib.py peak-rss CMD...: CMD's peak RSS (peak_rss_main).
    # python3 bench/benchlib.py flops MODEL.cfg [H,W,C]: graph_flops as JSON (tests/cli).
    if len(sys.argv) > 1 and sys.argv[1] == "peak-rss":
        sys.exit(peak_rss_main(sys.argv[2:]))
    if len(sys.argv) in (3, 4) and sys.argv[1] == "flops":
        try:
            g = graph_flops(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else None)
        except (OSError, ValueError, KeyError) as e:
            die(f"{sys.argv[2]}: {e}")
        g["flop_per_sample"] = 6 * g["fwd_macs"]
        g["formula"] = graph_formula(g)
        print(json.dumps(g))
        sys.exit(0)
    if len(sys.argv) != 3 or sys.argv[1] != "gpu-libs":
        die("usage: benchlib.py gpu-libs BINARY | peak-rss CMD... | flops MODEL.cfg [H,W,C]")
    if not Path(sys.argv[2]).is_file():
        die(f"{sys.argv[2]}: no such file")
    for lib, v in gpu_lib_versions(sys.argv[2]).items():
        print(lib, v["version"].split(" ")[0], v["code"] or 0, v["path"])
