"""images_data.py: image trees for tests/cli/images.sh, and Pillow references for what mgtrain
convert stores and what an image set's transforms give.

  images_data.py tree DIR CLASSES PER_CLASS SEED [--odd]
      a learnable tree: DIR/<class>/NNN.{jpg,png}; class k's images show a disc of hue k/CLASSES
      on a noisy background of random size and aspect (landscape, portrait, square, smaller and
      larger than 256). --odd adds the unusual encodings Pillow reads: greyscale JPEG and PNG,
      CMYK JPEG, progressive JPEG, palette, 16-bit, grey+alpha, RGBA and interlaced PNG.
  images_data.py stored DST SPLIT SRC SIZE
      every file of SRC in torchvision's order, decoded and converted to RGB by Pillow, resized
      by torchvision's Resize(SIZE) rule (short side SIZE, long side int(SIZE * long / short)) with
      Image.BILINEAR, centre-cropped (CenterCrop's rounding) to SIZE: the shards of DST's SPLIT
      must hold exactly these bytes, and the labels the classes' sorted positions.
  images_data.py evalorig DST SPLIT SRC DUMP
      DUMP holds evaluation crops of DST's SPLIT (converted from SRC): each must be torchvision's
      Resize + CenterCrop of the original photo, by Pillow, exactly.
  images_data.py crops DST SPLIT DUMP
      DUMP (a folder of tests/tools/mgt_images_dump) holds rows of DST's SPLIT, the crops mgtrain
      drew for them, and what its transform made of them. Checks: (1) the crop and flip of each row against an
      independent reimplementation of torchvision's RandomResizedCrop.get_params fed by the same
      counter-based draws (util.h's SplitMix64 construction, redone here in Python integers);
      (2) each crop resized with Pillow (Image.crop then Image.resize BILINEAR, flipped with
      ImageOps.mirror) equals mgtrain's bytes exactly; (3) the evaluation transform (Resize to
      floor(input / center_crop), CenterCrop) likewise; (4) the normalised values equal
      (x / 255 - mean) / std computed in float32 as torchvision's ToTensor and Normalize do.
"""
import json
import math
import os
import sys

import numpy as np
from PIL import Image, ImageDraw, ImageOps

M64 = (1 << 64) - 1


def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def key3(a, b, c):
    return mix64(mix64(mix64(a) ^ b) ^ c)


def rand64(key, counter):
    return mix64(key ^ mix64(counter))


CROP_PURPOSE = 0x5252435250  # images.c's "RRCRP"


def get_params(h, w, scale, ratio, seed, epoch, row):
    """torchvision.transforms.RandomResizedCrop.get_params, its uniforms from the draws."""
    key = key3(seed, CROP_PURPOSE, epoch)
    base = row * 64
    flip = rand64(key, base + 40) >> 63
    area = h * w
    lr = (math.log(ratio[0]), math.log(ratio[1]))
    for t in range(10):
        d = base + 4 * t
        u1 = (rand64(key, d) >> 11) / 2.0 ** 53
        u2 = (rand64(key, d + 1) >> 11) / 2.0 ** 53
        target = area * (scale[0] + (scale[1] - scale[0]) * u1)
        aspect = math.exp(lr[0] + (lr[1] - lr[0]) * u2)
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            top = (rand64(key, d + 2) * (h - ch + 1)) >> 64
            left = (rand64(key, d + 3) * (w - cw + 1)) >> 64
            return top, left, ch, cw, flip
    in_ratio = w / h
    if in_ratio < min(ratio):
        cw, ch = w, int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        ch, cw = h, int(round(h * max(ratio)))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw, flip


