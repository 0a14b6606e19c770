#!/usr/bin/env bash
# labels: cli
# timeout: 120
# bench/data_larger_than_memory at its smallest (--quick: a 256 MiB memory cgroup, image sets of
# 0.04 and 0.38 GiB stored at 64x64, 20 steps each): both runs train and learn under the limit
# with no OOM kill, the rank's peak resident memory on the set 10x larger stays within a few MiB
# of the small set's, the results are written, and the sets, the model file and the cgroup are
# gone afterwards. Needs root and a memory cgroup controller (skipped otherwise).
source "$(dirname "$0")/lib.bash"
PY=/usr/bin/python3
if ! "$PY" -c "import numpy" 2>/dev/null; then
  echo "SKIPPED: no numpy for $PY (apt-get install python3-numpy)"
  exit 77
fi
if [ "$(id -u)" != 0 ] || ! { [ -e /sys/fs/cgroup/memory/memory.limit_in_bytes ] ||
  grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; }; then
  echo "SKIPPED: needs root and a memory cgroup controller"
  exit 77
fi
mkdir sets res
out=$(timeout 100 "$PY" "$MGT_SRC/bench/data_larger_than_memory" --quick --no-build \
  --build-dir "$(dirname "$MGT_BIN")" --results-dir "$T/res" --tmp "$T/sets" 2>&1)
rc=$?
[ $rc = 0 ] && ok "the bench ran" || { bad "the bench failed ($rc)"; echo "$out" | tail -20; }
for f in md json log; do
  [ -s "res/cpu-data-memory-quick.$f" ] && ok "cpu-data-memory-quick.$f written" ||
    bad "no res/cpu-data-memory-quick.$f"
done
[ -z "$(ls -A sets)" ] && ok "the sets were removed" || bad "left behind: $(ls sets)"
ls -d /sys/fs/cgroup/memory/mgt-bench-memory-* /sys/fs/cgroup/mgt-bench-memory-* 2>/dev/null |
  grep -q . && bad "a bench cgroup was left behind" || ok "no bench cgroup left behind"
if [ -s res/cpu-data-memory-quick.json ]; then
  check=$("$PY" - res/cpu-data-memory-quick.json <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))["data"]
runs, limit = d["runs"], d["limit_mib"]
small, large = runs
msgs = []
if [r["set"] for r in runs] != ["small", "large"] or large["set_mib"] < 9 * small["set_mib"]:
    msgs.append(f"sets {[(r['set'], r['set_mib']) for r in runs]}: not a small and a 10x one")
if large["set_mib"] <= limit:
    msgs.append(f"the large set ({large['set_mib']:.0f} MiB) is not larger than the limit")
for r in runs:
    if r["cgroup"]["oom_kills"] or r["cgroup"]["peak_usage"] > limit * 2**20:
        msgs.append(f"{r['set']}: {r['cgroup']} beyond the {limit} MiB limit")
    if not r["test_acc"] > 0.3:  # chance: 0.1
        msgs.append(f"{r['set']}: test accuracy {r['test_acc']}, not learning")
if not large["peak_rss_mib"] <= small["peak_rss_mib"] + 16:
    msgs.append(f"peak RSS grew with the set: {small['peak_rss_mib']:.0f} MiB -> "
                f"{large['peak_rss_mib']:.0f} MiB")
print("\n".join(msgs) or "ok")
PYEOF
)
  [ "$check" = ok ] && ok "flat peak RSS, under the limit, learning" || bad "$check"
fi
finish
