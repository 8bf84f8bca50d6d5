#!/usr/bin/env bash
# One GPU session over the bundles made by scripts/bundle.sh (copied to bundle/), run from the
# repository root on a machine with the NVIDIA driver. Logs go to $OUT (default /tmp/cuda-mem-out).
#
#   scripts/gpu-session.sh tests   # every bundle's runner (bundle/cuda-*/run.sh), `cuda-mem info`;
#                                  # with MEMCHECK=1 then the 13.0 suite under memcheck
#   scripts/gpu-session.sh bench   # full `cuda-mem bench` of the first bundle (13.0 preferred) +
#                                  # the C++ references in the same call (membench.cu before and
#                                  # after it, limits.cu; peer.cu and nccl_peer.py on two GPUs),
#                                  # the bars checked, then (unless MEMCHECK=0) that bundle's
#                                  # suite under compute-sanitizer memcheck
#   scripts/gpu-session.sh multi   # two GPUs: the multi_gpu tests (NCCL in one process and in
#                                  # two), peer.cu and nccl_peer.py (bundle/refbench/), and
#                                  # `cuda-mem bench --quick` with its two-GPU section, in one
#                                  # run; ends with one TARGET line per goal of issue 14
#
# The C++ reference is read from bundle/refbench/ (copy ../shared/refbench there first).
#
# NVLink multicast stays off for every NCCL user of every mode (PyTorch's and ours; the tests
# bundles run the multi_gpu NCCL tests too): NCCL_NVLS_ENABLE=0 is exported here, before any
# process starts (cuda-mem-nccl refuses to load without it and never sets it itself). A value
# other than 0 from the caller is refused, not overwritten.
#
# Exit status: nonzero when a bundle's runner (tests), or the multi_gpu tests or the bench
# (multi), failed.
set -u
if [ "${NCCL_NVLS_ENABLE-0}" != 0 ]; then
  echo "gpu-session.sh: NCCL_NVLS_ENABLE='$NCCL_NVLS_ENABLE': NVLink multicast must stay off on this machine (unset it or set 0)" >&2
  exit 2
fi
export NCCL_NVLS_ENABLE=0
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
  if [ "${MEMCHECK:-0}" = 1 ]; then
    echo "== memcheck"
    timeout "${MEMCHECK_SECS:-300}" "$main/run.sh" --memcheck 2>&1 | tee "$out/memcheck.txt" | tail -n 30
  fi
  ;;
bench)
  nvcc -O2 -arch=sm_90 -o /tmp/membench bundle/refbench/membench.cu || exit 1
  nvcc -O2 -arch=sm_90 -std=c++17 -o /tmp/limits bundle/refbench/limits.cu -lpthread || exit 1
  echo "== C++ reference (before)"; /tmp/membench 256 | tee "$out/membench-before.txt"
  echo "== C++ limits (host memcpy, naive staged ring, cold pinning, pools)"
  timeout 200 /tmp/limits 256 | tee "$out/limits.txt"
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    echo "== two GPUs: peer.cu and nccl_peer.py"
    nvcc -O2 -arch=sm_90 -o /tmp/peer bundle/refbench/peer.cu && /tmp/peer 256 | tee "$out/peer.txt"
    timeout 300 python3 bundle/refbench/nccl_peer.py 256 2>&1 | tail -n 5 | tee "$out/nccl_peer.txt"
  fi
  echo "== cuda-mem bench"
  "$main/bin/cuda-mem" bench --json "$out/bench.json" --svg "$out/bench.svg" \
    2>"$out/logs/bench-progress.txt" | tee "$out/bench.txt"
  echo "== C++ reference (after)"; /tmp/membench 256 | tee "$out/membench-after.txt"
  python3 scripts/compare-refbench.py "$out/bench.json" --limits "$out/limits.txt" \
    "$out/membench-before.txt" "$out/membench-after.txt" | tee "$out/compare.txt"
  if [ "${MEMCHECK:-1}" != 0 ]; then
    echo "== memcheck"
    timeout "${MEMCHECK_SECS:-300}" "$main/run.sh" --memcheck 2>&1 | tee "$out/memcheck.txt" | tail -n 30
  fi
  ;;