def make_tree(root, classes, per_class, seed, odd):
    rng = np.random.default_rng(seed)
    sizes = [(320, 240), (240, 320), (300, 300), (180, 120), (97, 143), (512, 384), (64, 400)]
    for k in range(classes):
        d = os.path.join(root, f"class_{k:02d}")
        os.makedirs(d, exist_ok=True)
        hue = k / classes
        for i in range(per_class):
            w, h = sizes[int(rng.integers(len(sizes)))]
            bg = rng.integers(0, 256, (h, w, 3), dtype=np.uint8) // 2 + 64
            img = Image.fromarray(bg, "RGB")
            rgb = tuple(int(255 * c) for c in hsv(hue))
            r = min(w, h) * (0.3 + 0.15 * rng.random())
            cx, cy = w * (0.35 + 0.3 * rng.random()), h * (0.35 + 0.3 * rng.random())
            ImageDraw.Draw(img).ellipse([cx - r, cy - r, cx + r, cy + r], fill=rgb)
            name = os.path.join(d, f"{i:03d}")
            if i % 3 == 2:
                img.save(name + ".png")
            else:
                img.save(name + ".jpg", quality=int(rng.integers(70, 96)))
    if not odd:
        return
    d = os.path.join(root, "class_00")
    base = Image.open(os.path.join(d, "000.jpg")).convert("RGB")
    base.convert("L").save(os.path.join(d, "odd_grey.jpg"))
    base.convert("L").save(os.path.join(d, "odd_grey.png"))
    base.convert("CMYK").save(os.path.join(d, "odd_cmyk.jpg"))
    base.save(os.path.join(d, "odd_progressive.jpg"), progressive=True)
    base.convert("P", palette=Image.ADAPTIVE, colors=64).save(os.path.join(d, "odd_palette.png"))
    base.convert("LA").save(os.path.join(d, "odd_greyalpha.png"))
    base.convert("RGBA").save(os.path.join(d, "odd_rgba.png"))
    save_interlaced_png(os.path.join(d, "odd_interlaced.png"), np.asarray(base))
    a16 = (np.asarray(base).astype(np.uint16) * 257 + 128)
    Image.fromarray(a16[:, :, 0], "I;16").save(os.path.join(d, "odd_grey16.png"))
    # a sub-folder, in torchvision's order after the folder's own files
    os.makedirs(os.path.join(d, "sub"), exist_ok=True)
    base.resize((150, 200)).save(os.path.join(d, "sub", "nested.jpg"))


def save_interlaced_png(path, a):
    """An Adam7-interlaced RGB PNG, written here: Pillow ignores interlace=1 when it saves."""
    import struct
    import zlib
    h, w = a.shape[:2]
    raw = b""
    for y0, x0, dy, dx in ((0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2),
                           (0, 1, 2, 2), (1, 0, 2, 1)):
        sub = a[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\0" + row.tobytes() for row in sub)

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    with Image.open(path) as im:  # the file is what it claims
        assert im.info.get("interlace") == 1 and np.array_equal(np.asarray(im), a)


def hsv(h):
    i = int(h * 6) % 6
    f = h * 6 - int(h * 6)
    return [(1, f, 0), (1 - f, 1, 0), (0, 1, f), (0, 1 - f, 1), (f, 0, 1), (1, 0, 1 - f)][i]


def files_of(src):
    """torchvision's ImageFolder order (make_dataset): classes sorted, os.walk roots sorted,
    file names sorted; names starting with '.' left out as mgtrain does."""
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir() and not e.name.startswith("."))
    out = []
    for k, c in enumerate(classes):
        for root, dirs, names in sorted(os.walk(os.path.join(src, c), followlinks=True)):
            dirs[:] = [x for x in dirs if not x.startswith(".")]
            if any(p.startswith(".") for p in os.path.relpath(root, src).split(os.sep)):
                continue
            for n in sorted(names):
                if not n.startswith("."):
                    out.append((os.path.join(root, n), k))
    return classes, out


# How the references resize: Pillow's own resize, or (ORDER "h" / "v") its two passes run one at a
# time in that order. Pillow up to 12 runs the horizontal pass first, as mgtrain does; Pillow 13
# runs the vertical one first for some sizes (its Resample.c chooses), which rounds the
# intermediate bytes differently. With --pass-order (the check against PyPI's current Pillow) an
# image that differs from Pillow's is accepted only where mgtrain's bytes are Pillow's horizontal-
# first ones and Pillow's own are its vertical-first ones: the same arithmetic, the passes in the
# other order.
ORDER = None


def resize(img, size, box=None):
    size = tuple(size)
    box = tuple(box) if box is not None else (0, 0) + img.size
    if ORDER is None:
        return img.resize(size, Image.BILINEAR, box=box)
    (w, h), (x0, y0, x1, y1) = size, box
    if ORDER == "h":
        t = img.resize((w, img.size[1]), Image.BILINEAR, box=(x0, 0, x1, img.size[1]))
        return t.resize(size, Image.BILINEAR, box=(0, y0, w, y1))
    t = img.resize((img.size[0], h), Image.BILINEAR, box=(0, y0, img.size[0], y1))
    return t.resize(size, Image.BILINEAR, box=(x0, 0, x1, h))


def same_or_pass_order(ours, make):
    """Whether ours equals make()'s reference: exactly, or (--pass-order) up to the order of
    Pillow's two passes. Returns (ok, by_order: the reference differed only in its order)."""
    global ORDER
    ref = np.asarray(make())
    if ref.shape == ours.shape and np.array_equal(ref, ours):
        return True, False
    if not PASS_ORDER:
        return False, False
    try:
        ORDER = "h"
        mine = np.asarray(make())
        ORDER = "v"
        theirs = np.asarray(make())
    finally:
        ORDER = None
    return np.array_equal(mine, ours) and np.array_equal(theirs, ref), True


PASS_ORDER = "--pass-order" in sys.argv


