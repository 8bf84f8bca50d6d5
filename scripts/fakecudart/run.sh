#!/usr/bin/env bash
# Builds the fake CUDA 12 runtime (fake.c) and the `hot_path` example in cuda-mem-sys's load
# mode (CUDA 12.0 headers, no libcudart_static.a), then runs the example against the fake:
# the host overhead of the hot path over the raw call, per row, on a machine without a GPU.
#
#   scripts/fakecudart/run.sh [samples] [calls per sample]
#   PERF=1 scripts/fakecudart/run.sh ...   # under `perf record` (cpu-clock), report after
#   CACHE=1 FAKE_EVICT_KIB=64 scripts/fakecudart/run.sh 1 64   # callgrind: instructions and
#                                           # cache misses per call over raw, per row
#
# Environment: CUDA12 (default: .cuda/12.0 of the main checkout, or $CUDA_PATH when it has
# no libcudart_static.a), CARGO_TARGET_DIR (default: target/fakecudart), OUT (where the fake
# library goes, default: $CARGO_TARGET_DIR/fakecudart).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cuda12="${CUDA12:-}"
if [ -z "$cuda12" ]; then
  for c in "$root/.cuda/12.0" "$(git -C "$root" worktree list --porcelain | sed -n '1s/^worktree //p')/.cuda/12.0"; do
    if [ -f "$c/include/cuda_runtime_api.h" ]; then cuda12="$c"; break; fi
  done
fi
if [ -z "$cuda12" ] || [ ! -f "$cuda12/include/cuda_runtime_api.h" ]; then
  echo "no CUDA 12 headers: set CUDA12 to a CUDA 12.x toolkit without libcudart_static.a" >&2
  exit 2
fi
export CUDA_PATH="$cuda12"
# Absolute: cargo runs in the repository root below, the paths are read from here.
export CARGO_TARGET_DIR="$(realpath -m "${CARGO_TARGET_DIR:-$root/target/fakecudart}")"
# Symbols for perf; the release profile strips them.
export CARGO_PROFILE_RELEASE_STRIP=none CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
out="$(realpath -m "${OUT:-$CARGO_TARGET_DIR/fakecudart}")"
mkdir -p "$out"
cc -shared -fPIC -O2 -Wall -I"$cuda12/include" -o "$out/libfakecudart.so" "$here/fake.c"
(cd "$root" && cargo build --release -p cuda-mem --features measure --example hot_path)
exe="$CARGO_TARGET_DIR/release/examples/hot_path"
export CUDA_MEM_CUDART="$out/libfakecudart.so"
if [ "${CACHE:-0}" = 1 ]; then
  # Under callgrind's cache simulation: per row, instructions and cache misses per call of
  # ours beyond the raw call's (the harness marks each counted run, fake_callgrind_mark).
  rm -f "$out"/callgrind.out*
  valgrind --tool=callgrind --cache-sim=yes --D1="${D1:-32768,8,64}" --LL="${LL:-1048576,16,64}" \
    --callgrind-out-file="$out/callgrind.out" "$exe" "$@" >/dev/null 2>"$out/valgrind.log" \
    || { tail "$out/valgrind.log" >&2; exit 1; }
  python3 "$here/cache.py" "$out"/callgrind.out.*
elif [ "${PERF:-0}" = 1 ]; then
  perf record -e cpu-clock -F 20000 -g -o "$out/perf.data" "$exe" "$@"
  perf report -i "$out/perf.data" --no-children --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -40
else
  "$exe" "$@"
fi
