#!/usr/bin/env bash
# labels: cli
# timeout: 300
# A CPU run needs none of the GPU libraries, even from a build with CUDA: mgtrain links none of
# CUDA, cuBLAS, cuDNN or NCCL (the GPU backend is its own library, libmgt_gpu.so, opened when a
# GPU is asked for); a CPU run works under an 800 MB address-space limit (ulimit -v), and so does
# --device auto, which falls back to the CPU; with the GPU libraries gone (hidden in a mount
# namespace of the test's own) or the backend's library missing, a CPU run works and --device gpu
# says in one line what is missing; without NVIDIA's driver, --device auto loads none of them.
source "$(dirname "$0")/lib.bash"
R=(--data synthetic --synthetic-samples 512 --batch-size 64 --max-steps 2 --verbose 0)
GPU_LIBS='libcudart|libcudnn|libcublas|libnccl'
trains() { # trains NAME DIR CMD...: CMD trains 2 steps on the CPU into DIR
  local name=$1 dir=$2 out
  shift 2
  if out=$("$@" "${R[@]}" --verbose 2 --out "$dir" 2>&1) && grep -q "backend cpu" <<<"$out" &&
    [ -s "$dir/weights.safetensors" ]; then ok "$name"
  else bad "$name:"; echo "$out" | tail -8; fi
}

libs=$(ldd "$MGT_BIN")
grep -E "$GPU_LIBS" <<<"$libs" && bad "mgtrain links GPU libraries (above)" \
  || ok "ldd mgtrain names no $GPU_LIBS"
plugin=$(dirname "$MGT_BIN")/libmgt_gpu.so
[ -e "$plugin" ] && cuda=1 || cuda=0
if [ $cuda = 1 ]; then
  grep -qE "$GPU_LIBS" <(ldd "$plugin") && ok "the GPU backend's library links them: $(ldd "$plugin" | grep -oE "($GPU_LIBS)[^ ]*" | paste -sd' ')" \
    || bad "libmgt_gpu.so links no GPU library"
else
  echo "note: a build without the GPU backend; the checks of its library do not apply"
fi

# An address-space limit that the GPU libraries alone exceed. (AddressSanitizer reserves terabytes
# of address space for its shadow memory: a build with it cannot run under any such limit.)
if grep -q libasan <<<"$libs"; then
  echo "note: a build with AddressSanitizer; the ulimit -v checks do not apply"
else
  trains "--device cpu under ulimit -v 800000" vcpu bash -c 'ulimit -v 800000 && exec "$@"' sh "$MGT_BIN" --device cpu
  trains "--device auto under ulimit -v 800000 falls back to the CPU" vauto bash -c 'ulimit -v 800000 && exec "$@"' sh "$MGT_BIN"
fi

[ $cuda = 1 ] || { finish; exit; }
# Without NVIDIA's driver, --device auto does not even load the GPU backend (its libraries alone
# take a second or more of every process's start under the sanitizers): the dynamic loader's own
# log of the files it opens names none of them.
if [ ! -e /dev/nvidiactl ] && [ ! -e /dev/dxg ] && ! /sbin/ldconfig -p | grep 'libcuda\.so\.1 ' >/dev/null; then
  opened=$(LD_DEBUG=files "$MGT_BIN" "${R[@]}" --out ldauto 2>&1 | grep -oE "file=[^ ]*" | sort -u)
  grep -q "file=libopenblas" <<<"$opened" || bad "LD_DEBUG=files shows no library at all: $opened"
  grep -qE "file=(libmgt_gpu|$GPU_LIBS)" <<<"$opened" \
    && bad "--device auto without a driver loaded: $(grep -E "libmgt_gpu|$GPU_LIBS" <<<"$opened" | paste -sd' ')" \
    || ok "--device auto without NVIDIA's driver loads neither libmgt_gpu.so nor a GPU library"
else
  echo "note: NVIDIA's driver is here; the check that --device auto loads nothing without it does not apply"
fi
# The backend's library missing (a copy of mgtrain alone): CPU runs work, --device gpu says so.
mkdir alone && cp "$MGT_BIN" alone/
trains "mgtrain without libmgt_gpu.so beside it: --device cpu" acpu alone/mgtrain --device cpu
trains "... and --device auto" aauto alone/mgtrain
out=$(alone/mgtrain --device gpu "${R[@]}" --out agpu 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] &&
  grep -q "^mgtrain: --device gpu: no usable GPU on .*the GPU backend cannot be loaded: libmgt_gpu.so: cannot open shared object file.*run with --device cpu" <<<"$out" \
  && ok "... and --device gpu names the missing library in one line" || { bad "--device gpu without libmgt_gpu.so: exit $rc"; echo "$out"; }
alone/mgtrain --version | grep "^gpu backend: cannot be loaded here (libmgt_gpu.so: cannot open shared object file" >/dev/null \
  && ok "... and --version says so" || { bad "--version without libmgt_gpu.so"; alone/mgtrain --version; }

# The GPU libraries gone: every folder the backend's library finds them in is hidden (an empty
# tmpfs mounted over it, in a mount namespace of this test alone).
if ! unshare -m true 2>/dev/null; then
  echo "note: unshare -m is not permitted here (not root?); the check with the GPU libraries hidden does not run"
  finish
  exit
fi
dirs=$(ldd "$plugin" | grep -E "$GPU_LIBS" | awk '{print $3}' | xargs -r -n1 readlink -f | xargs -r -n1 dirname | sort -u)
[ -n "$dirs" ] || bad "no GPU library folder found in ldd $plugin"
hide() { # hide CMD...: CMD with the GPU libraries' folders hidden
  unshare -m bash -c 'for d in $HIDE; do mount -t tmpfs -o size=1M tmpfs "$d" || exit 99; done; exec "$@"' sh "$@"
}
export HIDE=$dirs
# (ldd's whole output first: grep -q ending the pipe early would fail it under pipefail.)
hidden=$(hide ldd "$plugin" 2>&1)
grep -q "not found" <<<"$hidden" && ok "hidden: ldd libmgt_gpu.so finds no $(grep -oE "($GPU_LIBS)[^ ]* => not found" <<<"$hidden" | head -1)" \
  || { bad "the GPU libraries are still found with $dirs hidden"; echo "$hidden"; }
trains "GPU libraries hidden: --device cpu" hcpu hide "$MGT_BIN" --device cpu
trains "GPU libraries hidden: --device auto" hauto hide "$MGT_BIN"
out=$(hide "$MGT_BIN" --device gpu "${R[@]}" --out hgpu 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] &&
  grep -qE "^mgtrain: --device gpu: no usable GPU on .*the GPU backend cannot be loaded: ($GPU_LIBS)[^:]*: cannot open shared object file.*run with --device cpu" <<<"$out" \
  && ok "GPU libraries hidden: --device gpu names the missing one in one line: $out" || { bad "--device gpu with the GPU libraries hidden: exit $rc"; echo "$out"; }
finish
