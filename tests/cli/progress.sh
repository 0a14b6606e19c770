#!/usr/bin/env bash
# labels: cli
# timeout: 600
# cores: 1
# The console output: a Keras-style progress bar on a terminal (a pseudo-terminal from script),
# only epoch lines in a file or pipe (mpirun's ranks included, which mpirun gives a pty even
# then), nothing at all with --verbose 0 (errors aside), and never more than 10 redraws a second.
source "$(dirname "$0")/lib.bash"
command -v script >/dev/null || { bad "script (util-linux) is missing"; finish; exit 1; }

# One epoch of 118 steps: long enough for several redraws.
RUN="--data synthetic --synthetic-samples 30000"
BAR='[0-9]+/[0-9]+ \[=*>?\.*\] - ETA: [0-9]+s - loss: [0-9]+\.[0-9]{4} - acc: [0-9]+\.[0-9]{4}'
EPOCH='^Epoch 1/1 - [0-9]+s - loss: [0-9]+\.[0-9]{4} - acc: [0-9]+\.[0-9]{4}( - top5_acc: [0-9.]+)? - val_loss: [0-9.]+ - val_acc: [0-9.]+'
on_pty() { # on_pty OUT CMD: run CMD (a string) with stdout on a pseudo-terminal, output in OUT
  local out=$1; shift
  timeout 300 script -qfec "$1" /dev/null >"$out" 2>&1
}
# The epoch line, with the pty's \r\n endings and the bar's "\r\033[K" before it removed.
lines() { sed -e 's/\r$//' -e 's/.*\r\x1b\[K//' "$1"; }
# redraws FILE: number of bar draws; train_s FILE: seconds of training from the last line.
redraws() { grep -o 'ETA:' "$1" | wc -l; }
train_s() { sed -n 's/.*Trained [0-9]* steps in \([0-9.]*\) s.*/\1/p' "$1" | tail -1; }
check_rate() { # check_rate NAME FILE: at most 10 redraws a second of training (+2: first, last)
  local n s; n=$(redraws "$2"); s=$(train_s "$2")
  if [ -z "$s" ]; then bad "$1: no 'Trained ... in S s' line"; return; fi
  if awk -v n="$n" -v s="$s" 'BEGIN { exit !(n <= 10 * s + 2 && n >= 2) }'; then
    ok "$1: $n redraws in $s s of training (at most 10 a second)"
  else bad "$1: $n redraws in $s s of training (want 2 to 10*s+2)"; fi
}

# 1. On a terminal: mgtrain straight under script (its parent, script, is not on a terminal).
on_pty tty.out "$MGT_BIN $RUN --out a"
rc=$?
[ $rc -eq 0 ] && ok "training on a pty exits 0" || { bad "training on a pty: exit $rc"; cat tty.out; }
grep -qE "$BAR" tty.out && ok "pty: Keras-style bar ($(grep -oE "$BAR" tty.out | tail -1))" || { bad "pty: no progress bar"; cat -A tty.out | head -20; }
# full: 30 cells, fewer at 80 columns where the line also holds top5_acc (10 classes)
grep -qE '118/118 \[={10,30}\]' tty.out && ok "pty: the bar ends at 118/118, full" || bad "pty: no final 118/118 bar"
grep -q '^Epoch 1/1' tty.out && ok "pty: 'Epoch 1/1' header before the bar" || bad "pty: no epoch header"
lines tty.out | grep -E "$EPOCH" >/dev/null && ok "pty: epoch line" || { bad "pty: no epoch line"; cat -A tty.out | tail -5; }
check_rate "pty" tty.out

# 2. On a terminal with a shell as the parent (the interactive case).
on_pty sh.out "bash -c '$MGT_BIN $RUN --out b; rc=\$?; exit \$rc'"
grep -qE "$BAR" sh.out && ok "pty under a shell: bar" || { bad "pty under a shell: no bar"; cat -A sh.out | head; }
lines sh.out | grep -E "$EPOCH" >/dev/null && ok "pty under a shell: epoch line" || bad "pty under a shell: no epoch line"

# 3. Through a pipe: epoch lines only.
"$MGT_BIN" $RUN --out c 2>&1 | cat >pipe.out
grep -q 'ETA:' pipe.out && bad "pipe: a progress bar in a pipe" || ok "pipe: no bar"
grep -q $'\r' pipe.out && bad "pipe: carriage returns in a pipe" || ok "pipe: no carriage returns"
grep -qE "$EPOCH" pipe.out && ok "pipe: epoch line" || { bad "pipe: no epoch line"; cat pipe.out; }

# 4. --verbose 0: nothing at all, as Keras' verbose=0 (pipe and terminal); errors would still show.
"$MGT_BIN" $RUN --out d --verbose 0 2>&1 | cat >quiet.out
[ ! -s quiet.out ] && ok "--verbose 0: nothing at all, as Keras' verbose=0" ||
  { bad "--verbose 0 prints (it should print nothing but errors):"; cat quiet.out; }
on_pty quiet_tty.out "$MGT_BIN $RUN --out d2 --verbose 0"
[ ! -s quiet_tty.out ] && ok "--verbose 0 on a pty: nothing at all" ||
  { bad "--verbose 0 on a pty prints:"; cat quiet_tty.out; }
[ -s d/metrics.csv ] && ok "--verbose 0 still writes metrics.csv" || bad "--verbose 0: no metrics.csv"

# 5. --verbose 2 on a terminal: epoch lines, no bar.
on_pty v2.out "$MGT_BIN $RUN --out e --verbose 2"
grep -q 'ETA:' v2.out && bad "--verbose 2 on a pty draws a bar" || ok "--verbose 2 on a pty: no bar"
lines v2.out | grep -E "$EPOCH" >/dev/null && ok "--verbose 2 on a pty: epoch line" || bad "--verbose 2 on a pty: no epoch line"

# 6. mpirun -np 2 with its stdout in a file: mpirun gives the ranks a pty all the same; no bar.
mpi 2 $RUN --out f >mpi_file.out 2>&1 || { bad "mpirun -np 2 to a file failed"; cat mpi_file.out; }
grep -q 'world: 2 ranks' mpi_file.out && ok "mpirun to a file: 2 ranks" || bad "mpirun to a file: no 2-rank start-up block"
grep -q 'ETA:' mpi_file.out && bad "mpirun to a file: progress bar in the file" || ok "mpirun to a file: no bar"
grep -qE "$EPOCH" mpi_file.out && ok "mpirun to a file: epoch line" || { bad "mpirun to a file: no epoch line"; cat mpi_file.out; }
[ "$(grep -c '^Epoch 1/1 -' mpi_file.out)" = 1 ] && ok "mpirun to a file: one epoch line (rank 0 only)" || bad "mpirun to a file: $(grep -c '^Epoch 1/1 -' mpi_file.out) epoch lines"

# 7. mpirun -np 2 on a terminal: the bar, at the same rate.
on_pty mpi_tty.out "timeout 300 mpirun --oversubscribe --bind-to none -np 2 $MGT_BIN $RUN --out g"
grep -qE "$BAR" mpi_tty.out && ok "mpirun on a pty: bar" || { bad "mpirun on a pty: no bar"; cat -A mpi_tty.out | head -20; }
lines mpi_tty.out | grep -E "$EPOCH" >/dev/null && ok "mpirun on a pty: epoch line" || bad "mpirun on a pty: no epoch line"
check_rate "mpirun on a pty" mpi_tty.out
finish
