# Shared by the tests of the training regime (lr_schedule, clip, early_stop, log_every, ...):
# the Python with numpy, and model files made from the seed MLP with other [train] keys.
# Source after lib.bash.
PY=/usr/bin/python3 # Debian's, with python3-numpy (tests/run installs it)
"$PY" -c "import numpy" 2>/dev/null || PY=python3
"$PY" -c "import numpy" 2>/dev/null || { bad "no python3 with numpy (tests/run installs python3-numpy)"; finish; exit 1; }
export PYTHONPATH="$MGT_SRC/tests/tools${PYTHONPATH:+:$PYTHONPATH}" # weights.py

# mlp_cfg NAME KEY=VALUE...: NAME.cfg, the seed MLP with these [train] keys set (replacing the
# file's own, or added to [train], its last section).
mlp_cfg() {
  local name=$1 kv key; shift
  cp "$MGT_SRC/examples/mlp.cfg" "$name.cfg"
  for kv in "$@"; do
    key=${kv%%=*}
    if grep -q "^$key = " "$name.cfg"; then sed -i "s|^$key = .*|$key = ${kv#*=}|" "$name.cfg"
    else echo "$key = ${kv#*=}" >>"$name.cfg"; fi
  done
}
