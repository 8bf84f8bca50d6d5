#!/usr/bin/env bash
# One GPU session over the bundles made by scripts/bundle.sh (copied to bundle/), run from the
# repository root on a machine with the NVIDIA driver. Logs go to $OUT (default /tmp/cuda-mem-out).
#
#   scripts/gpu-session.sh tests   # bundle runners for CUDA 13.0 and 12.9, `cuda-mem info`
#   scripts/gpu-session.sh bench   # full `cuda-mem bench` + the C++ reference in the same run,
#                                  # then the 13.0 suite under compute-sanitizer memcheck
set -u
out=${OUT:-/tmp/cuda-mem-out}; mkdir -p "$out/logs"
export CUDA_MEM_LOG_DIR="$out/logs"
nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.used,memory.total --format=csv
case "${1:-tests}" in
tests)
  for v in 13.0 12.9; do
    echo "== bundle CUDA $v"
    CUDA_MEM_LOG_DIR="$out/logs/$v" bundle/cuda-$v/run.sh 2>&1 | tee "$out/run-$v.txt"
  done
  bundle/cuda-13.0/bin/cuda-mem info | tee "$out/info.txt"
  bundle/cuda-13.0/bin/cuda-mem info --json > "$out/info.json"
  ;;
bench)
  nvcc -O2 -arch=sm_90 -o /tmp/membench bundle/refbench/membench.cu || exit 1
  echo "== C++ reference (before)"; /tmp/membench 256 | tee "$out/membench-before.txt"
  echo "== cuda-mem bench"
  bundle/cuda-13.0/bin/cuda-mem bench --json "$out/bench.json" --svg "$out/bench.svg" \
    2>"$out/logs/bench-progress.txt" | tee "$out/bench.txt"
  echo "== C++ reference (after)"; /tmp/membench 256 | tee "$out/membench-after.txt"
  python3 scripts/compare-refbench.py "$out/bench.json" "$out/membench-before.txt" \
    "$out/membench-after.txt" | tee "$out/compare.txt"
  echo "== memcheck"
  timeout 300 bundle/cuda-13.0/run.sh --memcheck 2>&1 | tee "$out/memcheck.txt"
  ;;
esac
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