def resize_short(img, size):
    """torchvision's Resize(size) on a PIL image, then CenterCrop(size)."""
    w, h = img.size
    if w <= h:
        nw, nh = size, int(size * h / w)
    else:
        nw, nh = int(size * w / h), size
    img = resize(img, (nw, nh))
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def pil_rgb(path):
    return Image.open(path).convert("RGB")


def resize_whole(img, size):
    """The whole layout: torchvision's Resize(size) where the short side is longer, else as is."""
    w, h = img.size
    if min(w, h) <= size:
        return img
    if w <= h:
        nw, nh = size, int(size * h / w)
    else:
        nw, nh = int(size * w / h), size
    return resize(img, (nw, nh))


def load_set(dst, split):
    """The stored images of DST's SPLIT (a list of arrays), their labels, and the manifest."""
    man = json.load(open(os.path.join(dst, "images.json")))
    xs, ys = [], []
    for s in man["splits"][split]["shards"]:
        base = os.path.join(dst, s["name"])
        x = np.load(base + "_x.npy", mmap_mode="r")
        if man.get("layout") == "whole":
            for off, h, w, _, _ in np.load(base + "_i.npy"):
                xs.append(np.asarray(x[off:off + h * w * 3]).reshape(h, w, 3))
        else:
            xs += [np.asarray(v) for v in x]
        ys.append(np.load(base + "_y.npy"))
    return xs, np.concatenate(ys), man


def check_stored(dst, split, src, size):
    x, y, man = load_set(dst, split)
    whole = man.get("layout") == "whole"
    classes, files = files_of(src)
    listed = open(os.path.join(dst, "classes.txt")).read().split("\n")[:-1]
    ok = listed == classes
    print(("ok" if ok else "FAIL") + f": classes.txt lists the {len(classes)} sorted folders")
    skipped = set()
    sk = os.path.join(dst, split + "_skipped.txt")
    if os.path.exists(sk):
        skipped = {line.split(": ")[0] for line in open(sk)}
    kept = [(p, k) for p, k in files if p not in skipped]
    if len(kept) != len(x):
        print(f"FAIL: {len(x)} stored images, {len(kept)} files kept")
        return 1
    bad = order = 0
    for i, (p, k) in enumerate(kept):
        img = pil_rgb(p)
        same, by_order = same_or_pass_order(
            x[i], lambda: resize_whole(img, size) if whole else resize_short(img, size))
        order += same and by_order
        if not same or y[i] != k:
            ref = np.asarray(resize_whole(img, size) if whole else resize_short(img, size))
            diff = np.abs(ref.astype(int) - x[i].astype(int)).max() if ref.shape == x[i].shape else -1
            print(f"FAIL: {p}: stored image differs from Pillow's (max |diff| {diff}, shapes "
                  f"{ref.shape} {x[i].shape}), label {y[i]} vs {k}")
            bad += 1
    what = (f"Resize({size}) where the short side is longer" if whole
            else f"Resize({size}) + CenterCrop({size})")
    print(("ok" if bad == 0 and ok else "FAIL") +
          f": {len(kept)} stored images equal Pillow {Image.__version__}'s decode + {what} byte "
          f"for byte, labels the folders' positions" +
          (f" ({order} only up to the order of Pillow's two passes)" if PASS_ORDER else ""))
    return 0 if bad == 0 and ok else 1


def stored_images(dst, split):
    return load_set(dst, split)[0]


