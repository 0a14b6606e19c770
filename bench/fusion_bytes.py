#!/usr/bin/env python3
"""fusion_bytes.py: the bytes each memory-bound layer of a model moves through GPU memory per
training step, before and after the depthwise, fusion and bf16 changes of cuda/, and the time
those bytes take at a given bandwidth: the predictions that the per-layer GPU profile checks.

    bench/fusion_bytes.py [--mgtrain build/mgtrain] [--batch 32,256] [--bw 4.3e12]
                          [--csv FILE] MODEL.cfg [MODEL.cfg ...]

The layer graph (shapes, inputs) comes from `mgtrain summary` on the model at its own input
shape (224x224x3 for the two graph models at --input-shape 224,224,3); the convolutions' keys
(kernel, stride, use_bias) from the model file itself. Only the memory-bound passes are counted
(batch normalisation, activations, residual sums, convolution biases, the depthwise convolutions,
the bf16 casts around cuDNN and cuBLAS); the GEMM-shaped work of cuDNN and cuBLAS is the same
before and after and is left out. Every tensor is read or written once per pass (what a kernel
that streams it does); a pass's time is its bytes over the bandwidth, the floor no kernel beats.

The passes, per element E of a layer's output (Ein: of its input), in bytes, fp32 activations:
  batchnorm        fwd: stats read x (4E), apply read x + write y (8E)       = 12E
                   bwd: reduce read x, dy (8E), apply read x, dy + write dx  = 20E
  relu layer       fwd: in place read y + write y 8E; when its input has other readers a copy
                   first (+8E); bwd: act_bwd read y, dy + write dy (12E), then dy copied to dx
                   (+8E), or, where dx gathers several readers' gradients, copied to the
                   accumulation buffer and added (+8E +12E)
  add (2 inputs)   fwd: 12E; bwd per input: copy 8E, or accumulate 12E
  conv bias        fwd: the bias rows written (4E), then read again by cuDNN's beta = 1 (4E);
                   bwd: the bias gradient's column sums read dy (4E)
After fusion (a batchnorm whose only reader is a relu, or an add with one other input and then
perhaps a relu, runs as one group at its last layer):
  bn + relu        fwd 4E + 8E = 12E; bwd: reduce read x, dy (8E), apply read x, dy + write dx
                   (12E) = 20E (the relu's mask recomputed from x, not read)
  bn + add [+relu] fwd: 4E + read x, r + write y (12E) = 16E; bwd: reduce 8E (+4E for the
                   relu's mask, read from y), apply read x, dy (+y) + write dx, dr (16E or 20E;
                   +4E where dr accumulates)
  relu layer       fwd one pass (8E); bwd one pass, dx = dy * [y > 0] or dx += (12E or 16E)
  conv bias        none, where a batchnorm is its only reader (cancelled by the normalisation)
bf16 (--precision bf16) before: every activation fp32 as above, plus the casts around each
convolution and dense layer (fwd: x to bf16 read 4Ein + write 2Ein, y widened read 2E + write
4E; bwd: x again 6Ein, dy 6E, dx widened 6Ein); after: no casts, every activation 2 bytes, so
each pass above moves half the bytes.
Depthwise convolution (the depthwise step of separable_conv2d and depthwise_conv2d), E_d = its
output's elements: fwd read x + write y (4Ein + 4E_d), bwd data read dy + write dx, filter read
x + dy. The old kernels are not bound by those bytes but by their index arithmetic (64-bit
division and remainder per element, per tap for the filter gradient); their time here is an
estimate from instruction counts (`--lane-rate`), marked as such.
"""
import argparse
import csv
import os
import re
import subprocess
import sys
from collections import OrderedDict


def parse_cfg(path):
    """Sections of an mgtrain model file as (type, {key: value}) in order."""
    sections, cur = [], None
    with open(path) as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.match(r"\[(\w+)\]$", line)
            if m:
                cur = (m.group(1), {})
                sections.append(cur)
            elif cur is not None and "=" in line:
                k, v = line.split("=", 1)
                cur[1][k.strip()] = v.strip()
    return sections


def summary(mgtrain, cfg, shape, batch):
    cmd = [mgtrain, "summary", "--model", cfg, "--batch-size", str(batch)]
    if shape:
        cmd += ["--input-shape", shape]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    layers = OrderedDict()
    for line in out.splitlines():
        m = re.match(r"(\S+) \((\w+)\)\s+\(([\d, ]+)\)(?: (\w+))?\s+([\d,]+)\s*(.*)$", line)
        if not m:
            continue
        name, typ, shp, act, _, conn = m.groups()
        dims = [int(v) for v in shp.split(",")]
        elems = 1
        for d in dims:
            elems *= d
        inputs = [s.strip() for s in conn.split(",")] if conn.strip() else []
        layers[name] = {"type": typ, "elems": elems, "dims": dims, "inputs": inputs,
                        "act": act}
    return layers


