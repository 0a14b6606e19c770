#!/usr/bin/env bash
# labels: cli
# timeout: 300
# cores: 1
# mgtrain plot RUN: curves.png from a 3-epoch run is an 1800x500 PNG with the train and
# validation lines in the loss and accuracy panels and the learning rate in the third; with
# per-step rows (--log-every) the per-step curves too, and the rate per step; a metrics.csv of
# an older run (no lr column) gets its two panels; a folder without metrics fails with a clear
# message.
source "$(dirname "$0")/lib.bash"

mpi 2 --data synthetic --synthetic-samples 3000 --epochs 3 --out run --verbose 2 >train.log 2>&1 \
  || { bad "3-epoch training failed"; cat train.log; }
[ "$(grep -c '^Epoch [1-3]/3 -' train.log)" = 3 ] && ok "3 epoch lines" || { bad "not 3 epoch lines"; cat train.log; }
[ "$(wc -l <run/metrics.csv)" = 4 ] && ok "metrics.csv: header and 3 rows" || { bad "metrics.csv:"; cat run/metrics.csv; }
mpi 2 --data synthetic --synthetic-samples 3000 --epochs 3 --log-every 2 --lr-schedule cosine --out steps \
  --verbose 0 >steps.log 2>&1 || { bad "3-epoch training with --log-every"; cat steps.log; }
python3 -c 'import json; j = json.load(open("run/run.json")); exit((j["model"], j["world"], j["global_batch"]) != ("mlp", 2, 256))' \
  && ok "run.json names model, world and global batch (the plot's title)" || { bad "run.json:"; cat run/run.json; }

"$MGT_BIN" plot run >plot.log 2>&1; rc=$?
[ $rc -eq 0 ] && ok "mgtrain plot run exits 0" || { bad "mgtrain plot: exit $rc"; cat plot.log; }
grep -q 'wrote run/curves.png' plot.log && ok "says where it wrote" || { bad "plot output:"; cat plot.log; }
grep -qi 'warning' plot.log && { bad "gnuplot warnings:"; cat plot.log; } || ok "no gnuplot warnings"
png=run/curves.png
if [ -s "$png" ]; then
  ok "curves.png exists"
  magic=$(od -An -tx1 -N8 "$png" | tr -d ' \n')
  [ "$magic" = 89504e470d0a1a0a ] && ok "PNG signature" || bad "not a PNG: $magic"
  [ "$(od -An -c -j12 -N4 "$png" | tr -d ' \n')" = IHDR ] && ok "IHDR chunk first" || bad "no IHDR chunk first"
  read -r w0 w1 w2 w3 h0 h1 h2 h3 < <(od -An -tu1 -j16 -N8 "$png")
  w=$(( (w0 << 24) | (w1 << 16) | (w2 << 8) | w3 )) h=$(( (h0 << 24) | (h1 << 16) | (h2 << 8) | h3 ))
  [ "$w" = 1800 ] && [ "$h" = 500 ] && ok "1800x500 pixels" || bad "size ${w}x${h}, want 1800x500"
  size=$(stat -c %s "$png")
  [ "$size" -gt 15000 ] && [ "$size" -lt 2000000 ] && ok "$size bytes" || bad "$size bytes: too small or too big for two panels of curves"
else
  bad "no run/curves.png"
fi
ls -a run | grep tmp >/dev/null && bad "temporary file left: $(ls -a run)" || ok "no temporary file left"

# The pixels: gnuplot's first two line colours (train dark violet #9400d3, validation #009e73)
# in the loss and accuracy panels, the train colour in the rate's (the rate at each epoch's end),
# per-step curves (light violet #cfa3ef) only where the run logged steps, and a mostly white
# background.
pixels() { # pixels PNG PANELS STEPS(0|1)
  python3 - "$@" <<'EOF'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
pos, idat, hdr = 8, b"", None
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR": hdr = struct.unpack(">IIBBBBB", body)
    if kind == b"IDAT": idat += body
    pos += 12 + n
w, h, depth, ctype = hdr[:4]
panels, steps = int(sys.argv[2]), int(sys.argv[3])
assert depth == 8 and ctype in (2, 6), f"unexpected PNG format: depth {depth}, colour type {ctype}"
bpp = 3 if ctype == 2 else 4
raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line); prev = line
def count(x0, x1, rgb, y0=0, y1=h):
    return sum(1 for y in range(y0, y1) for x in range(x0, x1)
               if tuple(rows[y][x * bpp:x * bpp + 3]) == rgb)
