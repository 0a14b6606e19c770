#!/usr/bin/env python3
"""torch_graph.py: an mgtrain model file built as a PyTorch module, written against PyTorch's own
operators (an independent implementation of every layer), for the cross-checks in
tests/cli/graph_torch.sh and the PyTorch peer of bench/.

    import torch_graph
    m = torch_graph.build("model.cfg")     # nn.Module; m(x) takes NCHW float32, returns logits
    m.load_state_dict(sd, strict=True)     # mgtrain's saved weights, under mgtrain's names

Parameter names are mgtrain's (layer name + "." + tensor), so the module loads mgtrain's
safetensors with strict=True. Semantics follow Keras, as mgtrain's do: "same" padding is
TensorFlow's (total max((ceil(n/s)-1)s + k - n, 0), the odd one at the bottom/right; average
pooling divides by the window's count of real inputs), [flatten] flattens NHWC order, and a
softmax on the last layer is left to the loss (forward returns logits; probabilities are
softmax(logits)). A layer with trainable = false (or named by m.freeze(names), as --freeze
does) is frozen as Keras freezes one: its parameters take no gradient and a batchnorm normalises
with its moving statistics. Only the model-file keys the checked layers use are read; anything else is an
error, so a model the module cannot reproduce is never compared silently."""
import math
import re
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def parse(path):
    """[input] shape (H, W, C) and the layer sections in file order, as (type, {key: value})."""
    shape, layers, cur = None, [], None
    for raw in open(path):
        line = raw.split("#")[0].split(";")[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            cur = {} if m.group(1) not in ("input", "train") else None
            if cur is not None:
                layers.append((m.group(1), cur))
            sec = m.group(1)
            continue
        k, v = (s.strip() for s in line.split("=", 1))
        if sec == "input" and k == "shape":
            shape = tuple(int(s) for s in v.split(","))
        elif cur is not None:
            cur[k] = v
    return shape, layers


def tf_same(n, k, s):
    """TensorFlow's "same" padding of one axis: (before, after)."""
    total = max((math.ceil(n / s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


ACT = {"relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "none": lambda x: x,
       "softmax": lambda x: F.softmax(x, dim=1)}


class Graph(nn.Module):
    def __init__(self, path):
        super().__init__()
        self.in_shape, secs = parse(path)
        self.steps = []  # (kind, name, inputs, settings)
        self.frozen = set()
        shapes = {"input": (self.in_shape[2], self.in_shape[0], self.in_shape[1])}  # C, H, W
        prev = "input"
        for i, (kind, kv) in enumerate(secs):
            name = kv.pop("name", f"{kind}_{i}")
            ins = [s.strip() for s in kv.pop("inputs", kv.pop("input", prev)).split(",")]
            c, h, w = shapes[ins[0]]
            used = set()

            def get(key, default=None, conv=int):
                used.add(key)
                return conv(kv[key]) if key in kv else default

            st = {"act": get("activation", "none", str)}
            if get("trainable", "true", str) == "false":
                self.frozen.add(name)
            if kind in ("conv2d", "depthwise_conv2d", "separable_conv2d"):
                k, s = get("kernel"), get("stride", 1)
                bias = get("use_bias", "true", str) == "true"
                same = get("padding", "valid", str) == "same"
                st["pad"] = tf_same(h, k, s) + tf_same(w, k, s) if same else (0, 0, 0, 0)
                st["stride"] = s
                f = c if kind == "depthwise_conv2d" else get("filters")
                if kind == "conv2d":
                    self.add_module(name, nn.Conv2d(c, f, k, s, bias=bias))
                elif kind == "depthwise_conv2d":
                    self.add_module(name, nn.Conv2d(c, c, k, s, groups=c, bias=bias))
                else:
                    mod = nn.Module()
                    mod.add_module("depthwise", nn.Conv2d(c, c, k, s, groups=c, bias=False))
                    mod.add_module("pointwise", nn.Conv2d(c, f, 1, bias=bias))
                    self.add_module(name, mod)
                h = (h + st["pad"][0] + st["pad"][1] - k) // s + 1
                w = (w + st["pad"][2] + st["pad"][3] - k) // s + 1
                c = f
            elif kind == "batchnorm":
                eps, mom = get("epsilon", 1e-3, float), get("momentum", 0.99, float)
                self.add_module(name, nn.BatchNorm2d(c, eps=eps, momentum=1 - mom))
            elif kind in ("maxpool", "avgpool"):
                k = get("size", 2)
                s = get("stride", k)
                same = get("padding", "valid", str) == "same"
                st["k"], st["stride"] = k, s
                st["pad"] = tf_same(h, k, s) + tf_same(w, k, s) if same else (0, 0, 0, 0)
                h = (h + st["pad"][0] + st["pad"][1] - k) // s + 1
                w = (w + st["pad"][2] + st["pad"][3] - k) // s + 1
            elif kind == "activation":
                st["act"] = get("type", "none", str)
            elif kind == "zeropad":
                p = [int(x) for x in get("pad", conv=str).split(",")]
                p = p * 4 if len(p) == 1 else [p[0], p[0], p[1], p[1]] if len(p) == 2 else p
                st["pad"] = tuple(p)
                h, w = h + p[0] + p[1], w + p[2] + p[3]
            elif kind == "concat":
                c = sum(shapes[n][0] for n in ins)
            elif kind == "global_avgpool":
                h = w = 0
            elif kind == "flatten":
                c, h, w = c * max(h, 1) * max(w, 1), 0, 0
            elif kind == "dense":
                bias = get("use_bias", "true", str) == "true"
                self.add_module(name, nn.Linear(c * max(h, 1) * max(w, 1), get("units"),
                                                bias=bias))
                c, h, w = get("units"), 0, 0
            elif kind != "add":
                raise ValueError(f"{path}: [{kind}] is not built here")
            left = set(kv) - used
            if left:
                raise ValueError(f"{path}: [{kind}] {name}: keys {sorted(left)} are not built here")
            if name in self.frozen:
                self.freeze([name])
            shapes[name] = (c, h, w)
            self.steps.append((kind, name, ins, st))
            prev = name
        # a softmax on the last layer belongs to the loss: forward returns logits
        if self.steps and self.steps[-1][3]["act"] == "softmax":
            self.steps[-1][3]["act"] = "none"

    def freeze(self, names):
        """Freezes the named layers (Keras' layer.trainable = False)."""
        for n in names:
            self.frozen.add(n)
            if hasattr(self, n):
                for p in getattr(self, n).parameters():
                    p.requires_grad_(False)

    def forward(self, x):
        t = {"input": x}
        for kind, name, ins, st in self.steps:
            a = t[ins[0]]
            if kind in ("conv2d", "depthwise_conv2d"):
                y = getattr(self, name)(F.pad(a, (st["pad"][2], st["pad"][3], st["pad"][0],
                                                  st["pad"][1])))
            elif kind == "separable_conv2d":
                mod = getattr(self, name)
                y = mod.pointwise(mod.depthwise(F.pad(a, (st["pad"][2], st["pad"][3],
                                                          st["pad"][0], st["pad"][1]))))
            elif kind == "batchnorm":
                bn = getattr(self, name)
                y = bn(a) if name not in self.frozen else F.batch_norm(
                    a, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
            elif kind == "maxpool":
                p = (st["pad"][2], st["pad"][3], st["pad"][0], st["pad"][1])
                y = F.max_pool2d(F.pad(a, p, value=-math.inf), st["k"], st["stride"])
            elif kind == "avgpool":
                p = (st["pad"][2], st["pad"][3], st["pad"][0], st["pad"][1])
                ones = torch.ones_like(a[:1, :1])
                y = F.avg_pool2d(F.pad(a, p), st["k"], st["stride"]) / F.avg_pool2d(
                    F.pad(ones, p), st["k"], st["stride"])
            elif kind == "zeropad":
                y = F.pad(a, (st["pad"][2], st["pad"][3], st["pad"][0], st["pad"][1]))
            elif kind == "add":
                y = a
                for n in ins[1:]:
                    y = y + t[n]
            elif kind == "concat":
                y = torch.cat([t[n] for n in ins], dim=1)
            elif kind == "global_avgpool":
                y = a.mean(dim=(2, 3))
            elif kind == "flatten":
                y = a.permute(0, 2, 3, 1).flatten(1) if a.dim() == 4 else a
            elif kind == "dense":
                y = getattr(self, name)(a.permute(0, 2, 3, 1).flatten(1) if a.dim() == 4 else a)
            else:
                y = a
            t[name] = ACT[st["act"]](y)
        return t[self.steps[-1][1]]


def build(path):
    return Graph(path)


if __name__ == "__main__":
    m = build(sys.argv[1])
    print(sum(p.numel() for p in m.parameters()), "trainable parameters")
