#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# The README's "Running" commands, run as they are written, in order, from a folder laid out as
# the repository (build/mgtrain, examples/, launch/), by root on this machine's cores, in a shell
# without Open MPI's root variables (as a fresh root shell is): each must succeed. Training lines
# get --max-steps 2 added, so that the ConvNet's 12 epochs take seconds; nothing else changes.
source "$(dirname "$0")/lib.bash"
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
mkdir -p repo/build && cd repo
ln -s "$MGT_BIN" build/mgtrain
ln -s "$MGT_SRC/examples" examples
ln -s "$MGT_SRC/launch" launch
block=$(awk '/^## Running/ { f = 1 } f && /^```sh/ { b = 1; next } b && /^```/ { exit } b' "$MGT_SRC/README.md")
[ "$(wc -l <<<"$block")" -ge 5 ] && ok "the README's Running block: $(wc -l <<<"$block") lines" || { bad "no Running block"; finish; exit 1; }
n=0
while IFS= read -r line; do
  cmd=${line%%#*}
  [ -z "${cmd// /}" ] && continue
  n=$((n + 1))
  case $cmd in
    *" summary "* | *" eval "* | *" predict "* | *" plot "* | export*) ;;
    *mgtrain*) cmd="$cmd --max-steps 2" ;;
  esac
  if [[ $cmd == export* ]]; then
    eval "$cmd" && ok "line $n: $cmd" || bad "line $n: $cmd"
    continue
  fi
  start=$(date +%s)
  if timeout 600 bash -c "$cmd" </dev/null >"line$n.log" 2>&1; then ok "line $n ($(( $(date +%s) - start )) s): $cmd"
  else bad "line $n: $cmd"; tail -15 "line$n.log"; fi
done <<<"$block"
[ -s runs/mlp/weights.safetensors ] && [ -s runs/convnet/weights.safetensors ] && [ -s preds.npy ] &&
  [ -s runs/mlp/curves.png ] && [ -s runs/mlp-3/weights.safetensors ] && ok "every output is there" ||
  { bad "outputs missing"; ls -R runs; }
finish