white = count(0, w, (255, 255, 255))
print(f"white {white / (w * h):.2f}")
bad = 0
names = ["loss", "accuracy", "learning rate"][:panels]
for i, name in enumerate(names):
    x0, x1 = i * w // panels, (i + 1) * w // panels
    lines = [("train", (0x94, 0x00, 0xd3)), ("validation", (0x00, 0x9e, 0x73))]
    if name == "learning rate":   # per step where logged, else per epoch
        lines = [("per step", (0xcf, 0xa3, 0xef))] if steps else lines[:1]
    elif steps:
        lines.append(("per step", (0xcf, 0xa3, 0xef)))
    for line, rgb in lines:
        n = count(x0, x1, rgb, 0, h * 4 // 5)  # above the key, which is below the panels
        print(f"{name} {line} {n}")
        bad += n < 200
    if not steps:
        n = count(x0, x1, (0xcf, 0xa3, 0xef), 0, h * 4 // 5)
        bad += n > 0
sys.exit(1 if bad or white < 0.7 * w * h else 0)
EOF
}
if command -v python3 >/dev/null; then
  pixels "$png" 3 0 >pixels.log 2>&1
  if [ $? -eq 0 ]; then ok "the panels draw train and validation lines, and the rate ($(tr '\n' ' ' <pixels.log))"
  else bad "pixels: $(tr '\n' ' ' <pixels.log)"; fi
  "$MGT_BIN" plot steps >/dev/null 2>&1 || bad "plot of the run with per-step rows"
  pixels steps/curves.png 3 1 >pixels2.log 2>&1 \
    && ok "with --log-every: per-step curves behind the epoch lines, the rate per step ($(tr '\n' ' ' <pixels2.log))" \
    || bad "per-step pixels: $(tr '\n' ' ' <pixels2.log)"
  # An older run's metrics.csv, without the lr column: the two panels it has.
  mkdir old && cut -d, -f1-8 run/metrics.csv >old/metrics.csv
  "$MGT_BIN" plot old >/dev/null 2>&1 && pixels old/curves.png 2 0 >pixels3.log 2>&1 \
    && [ "$(od -An -tu1 -j16 -N4 old/curves.png | awk '{print ($1*16777216)+($2*65536)+($3*256)+$4}')" = 1200 ] \
    && ok "a metrics.csv without lr: two panels, 1200 pixels wide" || bad "old metrics.csv: $(tr '\n' ' ' <pixels3.log)"
else
  bad "python3 is missing: cannot look at the pixels"
fi

# A second plot replaces the first.
"$MGT_BIN" plot run >/dev/null 2>&1 && [ -s "$png" ] && ok "plotting again works" || bad "second plot failed"

mkdir empty
expect_fail "plot of a folder without metrics" "empty/metrics.csv: No such file or directory; pass the --out folder of a training run" "$MGT_BIN" plot empty
[ -e empty/curves.png ] && bad "a curves.png appeared in the empty folder" || ok "nothing written to the empty folder"
expect_fail "plot of a missing folder" "nope/metrics.csv: No such file or directory" "$MGT_BIN" plot nope
mkdir junk && printf 'this is not\na metrics file\n' >junk/metrics.csv
expect_fail "plot of a file that is not mgtrain's metrics" "gnuplot failed drawing junk/curves.png" "$MGT_BIN" plot junk
ls -a junk | grep -E 'curves|tmp' >/dev/null && bad "files left in junk/: $(ls -a junk)" || ok "nothing left after gnuplot fails"
finish
