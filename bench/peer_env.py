"""peer_env: the peers' Python environments, which bench/peer installs into the build folder.

    BUILD/peers/wheels/   every wheel downloaded (pip download), so that a rerun installs offline
    BUILD/peers/torch/    virtual environment: PyTorch (PyPI's wheel) and what importing it needs
    BUILD/peers/keras/    virtual environment: TensorFlow and Keras 3 (TensorFlow's dependency)

An environment is made once: its python, its versions and the extra environment it needs go into
peer-env.json inside it, and the next run reads them after one `import` check (a second or two).
Versions: TORCH and TENSORFLOW below, the current releases when this was written.

PyPI's torch wheel for Linux is its CUDA build, and it loads CUDA libraries when it is imported,
even on a machine without a GPU. pip would bring CUDA in whole as wheels (some 3 GB, cuDNN and
cuBLAS included). Installed with --no-deps, it imports once the pure-Python dependencies, the
four libraries in TORCH_CUDA_WHEELS (about 310 MB of wheels) and the CUDA 13 toolkit's own
libraries (cudart, cuBLAS, cuFFT, cuSPARSE, cuDNN, NVRTC, nvJitLink, CUPTI, found through
ld.so.conf or LD_LIBRARY_PATH) are there; so that is what is installed, and where the toolkit is
missing the peer is left out with the loader's own message and what to install. TensorFlow's
wheel needs no CUDA to run on a CPU: it installs with its dependencies as pip resolves them.

Standard library only; pip runs as `python -m pip` of the venv. """
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TORCH = "2.15.0"
TENSORFLOW = "2.21.0"
# What `import torch` loads beyond the CUDA toolkit, pinned as torch 2.15.0's metadata pins them
# (cuFile as its cuda-toolkit 13.2 pins it).
TORCH_CUDA_WHEELS = ["nvidia-cufile==1.17.1.22", "nvidia-cusparselt-cu13==0.8.1",
                     "nvidia-nccl-cu13==2.30.7", "nvidia-nvshmem-cu13==3.7.2"]
# torch's pure-Python dependencies (its metadata's, less setuptools, which only its C++
# extension builder uses), and numpy for the peer's data.
TORCH_PY_DEPS = ["filelock", "typing-extensions>=4.13.0", "sympy>=1.13.3", "networkx>=2.5.1",
                 "jinja2", "fsspec>=0.8.5", "numpy"]
# Where the CUDA 13 toolkit keeps its libraries, tried on LD_LIBRARY_PATH when the plain import
# fails (a machine whose ld.so.conf does not list them).
CUDA_LIB_DIRS = ["/usr/local/cuda/lib64", "/usr/local/cuda/lib"]

STAMP = "peer-env.json"


class Unavailable(Exception):
    """The framework cannot be had here; the message says why and what to do."""


def _run(argv, env=None, quiet=False):
    """Runs argv, its output to this terminal (pip's progress) unless quiet; (rc, output)."""
    p = subprocess.run([str(a) for a in argv], env={**os.environ, **(env or {})}, text=True,
                       stdout=subprocess.PIPE if quiet else None,
                       stderr=subprocess.STDOUT if quiet else None)
    return p.returncode, p.stdout or ""


def base_python():
    """A python3 that can make a virtual environment with pip in it: the first python3 on PATH
    (a pyenv or the system's), then this one."""
    for c in [shutil.which("python3"), sys.executable]:
        if c and _run([c, "-c", "import venv, ensurepip"], quiet=True)[0] == 0:
            return c
    raise Unavailable("no python3 here can make a virtual environment with pip (Debian: "
                      "apt-get install python3-venv)")


def _probe(py, module, env):
    """(rc, output) of importing `module` in `py` and printing its version."""
    code = (f"import {module} as m, json; print(json.dumps({{'version': m.__version__}}))")
    if module == "tensorflow":
        code = ("import os; os.environ['CUDA_VISIBLE_DEVICES'] = ''; "
                "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3'); import tensorflow as t, "
                "keras, json; print(json.dumps({'version': t.__version__, "
                "'keras': keras.__version__}))")
    return _run([py, "-c", code], env=env, quiet=True)


def _ready(venv, want):
    """The stamp of an environment made before for `want`, if it still imports."""
    stamp = venv / STAMP
    try:
        info = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None
    if info.get("want") != want:
        return None
    rc, _ = _probe(info["python"], info["module"], info["env"])
    return info if rc == 0 else None


