"""weights.py: safetensors weights files as numpy arrays, for the tests' checks.

    load(path) -> (tensors: dict name -> float64 array, metadata: dict)
    flat(path) -> every tensor, by name order, in one float64 vector
    write(path, tensors)  writes float32 tensors, and int64 ones as I64 (no metadata)
"""
import json
import struct

import numpy as np


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for k, v in hdr.items():
        a, b = v["data_offsets"]
        dt = {"F32": "<f4", "I64": "<i8"}[v["dtype"]]
        out[k] = np.frombuffer(raw[base + a:base + b], dt).reshape(v["shape"]).astype(
            np.float64 if dt == "<f4" else np.int64)
    return out, meta


def flat(path):
    t, _ = load(path)
    return np.concatenate([t[k].ravel() for k in sorted(t)])


def write(path, tensors):
    hdr, blobs, at = {}, [], 0
    for k, a in tensors.items():
        ints = np.asarray(a).dtype.kind in "iu"
        a = np.ascontiguousarray(a, dtype="<i8" if ints else "<f4")
        hdr[k] = {"dtype": "I64" if ints else "F32", "shape": list(a.shape),
                  "data_offsets": [at, at + a.nbytes]}
        blobs.append(a.tobytes())
        at += a.nbytes
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