def check_crops(dst, split, dump):
    meta = json.load(open(os.path.join(dump, "meta.json")))
    rows = np.load(os.path.join(dump, "rows.npy"))
    x, xn = np.load(os.path.join(dump, "x.npy")), np.load(os.path.join(dump, "norm.npy"))
    crops = np.load(os.path.join(dump, "crops.npy"))
    stored, _, man = load_set(dst, split)
    whole = man.get("layout") == "whole"
    seed, epoch, train = meta["seed"], meta["epoch"], meta["train"]
    scale, ratio = tuple(meta["scale"]), tuple(meta["ratio"])
    mean = np.array(meta["mean"], np.float32)
    std = np.array(meta["std"], np.float32)
    h, w = x.shape[1], x.shape[2]
    fails = order = 0
    for i, r in enumerate(rows):
        img = Image.fromarray(np.asarray(stored[r]))
        sh, sw, oh, ow = (int(v) for v in crops[i][5:9])
        if (sh, sw) != img.size[::-1]:
            print(f"FAIL: row {r}: stored sides {sh} x {sw}, the set's {img.size[::-1]}")
            fails += 1
            continue
        if train:
            # torchvision's crop of the original (oh x ow), onto the stored picture
            want = get_params(oh, ow, scale, ratio, seed, epoch, int(r))
            got = tuple(int(v) for v in crops[i][:5])
            if got != want:
                print(f"FAIL: row {r}: crop {got}, reference {want}")
                fails += 1
                continue
            top, left, ch, cw, flip = want
            fx, fy = sw / ow, sh / oh
            box = (left * fx, top * fy, (left + cw) * fx, (top + ch) * fy)
            c = (math.floor(box[0]), math.floor(box[1]), math.ceil(box[2]), math.ceil(box[3]))

            def make(img=img, c=c, box=box, flip=flip):
                ref = resize(img.crop(c), (w, h),
                             box=(box[0] - c[0], box[1] - c[1], box[2] - c[0], box[3] - c[1]))
                return ImageOps.mirror(ref) if flip else ref
        else:
            side = max(math.floor(max(h, w) / meta["center_crop"] + 1e-9), max(h, w))
            if (oh, ow) == (sh, sw) and not whole:  # square: the stored square to side x side
                rw = rh = side
            elif ow <= oh:  # torchvision's Resize(side) of the original
                rw, rh = side, int(side * oh / ow)
            else:
                rw, rh = int(side * ow / oh), side
            top, left = int(round((rh - h) / 2.0)), int(round((rw - w) / 2.0))

            def make(img=img, rw=rw, rh=rh, top=top, left=left):
                return resize(img, (rw, rh)).crop((left, top, left + w, top + h))
        ours = np.rint(x[i] * 255).astype(np.uint8)
        same, by_order = same_or_pass_order(ours, make)
        order += same and by_order
        ref = ours if same else np.asarray(make())
        # ToTensor: bytes / 255 in float32; Normalize: (t - mean) / std in float32
        t = ref.astype(np.float32) / np.float32(255)
        if not np.array_equal(t, x[i]):
            diff = np.abs(np.rint(x[i] * 255).astype(int) - ref.astype(int))
            print(f"FAIL: row {r}: bytes differ from Pillow's in {int((diff > 0).sum())} values "
                  f"(max {int(diff.max())})")
            fails += 1
            continue
        tn = (t - mean) / std
        if not np.array_equal(tn.astype(np.float32), xn[i]):
            print(f"FAIL: row {r}: normalised values differ (max "
                  f"{float(np.abs(tn - xn[i]).max()):.3g})")
            fails += 1
    what = "random-resized crop and flip" if train else "evaluation resize and centre crop"
    flips = int(crops[:, 4].sum()) if train else 0
    print(("ok" if fails == 0 else "FAIL") + f": {what} of {len(rows)} rows ({flips} flipped) "
          f"equal the reference (torchvision's get_params from the same draws, Pillow "
          f"{Image.__version__}'s crop and resize, ToTensor and Normalize in float32)" +
          (f", {order} only up to the order of Pillow's two passes" if PASS_ORDER else ""))
    return 1 if fails else 0


def check_eval_originals(dst, split, src, dump):
    """DUMP holds evaluation crops (TRAIN 0) of DST's SPLIT, converted from SRC: each must be
    torchvision's Resize(side) + CenterCrop(input) of the ORIGINAL photo, by Pillow, exactly (the
    one stored resize is Resize(side) itself when side is the stored size)."""
    meta = json.load(open(os.path.join(dump, "meta.json")))
    rows = np.load(os.path.join(dump, "rows.npy"))
    x = np.rint(np.load(os.path.join(dump, "x.npy")) * 255).astype(np.uint8)
    _, files = files_of(src)
    h, w = x.shape[1], x.shape[2]
    side = max(math.floor(max(h, w) / meta["center_crop"] + 1e-9), max(h, w))
    fails = 0
    for i, r in enumerate(rows):
        img = pil_rgb(files[int(r)][0])
        ow, oh = img.size
        rw, rh = (side, int(side * oh / ow)) if ow <= oh else (int(side * ow / oh), side)
        top, left = int(round((rh - h) / 2.0)), int(round((rw - w) / 2.0))
        same, _ = same_or_pass_order(
            x[i], lambda: resize(img, (rw, rh)).crop((left, top, left + w, top + h)))
        if not same:
            print(f"FAIL: row {r} ({files[int(r)][0]}): differs from Resize({side}) + "
                  f"CenterCrop of the original")
            fails += 1
    print(("ok" if fails == 0 else "FAIL") + f": {len(rows)} evaluation crops equal Pillow "
          f"{Image.__version__}'s Resize({side}) + CenterCrop({h}x{w}) of the original photos")
    return 1 if fails else 0


def main():
    cmd = sys.argv[1]
    if cmd == "tree":
        make_tree(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
                  "--odd" in sys.argv)
        return 0
    if cmd == "stored":
        return check_stored(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    if cmd == "evalorig":
        return check_eval_originals(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    if cmd == "crops":
        return check_crops(sys.argv[2], sys.argv[3], sys.argv[4])
    print("unknown command", cmd)
    return 2


if __name__ == "__main__":
    sys.exit(main())