def _pip(venv_py, args, wheels, what):
    """pip install from the wheel folder alone (offline), downloading into it first only what is
    missing there."""
    offline = [venv_py, "-m", "pip", "install", "--disable-pip-version-check", "--no-index",
               "--find-links", wheels, *args]
    if _run(offline, quiet=True)[0] == 0:
        return
    dl = [a for a in args if a != "--no-deps"]
    print(f"peer_env: downloading {what} into {wheels}", flush=True)
    rc, _ = _run([venv_py, "-m", "pip", "download", "--disable-pip-version-check", "-d", wheels,
                  *(["--no-deps"] if "--no-deps" in args else []), *dl])
    if rc != 0:
        raise Unavailable(f"pip could not download {what} ({' '.join(dl)}); PyPI must be "
                          "reachable the first time (the wheels are kept in " f"{wheels})")
    rc, out = _run(offline, quiet=True)
    if rc != 0:
        raise Unavailable(f"pip could not install {what} from {wheels}:\n{out[-2000:]}")


def _make_venv(venv):
    py = venv / "bin" / "python"
    if not py.exists():
        print(f"peer_env: making the virtual environment {venv}", flush=True)
        rc, out = _run([base_python(), "-m", "venv", venv], quiet=True)
        if rc != 0:
            raise Unavailable(f"python3 -m venv {venv} failed:\n{out[-2000:]}")
    return py


def torch_env(build):
    """PyTorch TORCH in BUILD/peers/torch: {"python", "env", "version", ...}; Unavailable
    where it cannot be had."""
    root = Path(build).resolve() / "peers"
    venv, wheels = root / "torch", root / "wheels"
    want = {"torch": TORCH, "cuda_wheels": TORCH_CUDA_WHEELS}
    info = _ready(venv, want)
    if info:
        return info
    wheels.mkdir(parents=True, exist_ok=True)
    py = _make_venv(venv)
    _pip(py, ["--no-deps", f"torch=={TORCH}", *TORCH_CUDA_WHEELS], wheels,
         f"PyTorch {TORCH} (the CUDA build PyPI serves, without its CUDA wheels) and the four "
         "CUDA libraries it loads that the toolkit lacks")
    _pip(py, TORCH_PY_DEPS, wheels, "PyTorch's Python dependencies")
    env = {}
    rc, out = _probe(py, "torch", env)
    dirs = [d for d in CUDA_LIB_DIRS if os.path.isdir(d)]
    if rc != 0 and dirs:
        env = {"LD_LIBRARY_PATH": ":".join(dirs + [os.environ.get("LD_LIBRARY_PATH", "")])
               .rstrip(":")}
        rc, out = _probe(py, "torch", env)
    if rc != 0:
        raise Unavailable(
            f"PyTorch {TORCH} from PyPI does not import here:\n{out.strip()[-1500:]}\nIts wheel "
            "is a CUDA build and loads CUDA 13's runtime libraries even on a CPU: install the "
            "CUDA 13 toolkit (cudart, cuBLAS, cuFFT, cuSPARSE, cuDNN, NVRTC, nvJitLink, CUPTI) "
            "under /usr/local/cuda, or pass --python with an interpreter that has torch")
    info = {"want": want, "python": str(py), "module": "torch", "env": env,
            "version": json.loads(out.strip().splitlines()[-1])["version"]}
    (venv / STAMP).write_text(json.dumps(info, indent=1) + "\n")
    return info


def keras_env(build):
    """TensorFlow TENSORFLOW and its Keras 3 in BUILD/peers/keras: {"python", "env", "version",
    "keras"}; Unavailable where they cannot be had."""
    root = Path(build).resolve() / "peers"
    venv, wheels = root / "keras", root / "wheels"
    want = {"tensorflow": TENSORFLOW}
    info = _ready(venv, want)
    if info:
        return info
    wheels.mkdir(parents=True, exist_ok=True)
    py = _make_venv(venv)
    _pip(py, [f"tensorflow=={TENSORFLOW}"], wheels,
         f"TensorFlow {TENSORFLOW} and its dependencies (Keras 3 among them)")
    rc, out = _probe(py, "tensorflow", {})
    if rc != 0:
        raise Unavailable(f"TensorFlow {TENSORFLOW} does not import here:\n{out.strip()[-1500:]}")
    v = json.loads(out.strip().splitlines()[-1])
    info = {"want": want, "python": str(py), "module": "tensorflow", "env": {},
            "version": v["version"], "keras": v["keras"]}
    (venv / STAMP).write_text(json.dumps(info, indent=1) + "\n")
    return info


if __name__ == "__main__":
    # python3 bench/peer_env.py torch|keras BUILD: makes (or checks) one environment and prints
    # its stamp, e.g. to prepare a machine before a timed run.
    if len(sys.argv) != 3 or sys.argv[1] not in ("torch", "keras"):
        sys.exit("usage: peer_env.py torch|keras BUILD_DIR")
    try:
        print(json.dumps((torch_env if sys.argv[1] == "torch" else keras_env)(sys.argv[2])))
    except Unavailable as e:
        sys.exit(f"peer_env: {e}")
