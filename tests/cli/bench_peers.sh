#!/usr/bin/env bash
# labels: cli
# timeout: 600
# The benchmark's peers without their frameworks' releases (those bench/peer installs from PyPI
# when it runs; a benchmark is not a test): their logic, with whatever torch the machine has
# (Debian's python3-torch under /usr/bin/python3, which tests/run installs).
#
# 1. bench/torch_peer.py builds each seed model with mgtrain summary's trainable parameters
#    (--count-params), and trains a few steps through either batch path (tensor indexing, the
#    DataLoader with a DistributedSampler, on 1 and 2 processes), each JSON line naming its path,
#    its parameters and the steps it ran.
#    bench/torch_gpt.py (the language-model benchmarks' twin) counts mgtrain's parameters of a
#    GPT and, from the weights it writes, gives mgtrain's first three losses on the same windows.
# 2. Arguments the peers refuse, in one line each: a global batch that does not split over the
#    processes, the DataLoader on a graph model, and Keras on more than one process (refused
#    before TensorFlow is imported, so this runs without it).
# 3. bench/peer refuses what it cannot measure before it builds or installs anything: an unknown
#    framework, Keras on a GPU, mgtrain left out, a real-time priority out of range.
# 4. bench/peer --replot of a run written before there were several frameworks: its one peer
#    reads as PyTorch with tensor indexing, and the markdown is written again, every side's row
#    and the ratio in it.
# 5. The FLOPs of a step that bench/lm_peer puts under its GEMM ceiling (benchlib.step_gflop, read
#    from mgtrain summary --floor) are the products a GPT step is made of, counted here from the
#    model file's sizes.
source "$(dirname "$0")/lib.bash"
PY=/usr/bin/python3
if ! "$PY" -c "import torch, numpy" 2>/dev/null; then
  echo "SKIPPED: no torch for $PY (apt-get install python3-torch python3-numpy)"
  exit 77
fi
B=$MGT_SRC/bench

# 1. parameter counts and both batch paths
for m in mlp convnet; do
  want=$("$MGT_BIN" summary --model "$MGT_SRC/examples/$m.cfg" | sed -n 's/^Trainable params: *\([0-9,]*\).*/\1/p' | tr -d ,)
  got=$("$PY" "$B/torch_peer.py" --model "$m" --count-params | "$PY" -c "import json,sys; print(json.load(sys.stdin)['params'])")
  [ -n "$want" ] && [ "$got" = "$want" ] && ok "torch_peer $m: $got trainable parameters, as mgtrain summary" ||
    bad "torch_peer $m: $got trainable parameters, mgtrain summary '$want'"
done
for run in "index 1" "loader 2"; do
  set -- $run
  # a port free now, from the OS (one derived from the PID was found taken by another process)
  port=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  out=$(timeout 120 "$PY" "$B/torch_peer.py" --model mlp --batches "$1" --world "$2" --batch-size 64 \
        --max-steps 3 --warmup 1 --data synthetic --port $port 2>&1)
  if "$PY" -c "
import json, sys
j = json.loads([l for l in sys.argv[1].splitlines() if l.startswith('{')][-1])
ok = j['batches'] == '$1' and j['world'] == $2 and j['steps'] == 3 and j['params'] == 269322 \
     and j['samples_per_s'] > 0
sys.exit(0 if ok else 1)" "$out"; then
    ok "torch_peer --batches $1 on $2 process(es): 3 steps, its path and parameters in its JSON"
  else bad "torch_peer --batches $1 --world $2:"; tail -5 <<<"$out"; fi
done

# 1b. bench/torch_gpt.py, the language-model benchmarks' PyTorch twin (bench/lm_peer, lm_learn):
# the tests' GPT without dropout, on AdamW with weight decay, started on both sides from the
# weights torch_gpt writes, on byte shards of a text: the same parameter count, and the same loss
# at each of three steps, which holds only if the weights' names and layouts, the model and the
# windows' order (torch_gpt's port of mgtrain's shuffle) are mgtrain's (another seed's windows:
# 1.4e-3 relative at the first step), and AdamW's update is PyTorch's on both sides. Each loss
# is a float32 mean over 4 x 32 positions of 256 logits from dot products of at most 128 terms
# (each within gamma_128 = 7.6e-6 relative); the AdamW steps between them are
# lr m / (sqrt(v) + eps) of gradients equal to rounding, which moves the weights alike except
# where |g| is near eps. 3e-5 relative, 4 gamma_128, covers the forward pass's rounding. About
# 10 s.
sed '/^\[dropout\]/,/^rate/d; /^dropout = /d; s/^optimizer = adam$/optimizer = adamw\nweight_decay = 0.1/' \
  "$MGT_SRC/tests/cli/lm_tiny.cfg" >gpt.cfg
for i in $(seq 1 300); do echo "line $i: a fortune is a small text, and this one is number $((i * 7 % 31))"; done >gpt.txt
"$MGT_BIN" convert --text gpt.txt gpt-tok >/dev/null 2>&1 || bad "convert --text for torch_gpt"
want=$("$MGT_BIN" summary --model gpt.cfg | sed -n 's/^Trainable params: *\([0-9,]*\).*/\1/p' | tr -d ,)
got=$("$PY" "$B/torch_gpt.py" --model gpt.cfg --count-params | "$PY" -c "import json,sys; print(json.load(sys.stdin)['params'])")
[ -n "$want" ] && [ "$got" = "$want" ] && ok "torch_gpt: $got trainable parameters, as mgtrain summary" ||
  bad "torch_gpt: $got trainable parameters, mgtrain summary '$want'"
