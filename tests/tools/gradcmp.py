#!/usr/bin/env python3
"""gradcmp.py: compares two gradient dumps (MGT_DUMP_GRADIENTS, safetensors) tensor by tensor.

    gradcmp.py A B SPEC...      SPEC = NAME_PREFIX=K: tensors whose name starts with NAME_PREFIX
                                are sums of K addends over the global batch

Each element of a summed gradient is a float32 sum of K addends; two sums of the same addends
in different orders (another rank count splits them differently) differ by rounding alone. The
rounding error of a K-term float32 sum behaves like a random walk of K steps of at most u = 2^-24
of the partial sums (Higham, "Accuracy and Stability of Numerical Algorithms", section 2.8:
"a rule of thumb" error of order sqrt(K) u; the worst case, K u, is rarely approached), so the two
sums are compared relative to the tensor's largest element with tolerance 2 u sqrt(K). A
tensor whose exact gradient cancels almost to zero (a bias in front of a BatchNorm) is
ill-conditioned for this measure; the models compared leave such tensors out. Exit 0 when every
tensor is within its tolerance, 1 otherwise, 2 on bad input. Prints every tensor."""
import json
import math
import struct
import sys

import numpy as np

U = 2.0 ** -24


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    base = 8 + n
    return {k: np.frombuffer(raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]],
                             "<f4").reshape(v["shape"])
            for k, v in hdr.items() if k != "__metadata__"}


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        a, b = load(argv[1]), load(argv[2])
        spec = [(p.split("=")[0], float(p.split("=")[1])) for p in argv[3:]]
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"gradcmp: {e}", file=sys.stderr)
        return 2
    if set(a) != set(b):
        print(f"gradcmp: the dumps hold different tensors: {sorted(set(a) ^ set(b))}")
        return 1
    bad = 0
    for name in a:
        ks = [k for p, k in spec if name.startswith(p)]
        if not ks:
            print(f"gradcmp: no addend count given for {name}", file=sys.stderr)
            return 2
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        scale = np.abs(x).max()
        rel = np.abs(x - y).max() / scale if scale > 0 else np.abs(x - y).max()
        tol = 2 * U * math.sqrt(ks[0])
        ok = np.all(np.isfinite(y)) and rel <= tol
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: relative difference {rel:.3g}, tolerance "
              f"{tol:.3g} (K = {ks[0]:.0f})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