multi)
  b=bundle/cuda-13.0; ref=bundle/refbench
  nvidia-smi topo -m | tee "$out/topo.txt"
  echo "== multi_gpu tests (one process, then two processes for NCCL)"
  CUDA_MEM_REQUIRE_GPU=1 timeout 500 "$b/tests/tests-all" multi_gpu --test-threads=1 \
    --nocapture >"$out/multi-tests.txt" 2>&1
  rc=$?; echo "multi_gpu tests rc=$rc"; [ "$rc" = 0 ] || status=1
  grep -E '^(test |SKIP|nccl rank|multi_gpu:|test result|thread .* panicked)' "$out/multi-tests.txt"
  echo "== C++ reference: peer.cu"
  nvcc -O2 -arch=sm_90 -o /tmp/peer "$ref/peer.cu" && /tmp/peer 256 | tee "$out/peer.txt"
  echo "== PyTorch NCCL: nccl_peer.py"
  timeout 300 python3 "$ref/nccl_peer.py" 256 2>&1 | tail -n 5 | tee "$out/nccl_peer.txt"
  echo "== cuda-mem bench --quick (two-GPU section at 256 MiB)"
  timeout 500 "$b/bin/cuda-mem" bench --quick --samples 3 --json "$out/bench.json" \
    2>"$out/logs/bench-progress.txt" >"$out/bench.txt"
  rc=$?; echo "bench rc=$rc"; [ "$rc" = 0 ] || status=1
  grep -E 'two GPUs|peer_|staged|nccl' "$out/logs/bench-progress.txt"
  sed -n '/^Two GPUs/,/^$/p' "$out/bench.txt"
  grep -E '^Verified' "$out/bench.txt"
  python3 - "$out/bench.json" "$out/nccl_peer.txt" <<'PY' | tee "$out/targets.txt"
import json, re, sys
rows = json.load(open(sys.argv[1])).get("multi_gpu", [])
def row(test, d):
    return next((r for r in rows if r["test"] == test and r["direction"] == d), None)
def line(name, ok, text):
    print(f"TARGET {name}: {text} -> {'PASS' if ok else 'FAIL'}")
for d in ("0to1", "1to0"):
    r = row("peer_copy", d)
    if r: line(f"peer_copy {d}", r["ratio"] >= 0.99, f"{r['ours']:.1f} GB/s vs raw {r['raw']:.1f}, speed ratio {r['ratio']:.3f} (goal >= 0.99)")
    r = row("nopeer_copy", d)
    if r: line(f"nopeer_copy {d}", r["ratio"] >= 0.99, f"{r['ours']:.1f} GB/s vs raw {r['raw']:.1f}, speed ratio {r['ratio']:.3f} (goal >= 0.99)")
    r = row("peer_latency", d)
    if r: print(f"INFO peer_latency {d}: {r['ours']:.2f} us vs raw {r['raw']:.2f} us")
    r = row("staged", d)
    if r: line(f"staged {d}", r["ratio"] >= 1.5, f"{r['ours']:.1f} GB/s vs two serial copies {r['raw']:.1f}, x{r['ratio']:.2f} (goal >= 1.5)")
ours = row("nccl_all_reduce", "2 ranks")
m = re.search(r"busbw_gbps=([0-9.]+)", open(sys.argv[2]).read())
if ours and m:
    torch = float(m.group(1))
    line("nccl_all_reduce", ours["ours"] >= 0.98 * torch, f"busbw {ours['ours']:.1f} GB/s vs nccl_peer.py {torch:.1f}, ratio {ours['ours'] / torch:.3f} (goal >= 0.98)")
else:
    print(f"TARGET nccl_all_reduce: missing (ours row {'found' if ours else 'absent'}, nccl_peer.py busbw {'found' if m else 'absent'}) -> FAIL")
PY
  ;;
esac
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
exit $status
