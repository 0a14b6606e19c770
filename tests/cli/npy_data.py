"""Writes a learnable image set as a .npy data folder (train_x/train_y/test_x/test_y.npy), for the
.npy tests: npy_data.py DIR H W N_TRAIN N_TEST SEED [float32] [label_scale=K] [label_dtype=D]
[test_label_shape=N1].

The class (0-3) raises the mean of one channel, and the left half of channel 0 is brighter, so a
horizontal flip changes every image. Images are uint8, or float32 = uint8 / 255 computed in
float32 (one correctly rounded division, as mgtrain scales uint8: the same values bit for bit).
Labels are class * K (K > 64 gives labels above 255)."""
import os
import sys

import numpy as np

d, h, w, n, nt, seed = sys.argv[1], *map(int, sys.argv[2:7])
opts = dict(a.split("=") if "=" in a else (a, "1") for a in sys.argv[7:])
rng = np.random.default_rng(seed)


def split(count):
    y = rng.integers(0, 4, count)
    x = rng.integers(0, 160, (count, h, w, 3))
    for k in range(4):
        x[y == k, :, :, k % 3] += 60 + 20 * (k // 3)
    x[:, :, : w // 2, 0] += 40
    x = x.astype(np.uint8)
    if "float32" in opts:
        x = x.astype(np.float32) / np.float32(255)
    return x, (y * int(opts.get("label_scale", 1))).astype(opts.get("label_dtype", "int64"))


os.makedirs(d, exist_ok=True)
x, y = split(n)
xt, yt = split(nt)
if opts.get("test_label_shape") == "N1":
    yt = yt.reshape(-1, 1)  # as Keras' CIFAR-10 gives its labels
for name, a in (("train_x", x), ("train_y", y), ("test_x", xt), ("test_y", yt)):
    np.save(os.path.join(d, name + ".npy"), a)
