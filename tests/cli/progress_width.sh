#!/usr/bin/env bash
# labels: cli
# timeout: 600
# cores: 1
# The progress bar fits the terminal: on a pseudo-terminal of a given width every redraw of the
# bar (the text between two carriage returns) is shorter than the width, so the terminal never
# wraps it (a wrapped bar scrolls a line per redraw, which "\r" cannot undo). The width comes
# from COLUMNS (script -c, and mpirun -x COLUMNS for the ranks), or from the terminal itself
# (Python's pty with its window size set, COLUMNS unset). The bar says "validating" while the
# epoch's validation runs, and with --max-steps it ends at the run's last step, full.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/regime.bash"
command -v script >/dev/null || { bad "script (util-linux) is missing"; finish; exit 1; }
RUN="--data synthetic --synthetic-samples 30000" # 118 steps an epoch
# draws FILE WIDTH: every bar draw in FILE must be shorter than WIDTH; prints the longest draw
draws() {
  "$PY" - "$1" "$2" <<'PY'
import re, sys
text = open(sys.argv[1], "rb").read().decode()
text = re.sub(r"\x1b\[K", "", text)
parts = [p for p in re.split(r"[\r\n]+", text) if "ETA:" in p or "validating" in p or re.match(r" *\d+/\d+ ", p)]
assert parts, "no bar drawn"
longest = max(parts, key=len)
assert len(longest) < int(sys.argv[2]), f"{len(longest)} characters: {longest!r}"
print(f"{len(parts)} draws, the longest {len(longest)} characters: {longest!r}")
PY
}

for cols in 50 72 120; do
  COLUMNS=$cols timeout 300 script -qfec "$MGT_BIN $RUN --out w$cols" /dev/null >w$cols.out 2>&1 \
    || { bad "training on a pty ($cols columns)"; tail -3 w$cols.out; continue; }
  out=$(draws w$cols.out $cols) && ok "COLUMNS=$cols: $out" || bad "COLUMNS=$cols: $out"
done
grep -q 'validating' w72.out && ok "the bar says 'validating' during validation" || bad "no 'validating'"
grep -qE '118/118 \[={30}\] - ETA: 0s - loss: [0-9.]+ - acc: [0-9.]+' w120.out \
  && ok "120 columns: Keras' full line" || bad "120 columns: no full line"

# The terminal's own width (COLUMNS unset): a pty whose window is 64 columns.
if "$PY" - "$MGT_BIN" >pty.out 2>&1 <<'PY'; then
import fcntl, os, pty, struct, sys, termios
os.environ.pop("COLUMNS", None)
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], "--data", "synthetic", "--synthetic-samples", "30000", "--out", "p64"])
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 64, 0, 0))
out = b""
while True:
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
_, status = os.waitpid(pid, 0)
open("p64.out", "wb").write(out)
sys.exit(os.waitstatus_to_exitcode(status))
PY
  out=$(draws p64.out 64) && ok "a 64-column pty, COLUMNS unset: $out" || bad "64-column pty: $out"
else bad "training on a 64-column pty: $(tail -3 pty.out)"; fi

# --max-steps 20 inside the 118-step epoch: the bar runs to 20/20.
COLUMNS=100 timeout 300 script -qfec "$MGT_BIN $RUN --max-steps 20 --out m" /dev/null >m.out 2>&1
grep -qE '20/20 \[={30}\]' m.out && ! grep -q '/118 ' m.out && ok "--max-steps 20: the bar counts to 20/20" \
  || bad "--max-steps 20: $(tr '\r' '\n' <m.out | grep -E '/[0-9]+ \[' | tail -2)"

# Two ranks under mpirun on a pty: the ranks get COLUMNS through -x.
COLUMNS=60 timeout 300 script -qfec "mpirun --oversubscribe --bind-to none -x COLUMNS -np 2 $MGT_BIN $RUN --out mp" \
  /dev/null >mp.out 2>&1 || { bad "mpirun on a pty"; tail -3 mp.out; }
out=$(draws mp.out 60) && ok "mpirun -np 2, COLUMNS=60: $out" || bad "mpirun, COLUMNS=60: $out"
finish