def layer_keys(cfg_sections, layers):
    """Each layer's model-file keys by name (the default names as mgtrain gives them)."""
    keys, counts = {}, {}
    for typ, kv in cfg_sections:
        if typ in ("input", "train"):
            continue
        counts[typ] = counts.get(typ, 0) + 1
        keys[kv.get("name", "%s_%d" % (typ, counts[typ]))] = (typ, kv)
    return keys


def predict(layers, keys, batch, lane_rate):
    """Per layer: the passes before and after each change, as rows of a table."""
    consumers = {n: 0 for n in layers}
    readers = {n: [] for n in layers}
    for n, l in layers.items():
        for i in l["inputs"]:
            if i in consumers:
                consumers[i] += 1
                readers[i].append(n)
    elems_of = lambda n: layers[n]["elems"] * batch if n in layers else None

    def input_elems(n):
        i = layers[n]["inputs"][0]
        return elems_of(i) if i in layers else None

    # The fusion groups: batchnorm -> relu; batchnorm -> add (two inputs) [-> relu].
    group_of, groups = {}, []
    for n, l in layers.items():
        if l["type"] != "batchnorm" or consumers[n] != 1:
            continue
        c = readers[n][0]
        lc = layers[c]
        if lc["type"] == "activation" and lc["act"] in (None, "relu") and \
                keys.get(c, ("", {}))[1].get("type") == "relu":
            g = {"bn": n, "add": None, "act": c, "tail": c}
        elif lc["type"] == "add" and len(lc["inputs"]) == 2 and c not in group_of:
            other = [i for i in lc["inputs"] if i != n]
            if len(other) != 1 or other[0] == layers[n]["inputs"][0]:
                continue
            # of two batchnorm inputs, the later one heads the group (both computed by then)
            if other[0] in layers and layers[other[0]]["type"] == "batchnorm" and \
                    list(layers).index(other[0]) > list(layers).index(n) and \
                    consumers[other[0]] == 1:
                continue
            g = {"bn": n, "add": c, "act": None, "tail": c, "res": other[0]}
            if consumers[c] == 1:
                a = readers[c][0]
                if layers[a]["type"] == "activation" and \
                        keys.get(a, ("", {}))[1].get("type") == "relu":
                    g["act"] = a
                    g["tail"] = a
        else:
            continue
        groups.append(g)
        for k in ("bn", "add", "act"):
            if g.get(k):
                group_of[g[k]] = g

    rows = []
    for n, l in layers.items():
        typ, E = l["type"], elems_of(n)
        kv = keys.get(n, (typ, {}))[1]
        r = {"layer": n, "type": typ, "shape": "x".join(str(d) for d in l["dims"]),
             "fwd_before": 0.0, "bwd_before": 0.0, "fwd_after": 0.0, "bwd_after": 0.0,
             "bf16_fwd_before": 0.0, "bf16_bwd_before": 0.0, "change": ""}
        accumulates = lambda t: consumers.get(t, 0) > 1
        # ---- before (fp32) ----
        if typ == "batchnorm":
            r["fwd_before"], r["bwd_before"] = 12 * E, 20 * E
        elif typ == "activation":
            inplace = consumers.get(l["inputs"][0], 1) == 1
            r["fwd_before"] = 8 * E + (0 if inplace else 8 * E)
            acc = accumulates(l["inputs"][0]) and readers[l["inputs"][0]][-1] != n
            r["bwd_before"] = 12 * E + (20 * E if acc else 8 * E)
        elif typ == "add":
            r["fwd_before"] = 4 * E * (len(l["inputs"]) + 1)
            b = 0
            for i in l["inputs"]:
                later = [q for q in readers[i] if list(layers).index(q) > list(layers).index(n)]
                b += 12 * E if later else 8 * E
            r["bwd_before"] = b
        elif typ == "conv2d" and kv.get("use_bias", "true") == "true":
            r["fwd_before"], r["bwd_before"] = 8 * E, 4 * E
        # ---- after (fp32) ----
        g = group_of.get(n)
        if g is not None:
            if n == g["tail"]:
                Eg = E
                if g["add"] is None:
                    r["fwd_after"], r["bwd_after"] = 12 * Eg, 20 * Eg
                    r["change"] = "bn+relu (%s)" % g["bn"]
                else:
                    mask = 4 * Eg if g["act"] else 0
                    res_acc = 4 * Eg if accumulates(g["res"]) and \
                        readers[g["res"]][-1] != g["add"] else 0
                    r["fwd_after"] = 16 * Eg
                    r["bwd_after"] = 8 * Eg + mask + 16 * Eg + mask + res_acc
                    r["change"] = "bn+add%s (%s)" % ("+relu" if g["act"] else "", g["bn"])
            else:
                r["change"] = "in group %s" % g["tail"]
        elif typ == "activation":
            acc = accumulates(l["inputs"][0]) and readers[l["inputs"][0]][-1] != n
            r["fwd_after"], r["bwd_after"] = 8 * E, (16 if acc else 12) * E
            r["change"] = "one-pass relu"
        elif typ == "conv2d" and kv.get("use_bias", "true") == "true":
            if consumers[n] == 1 and layers[readers[n][0]]["type"] == "batchnorm":
                r["change"] = "bias cancelled by %s" % readers[n][0]
            else:
                r["fwd_after"], r["bwd_after"] = r["fwd_before"], r["bwd_before"]
        else:
            r["fwd_after"], r["bwd_after"] = r["fwd_before"], r["bwd_before"]
        # ---- depthwise ----
        if typ in ("separable_conv2d", "depthwise_conv2d"):
            Ein = input_elems(n)
            stride = int(kv.get("stride", "1"))
            k = [int(v) for v in kv.get("kernel", "3").split(",")]
            taps = k[0] * (k[1] if len(k) > 1 else k[0])
            cin = layers[layers[n]["inputs"][0]]["dims"][-1] if layers[n]["inputs"][0] in layers \
                else None
            Ed = Ein // (stride * stride) if stride > 1 else Ein  # "same" padding
            r["dw_fwd"], r["dw_bwd"] = 4 * (Ein + Ed), 4 * (Ein + Ed) * 2
            # the old kernels: instruction-bound estimates (see the module's comment)
            r["dw_old_fwd_s"] = max(4 * (Ein + Ed) / BW, Ed * 250 / lane_rate)
            r["dw_old_bwd_s"] = max(8 * (Ein + Ed) / BW,
                                    Ein * 420 / lane_rate + Ed * taps * 90 / lane_rate)
            r["change"] = (r["change"] + "; " if r["change"] else "") + \
                "depthwise %dx%d/%d on %s (est. old -> floor)" % (
                    k[0], k[-1], stride, "x".join(str(d) for d in layers[l["inputs"][0]]["dims"]))
        # ---- bf16 (what the casts add before; after, every pass above at 2 bytes) ----
        if typ in ("conv2d", "separable_conv2d", "dense"):
            Ein = input_elems(n) or 0
            Eo = E
            if typ == "separable_conv2d":  # the pointwise step's input is the depthwise output
                Ein = Ein // (int(kv.get("stride", "1")) ** 2)
            r["bf16_fwd_before"] = 6 * Ein + 6 * Eo
            r["bf16_bwd_before"] = 12 * Ein + 6 * Eo
        rows.append(r)
    return rows


