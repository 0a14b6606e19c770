#!/usr/bin/env bash
# labels: cli
# cores: 1
# The values --help names as defaults are accepted as values: --max-steps 0 (no limit),
# --save-every 0 (epoch ends only), --debug-check 0 (off) train exactly as without the flag.
source "$(dirname "$0")/lib.bash"
run=(--data synthetic --synthetic-samples 512 --batch-size 128 --no-validation --verbose 2)
"$MGT_BIN" "${run[@]}" --out plain >plain.log 2>&1 || { bad "plain run"; tail -3 plain.log; }
help=$("$MGT_BIN" --help)
for f in "max-steps 0 (no limit)" "save-every 0 (epoch ends only)" "debug-check 0 (off)"; do
  name=${f%% *}; rest=${f#* }
  grep -q -- "--$name .*(default: $rest)" <<<"$help" || bad "--help does not give --$name's default as $rest"
  "$MGT_BIN" "${run[@]}" --$name 0 --out z-$name >z-$name.log 2>&1 \
    && grep -q "Trained 4 steps" z-$name.log \
    && ok "--$name 0 is accepted and means the default (4 steps, as without it)" \
    || { bad "--$name 0"; tail -3 z-$name.log; }
  same "--$name 0: the same weights as without it" z-$name/weights.safetensors plain/weights.safetensors 0
done
expect_fail "--max-steps -1 is refused" "--max-steps -1: expected a whole number of at least 0" \
  "$MGT_BIN" "${run[@]}" --max-steps -1 --out neg
finish
