#!/usr/bin/env bash
# device_skip: tests/gpu/on-device on a machine without a GPU (this one, CI's) prints exactly
# "SKIPPED: no GPU (<reason>)" and exits 77 without writing anything, for each way a machine can
# lack one (no nvidia-smi; nvidia-smi failing as it does without a driver; nvidia-smi listing
# nothing); and both device scripts answer bad arguments with one clear message and exit 2.
source "$MGT_SRC/tests/cli/lib.bash"
OD=$MGT_SRC/tests/gpu/on-device
PREP=$MGT_SRC/tests/gpu/prepare-device
if command -v nvidia-smi >/dev/null && grep -q '^GPU [0-9]' <<<"$(nvidia-smi -L 2>/dev/null)"; then
  echo "SKIPPED: this machine has a GPU (tests/gpu/on-device would run the whole check)"
  exit 77
fi

# skipped NAME REASON SEARCH_PATH MODE: on-device MODE, run with PATH=SEARCH_PATH, must print only
# "SKIPPED: no GPU (REASON)", exit 77 and leave the output folder uncreated.
skipped() {
  local name=$1 want="SKIPPED: no GPU ($2)" out rc
  out=$(PATH="$3" OUT="$T/out-$name" "$OD" "$4" 2>&1)
  rc=$?
  if [ $rc -eq 77 ] && [ "$out" = "$want" ] && [ ! -e "$T/out-$name" ]; then
    ok "$name: '$out', exit 77, nothing written"
  else
    bad "$name: exit $rc, printed '$out' (wanted '$want'), output folder $([ -e "$T/out-$name" ] && echo created || echo absent)"
  fi
}

# 1. No nvidia-smi at all: a PATH holding everything but it.
mkdir -p "$T/nosmi"
for d in ${PATH//:/ }; do
  for f in "$d"/*; do
    n=$(basename "$f")
    [ "$n" = nvidia-smi ] || [ -e "$T/nosmi/$n" ] || ln -s "$f" "$T/nosmi/$n" 2>/dev/null
  done
done
skipped no-nvidia-smi "nvidia-smi not found" "$T/nosmi" speed

# 2. nvidia-smi present but failing, as on a machine with NVIDIA's utilities and no driver or device.
mkdir -p "$T/fail" "$T/empty"
cat >"$T/fail/nvidia-smi" <<'EOF'
#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
exit 9
EOF
cat >"$T/empty/nvidia-smi" <<'EOF'
#!/bin/sh
exit 0
EOF
chmod +x "$T/fail/nvidia-smi" "$T/empty/nvidia-smi"
skipped failing-nvidia-smi "nvidia-smi -L failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running." "$T/fail:$PATH" truth
skipped empty-nvidia-smi "nvidia-smi lists no GPU" "$T/empty:$PATH" speed

# 3. Bad arguments: one line naming the problem, exit 2, before anything runs.
expect_fail "on-device without a command" "^on-device: which check: speed or truth" "$OD"
expect_fail "on-device with another command" "^on-device: the first argument is speed or truth, not 'all'" "$OD" all
expect_fail "on-device --budget 5" "^on-device: --budget wants whole seconds, at least 60" "$OD" speed --budget 5
expect_fail "on-device --only with a group of the other command" \
  "^on-device: --only: 'gpu_speed' is not a group of truth \(tests, nccl, train, share, wait\)" \
  "$OD" truth --only tests,gpu_speed
expect_fail "on-device with an unknown flag" "^on-device: unknown argument '--fast'" "$OD" speed --fast
expect_fail "on-device --dry-run without the carried folder" \
  "^on-device: $T/none is missing: run tests/gpu/prepare-device" "$OD" truth --dry-run --from "$T/none"
expect_fail "prepare-device --jobs x" "^prepare-device: --jobs wants a positive whole number" "$PREP" --jobs x
expect_fail "prepare-device --dry-run without a build" \
  "^prepare-device: --dry-run stages an existing build: name it with --build-dir" "$PREP" --dry-run
for s in "$OD" "$PREP"; do
  out=$("$s" --help); rc=$?
  [ $rc -eq 0 ] && grep -q "^usage: tests/gpu/$(basename "$s")" <<<"$out" \
    && ok "$(basename "$s") --help" || bad "$(basename "$s") --help: exit $rc"
done
finish
