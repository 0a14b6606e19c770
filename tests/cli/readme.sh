#!/usr/bin/env bash
# labels: mpi
# timeout: 900
# The commands of the README's tour (its first block: one machine) and of the user guide's
# "Running" block, run as they are written, in order, from a folder laid out as the repository
# (build/mgtrain, examples/, launch/), by root on this machine's cores, in a shell without Open
# MPI's root variables (as a fresh root shell is): each must succeed. Training lines get
# --max-steps 2 added, so that the ConvNet's 12 epochs take seconds, and the seed ConvNet's also
# --no-validation: its passes over the 10,000 test images would take three quarters of the test
# (27 s of CPU), and no later line reads its run; nothing else changes. (The tour's Slurm block
# is launch/mgtrain.sbatch, which slurm.sh and slurm_multinode.sh submit; its GPU block needs a
# GPU.)
source "$(dirname "$0")/lib.bash"
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM

# run_block NAME FILE HEADING: the first sh block after HEADING in FILE, line by line, in a new
# folder NAME laid out as the repository.
run_block() {
  local name=$1 file=$2 heading=$3 block n=0 line cmd start
  block=$(awk -v h="$heading" '$0 == h { f = 1 } f && /^```sh/ { b = 1; next } b && /^```/ { exit } b' "$file")
  [ "$(wc -l <<<"$block")" -ge 5 ] && ok "$name: $(wc -l <<<"$block") lines" || { bad "$name: no sh block after '$heading' in $file"; return; }
  mkdir -p "$T/$name/build" && cd "$T/$name" || return
  ln -s "$MGT_BIN" build/mgtrain
  ln -s "$MGT_SRC/examples" examples
  ln -s "$MGT_SRC/launch" launch
  while IFS= read -r line; do
    cmd=${line%%#*}
    [ -z "${cmd// /}" ] && continue
    n=$((n + 1))
    case $cmd in
      *" summary "* | *" eval "* | *" predict "* | *" plot "* | export*) ;;
      *"--model examples/convnet.cfg"*) cmd="$cmd --max-steps 2 --no-validation" ;;
      *mgtrain*) cmd="$cmd --max-steps 2" ;;
    esac
    if [[ $cmd == export* ]]; then
      eval "$cmd" && ok "$name, line $n: $cmd" || bad "$name, line $n: $cmd"
      continue
    fi
    start=$(date +%s)
    if timeout 600 bash -c "$cmd" </dev/null >"line$n.log" 2>&1; then ok "$name, line $n ($(( $(date +%s) - start )) s): $cmd"
    else bad "$name, line $n: $cmd"; tail -15 "line$n.log"; fi
  done <<<"$block"
  unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM # the next block starts afresh too
}

run_block tour "$MGT_SRC/README.md" "## A one-minute tour"
[ -s runs/mlp/weights.safetensors ] && [ -s runs/smallconv/weights.safetensors ] && [ -s preds.npy ] &&
  [ -s runs/mlp-r/weights.safetensors ] && ok "tour: every output is there" ||
  { bad "tour: outputs missing"; ls -R runs; }
run_block guide "$MGT_SRC/docs/guide.md" "## Running"
[ -s runs/mlp/weights.safetensors ] && [ -s runs/convnet/weights.safetensors ] && [ -s preds.npy ] &&
  [ -s runs/mlp/curves.png ] && [ -s runs/mlp-3/weights.safetensors ] && ok "guide: every output is there" ||
  { bad "guide: outputs missing"; ls -R runs; }
finish