port=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
"$PY" "$B/torch_gpt.py" --model gpt.cfg --save-init gpt-init.safetensors --init-only &&
  out=$(timeout 120 "$PY" "$B/torch_gpt.py" --model gpt.cfg --data gpt-tok --batch-size 4 --max-steps 3 \
        --init-weights gpt-init.safetensors --log-losses --no-validation --port $port 2>&1) &&
  "$MGT_BIN" train --model gpt.cfg --data gpt-tok --batch-size 4 --max-steps 3 --init-weights gpt-init.safetensors \
    --log-every 1 --no-validation --verbose 0 --out gpt-run >gpt-run.log 2>&1 ||
  { bad "torch_gpt and mgtrain from the same weights"; tail -5 <<<"$out"; tail -5 gpt-run.log; }
"$PY" - "$out" gpt-run/metrics_steps.jsonl <<'PY' && ok "torch_gpt and mgtrain from the same weights on the same windows: the same losses at each of 3 AdamW steps" || bad "torch_gpt's losses are not mgtrain's"
import json, sys
t = json.loads([l for l in sys.argv[1].splitlines() if l.startswith("{")][-1])["losses"]
m = [json.loads(l)["loss"] for l in open(sys.argv[2])]
print("torch_gpt", t, "mgtrain", m)
assert len(t) == len(m) == 3 and all(abs(a - b) <= 3e-5 * abs(b) for a, b in zip(t, m)), (t, m)
PY

# 2. what the peers refuse
expect_fail "torch_peer: a batch that does not split over the processes" "--batch-size 255 does not split evenly over --world 2" \
  "$PY" "$B/torch_peer.py" --world 2 --batch-size 255 --count-params
expect_fail "torch_peer: the DataLoader on a graph model" "--batches loader: --model resnet50 draws its images per step" \
  "$PY" "$B/torch_peer.py" --model resnet50 --batches loader --count-params
expect_fail "keras_peer: more than one process" "--world 2: MirroredStrategy on a CPU has one replica" \
  "$PY" "$B/keras_peer.py" --world 2

# 3. what bench/peer refuses, before any build or install
expect_fail "bench/peer: an unknown framework" "unknown name.*'jax'.*choose from mgtrain, torch, keras" \
  "$PY" "$B/peer" --frameworks mgtrain,jax --no-build --build-dir nowhere
expect_fail "bench/peer: Keras on a GPU" "the Keras peer runs on a CPU only" \
  "$PY" "$B/peer" --device gpu --frameworks mgtrain,keras --no-build --build-dir nowhere
expect_fail "bench/peer: mgtrain left out" "mgtrain must be one of them" \
  "$PY" "$B/peer" --frameworks torch,keras --no-build --build-dir nowhere
expect_fail "bench/peer: a real-time priority out of range" "--rt-priority 120: give 1-99" \
  "$PY" "$B/peer" --rt-priority 120 --no-build --build-dir nowhere
[ ! -e nowhere ] && ok "bench/peer made nothing for the arguments it refused" || bad "bench/peer made nowhere/"

# 4. --replot of a single-peer run (a run's JSON and its log, as bench/peer writes them)
old=$MGT_SRC/bench/results/cpu-peer-epyc
if [ -f "$old.json" ]; then
  mkdir replot && cp "$old.json" replot/ && cp "$old.log" replot/ 2>/dev/null
  out=$("$PY" "$B/peer" --replot replot/cpu-peer-epyc.json 2>&1); rc=$?
  md=replot/cpu-peer-epyc.md
  if [ $rc -eq 0 ] && grep -q "PyTorch DDP, tensor indexing" "$md" && grep -q "| mlp | 1 | 256 | \*\*60,234\*\* | PyTorch DDP, tensor indexing | 16,703 | \*\*3.61x\*\*" "$md"; then
    ok "--replot of a single-peer run: its peer is PyTorch with tensor indexing, the 3.61x ratio as it was"
  else bad "--replot of $old.json (exit $rc):"; tail -5 <<<"$out"; grep "^| mlp" "$md" | head -3; fi
else
  bad "$old.json is missing: the replot check needs a run written before there were several frameworks"
fi
# 5. a GPT step's FLOPs: every dense layer 3 products of 2 x tokens x in x out (forward, input and
# weight gradients); each head's attention over the causal pairs of a sequence, T (T + 1) / 2
# (2 products forward, 5 backward, its scores recomputed), 2 x d FLOP a pair per product. Layer
# norms, GELUs and the residual adds (about 0.1% here) are left out, hence 0.5%.
"$PY" - "$MGT_BIN" "$MGT_SRC/examples/gpt-bytes.cfg" <<'PY' && ok "benchlib.step_gflop: a GPT step's FLOPs as its products count them" || bad "benchlib.step_gflop"
import sys
sys.path.insert(0, sys.argv[2].rsplit("/examples/", 1)[0] + "/bench")
import benchlib as bl
class Sess:
    def run(self, argv, record=True):
        import subprocess
        return 0, subprocess.run([str(x) for x in argv], capture_output=True, text=True,
                                 check=True).stdout, ""
got = bl.step_gflop(Sess(), sys.argv[1], sys.argv[2], 16)
B, T, C, L, H, V = 16, 256, 384, 6, 6, 256  # examples/gpt-bytes.cfg
dense = L * (C * 3 * C + C * C + C * 4 * C + 4 * C * C) + C * V
want = (6 * B * T * dense + 7 * 2 * (C // H) * T * (T + 1) // 2 * B * H * L) / 1e9
print(f"step_gflop {got}, counted {want:.1f}")
assert abs(got - want) <= 0.005 * want, (got, want)
PY
finish