BW = 4.3e12


def us(b):
    return b / BW * 1e6


def report(model, rows, batch, out):
    tot = lambda k: sum(r.get(k, 0.0) for r in rows)
    fb, bb, fa, ba = tot("fwd_before"), tot("bwd_before"), tot("fwd_after"), tot("bwd_after")
    dwf, dwb = tot("dw_fwd"), tot("dw_bwd")
    dwof, dwob = tot("dw_old_fwd_s"), tot("dw_old_bwd_s")
    c16f, c16b = tot("bf16_fwd_before"), tot("bf16_bwd_before")
    out.append("### %s, batch %d\n" % (model, batch))
    out.append("| pass | before | after | saved |")
    out.append("|---|---|---|---|")
    out.append("| fusion + bias (fp32/TF32), forward | %.0f MB, %.0f us | %.0f MB, %.0f us | %.2f ms |"
               % (fb / 1e6, us(fb), fa / 1e6, us(fa), (us(fb) - us(fa)) / 1e3))
    out.append("| fusion + bias (fp32/TF32), backward | %.0f MB, %.0f us | %.0f MB, %.0f us | %.2f ms |"
               % (bb / 1e6, us(bb), ba / 1e6, us(ba), (us(bb) - us(ba)) / 1e3))
    if dwf:
        out.append("| depthwise fp32, forward | est. %.0f us | %.0f MB, %.0f us at 100%% (%.0f us at 75%%) | %.2f ms |"
                   % (dwof * 1e6, dwf / 1e6, us(dwf), us(dwf) / 0.75, (dwof * 1e6 - us(dwf) / 0.75) / 1e3))
        out.append("| depthwise fp32, backward (data + filter) | est. %.0f us | %.0f MB, %.0f us at 100%% (%.0f us at 75%%) | %.2f ms |"
                   % (dwob * 1e6, dwb / 1e6, us(dwb), us(dwb) / 0.75, (dwob * 1e6 - us(dwb) / 0.75) / 1e3))
    f16b, f16a = fb + c16f, fa / 2
    b16b, b16a = bb + c16b, ba / 2
    out.append("| bf16, forward (memory-bound passes + casts) | %.0f MB, %.0f us | %.0f MB, %.0f us | %.2f ms |"
               % (f16b / 1e6, us(f16b), f16a / 1e6, us(f16a), (us(f16b) - us(f16a)) / 1e3))
    out.append("| bf16, backward | %.0f MB, %.0f us | %.0f MB, %.0f us | %.2f ms |"
               % (b16b / 1e6, us(b16b), b16a / 1e6, us(b16a), (us(b16b) - us(b16a)) / 1e3))
    if dwf:
        out.append("| bf16 depthwise, forward + backward | est. %.0f us | %.0f MB, %.0f us at 100%% | |"
                   % ((dwof + dwob) * 1e6, (dwf + dwb) / 2e6, us((dwf + dwb) / 2)))
    out.append("")
    # by kind and shape: where the savings are
    kinds = OrderedDict()
    for r in rows:
        if not r["change"] or r["change"].startswith("in group"):
            continue
        kind = re.sub(r" \(.*\)| by \S+", "", r["change"])
        key = (kind, r["shape"])
        k = kinds.setdefault(key, {"n": 0, "fb": 0, "bb": 0, "fa": 0, "ba": 0, "names": []})
        k["n"] += 1
        members = [x for x in rows if x["change"] == "in group " + r["layer"]]
        k["fb"] += r["fwd_before"] + sum(x["fwd_before"] for x in members)
        k["bb"] += r["bwd_before"] + sum(x["bwd_before"] for x in members)
        k["fa"] += r["fwd_after"]
        k["ba"] += r["bwd_after"]
        if "dw_fwd" in r:  # the depthwise step: the old kernels' estimate, the new floor
            k["fb"] += r["dw_old_fwd_s"] * BW
            k["bb"] += r["dw_old_bwd_s"] * BW
            k["fa"] += r["dw_fwd"]
            k["ba"] += r["dw_bwd"]
        k["names"].append(r["layer"])
    out.append("| change (timed at the layer named) | output | layers | fwd before -> after (us) | bwd before -> after (us) | e.g. |")
    out.append("|---|---|---|---|---|---|")
    for (kind, shape), k in kinds.items():
        out.append("| %s | %s | %d | %.0f -> %.0f | %.0f -> %.0f | %s |"
                   % (kind, shape, k["n"], us(k["fb"]), us(k["fa"]), us(k["bb"]), us(k["ba"]),
                      k["names"][0]))
    out.append("")


