#!/usr/bin/env bash
# One GPU session over the bundles made by scripts/bundle.sh (copied to bundle/), run from the
# repository root on a machine with the NVIDIA driver. Logs go to $OUT (default /tmp/cuda-mem-out).
#
#   scripts/gpu-session.sh tests   # every bundle's runner (bundle/cuda-*/run.sh), `cuda-mem info`
#   scripts/gpu-session.sh bench   # full `cuda-mem bench` of the first bundle (13.0 preferred) +
#                                  # the C++ reference before and after it, the bars checked,
#                                  # then that bundle's suite under compute-sanitizer memcheck
#
# The C++ reference is read from bundle/refbench/ (copy ../shared/refbench there first).
set -u
out=${OUT:-/tmp/cuda-mem-out}; mkdir -p "$out/logs"
export CUDA_MEM_LOG_DIR="$out/logs"
nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.used,memory.total --format=csv
main=bundle/cuda-13.0; [ -d "$main" ] || main=$(ls -d bundle/cuda-* | head -n1)
status=0
case "${1:-tests}" in
tests)
  for b in bundle/cuda-*/; do
    v=$(basename "$b"); v=${v#cuda-}
    echo "== bundle CUDA $v ($(head -n1 "$b/VERSION"))"
    CUDA_MEM_LOG_DIR="$out/logs/$v" "$b/run.sh" 2>&1 | tee "$out/run-$v.txt" | tail -n 25
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
  "$main/bin/cuda-mem" info | tee "$out/info.txt"
  "$main/bin/cuda-mem" info --json > "$out/info.json"
  ;;
bench)
  nvcc -O2 -arch=sm_90 -o /tmp/membench bundle/refbench/membench.cu || exit 1
  echo "== C++ reference (before)"; /tmp/membench 256 | tee "$out/membench-before.txt"
  echo "== cuda-mem bench"
  "$main/bin/cuda-mem" bench --json "$out/bench.json" --svg "$out/bench.svg" \
    2>"$out/logs/bench-progress.txt" | tee "$out/bench.txt"
  echo "== C++ reference (after)"; /tmp/membench 256 | tee "$out/membench-after.txt"
  python3 scripts/compare-refbench.py "$out/bench.json" "$out/membench-before.txt" \
    "$out/membench-after.txt" | tee "$out/compare.txt"
  echo "== memcheck"
  timeout 300 "$main/run.sh" --memcheck 2>&1 | tee "$out/memcheck.txt" | tail -n 30
  ;;
esac
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
exit $status