def main():
    global BW
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--mgtrain", default="build/mgtrain")
    ap.add_argument("--input-shape", default="224,224,3")
    ap.add_argument("--batch", default="32,256")
    ap.add_argument("--bw", type=float, default=4.3e12,
                    help="bytes per second: what a large device-to-device copy reaches (H200: "
                         "4.3e12, H100: 3.0e12)")
    ap.add_argument("--lane-rate", type=float, default=132 * 128 * 1.75e9,
                    help="instructions per second over all lanes (H100 SXM: 132 SMs x 128 "
                         "lanes x 1.75 GHz)")
    ap.add_argument("--csv", help="every layer's figures as CSV")
    a = ap.parse_args()
    BW = a.bw
    out, allrows = [], []
    for cfg in a.models:
        name = os.path.splitext(os.path.basename(cfg))[0]
        keys_src = parse_cfg(cfg)
        for b in (int(v) for v in a.batch.split(",")):
            layers = summary(a.mgtrain, cfg, a.input_shape, b)
            rows = predict(layers, layer_keys(keys_src, layers), b, a.lane_rate)
            report(name, rows, b, out)
            for r in rows:
                allrows.append(dict(model=name, batch=b, **r))
    print("\n".join(out))
    if a.csv:
        fields = ["model", "batch", "layer", "type", "shape", "change", "fwd_before",
                  "bwd_before", "fwd_after", "bwd_after", "bf16_fwd_before", "bf16_bwd_before",
                  "dw_fwd", "dw_bwd", "dw_old_fwd_s", "dw_old_bwd_s"]
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            for r in allrows:
                w.writerow(r)


if __name__ == "__main__":
    main()
