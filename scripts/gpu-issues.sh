#!/usr/bin/env bash
# The GPU calls of issues 20–23 (one H200), from the repository root over bundle/ (made by
# scripts/bundle.sh, with ../shared/refbench copied to bundle/refbench/). Logs go to $OUT.
#
#   scripts/gpu-issues.sh tests    # every test (CUDA_MEM_REQUIRE_GPU=1, CUDA IPC required),
#                                  # then the graph, IPC and launch tests under memcheck
#                                  # (MEMCHECK=full: the whole suite under memcheck instead)
#   scripts/gpu-issues.sh bench    # graphs.cu, membench.cu (before), limits.cu, then
#                                  # `cuda-mem bench` (all one-GPU sections but shmoo, peers,
#                                  # ipc) against docs/results/bench.json, membench.cu (after)
#   scripts/gpu-issues.sh peers    # `cuda-mem bench --sections shmoo,peers` and PyTorch's rows
#                                  # beside them (scripts/torch-ref.py), then the two-process
#                                  # rows (`--sections ipc`) and torch.multiprocessing's
set -u
out=${OUT:-/tmp/cuda-mem-out}; mkdir -p "$out/logs"
export CUDA_MEM_LOG_DIR="$out/logs" NCCL_NVLS_ENABLE=0
b=bundle/cuda-13.0; [ -d "$b" ] || b=$(ls -d bundle/cuda-* | head -n1)
cm="$b/bin/cuda-mem"
py=python3; [ -x /opt/torch/.venv/bin/python ] && py=/opt/torch/.venv/bin/python
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
secs() { echo $(( $(date +%s) - $1 )); }
status=0
case "${1:-tests}" in
tests)
  t=$(date +%s)
  CUDA_MEM_REQUIRE_IPC=1 timeout "${SUITE_SECS:-400}" "$b/run.sh" >"$out/suite.txt" 2>&1 || status=1
  grep -E 'rc=|passed, .* failed|FAILED|panicked' "$out/suite.txt" | head -60
  echo "suite: $(secs "$t") s"
  t=$(date +%s)
  if [ "${MEMCHECK:-new}" = full ]; then
    timeout "${MEMCHECK_SECS:-240}" "$b/run.sh" --memcheck >"$out/memcheck.txt" 2>&1 || status=1
  else
    CUDA_MEM_SANITIZER=1 CUDA_MEM_REQUIRE_GPU=1 CUDA_MEM_REQUIRE_IPC=1 CUDA_MEM_BIN="$PWD/$cm" \
      timeout "${MEMCHECK_SECS:-240}" compute-sanitizer --tool memcheck --leak-check full \
      --report-api-errors no --error-exitcode 97 --print-limit 20 \
      "$b/tests/tests-all" --test-threads=1 graph:: ipc:: launch:: >"$out/memcheck.txt" 2>&1 || status=1
  fi
  grep -E 'test result|ERROR SUMMARY|FAILED|panicked' "$out/memcheck.txt" | head -20
  echo "memcheck: $(secs "$t") s"
  ;;
random)
  # The randomized model test at its default size (run.sh's), and the examples.
  CUDA_MEM_REQUIRE_GPU=1 timeout 120 "$b/tests/tests-random" --test-threads=1 >"$out/random.txt" 2>&1
  echo "tests-random rc=$?"; grep -E '^test result' "$out/random.txt"
  for e in "$b"/bin/*; do
    case "$(basename "$e")" in cuda-mem) continue ;; esac
    timeout 60 "$e" >"$out/example-$(basename "$e").txt" 2>&1; echo "example $(basename "$e") rc=$?"
  done
  ;;
single)
  # tests-all in one process, as run.sh runs it: where it stops, if it does.
  t=$(date +%s)
  CUDA_MEM_REQUIRE_GPU=1 CUDA_MEM_REQUIRE_IPC=1 CUDA_MEM_BIN="$PWD/$cm" \
    timeout "${SINGLE_SECS:-200}" "$b/tests/tests-all" --test-threads=1 --nocapture \
    >"$out/single.txt" 2>&1; rc=$?
  echo "tests-all rc=$rc in $(secs "$t") s"
  grep -E '^test result|FAILED|panicked' "$out/single.txt" | head -20
  grep -oE '^test [^ ]+ \.\.\. ' "$out/single.txt" | tail -3
  gzip -f "$out/single.txt"
  ;;
pertest)
  # Every test of tests-all in its own process under a time limit, with its time: finds a
  # test that hangs or is slow. FILTER narrows the list.
  exe="$b/tests/tests-all"
  "$exe" --list 2>/dev/null | sed -n 's/: test$//p' | grep -E "${FILTER:-.}" >"$out/tests.list"
  : >"$out/pertest.txt"
  while read -r t; do
    s0=$(date +%s%N)
    CUDA_MEM_REQUIRE_GPU=1 CUDA_MEM_REQUIRE_IPC=1 CUDA_MEM_BIN="$PWD/$cm" \
      timeout "${TEST_SECS:-60}" "$exe" --exact "$t" --test-threads=1 --nocapture \
      >"$out/logs/$t.log" 2>&1; rc=$?
    ms=$(( ($(date +%s%N) - s0) / 1000000 ))
    echo "$ms ms rc=$rc $t" >>"$out/pertest.txt"
    [ $rc = 0 ] || { echo "FAIL rc=$rc $t ($ms ms)"; grep -E 'panicked|FAILED|Error|error' "$out/logs/$t.log" | head -8; }
  done <"$out/tests.list"
  echo "$(wc -l <"$out/tests.list") tests, $(grep -c ' rc=0 ' "$out/pertest.txt") passed"
  sort -rn "$out/pertest.txt" | head -25
  tar czf "$out/pertest-logs.tgz" -C "$out" logs && rm -rf "$out/logs"
  ;;
bench)
  nvcc -O2 -arch=sm_90 -o /tmp/graphs bundle/refbench/graphs.cu &&
  nvcc -O2 -arch=sm_90 -o /tmp/membench bundle/refbench/membench.cu &&
  nvcc -O2 -arch=sm_90 -std=c++17 -o /tmp/limits bundle/refbench/limits.cu -lpthread || exit 1
  echo "== graphs.cu"; { /tmp/graphs; /tmp/graphs k; } 2>&1 | tee "$out/graphs-ref.txt"
  echo "== membench (before)"; /tmp/membench 256 >"$out/membench-before.txt" 2>&1
  echo "== limits"; timeout 150 /tmp/limits 256 >"$out/limits.txt" 2>&1
  t=$(date +%s)
  timeout "${BENCH_SECS:-240}" "$cm" bench --sections "${SECTIONS:-copies,bidir,kernels,alloc,pools,calls}" \
    --baseline docs/results/bench.json --out-dir "$out/bench" >"$out/bench-run.txt" 2>&1 || status=1
  echo "bench: $(secs "$t") s"; tail -n 30 "$out/bench-run.txt"
  t=$(date +%s)
  timeout "${HOST_SECS:-150}" "$cm" bench --sections "${SECTIONS2:-host,graphs}" \
    --out-dir "$out/bench-host" >"$out/bench-host-run.txt" 2>&1 || status=1
  echo "bench host,graphs: $(secs "$t") s"
  echo "== membench (after)"; /tmp/membench 256 >"$out/membench-after.txt" 2>&1
  ;;
peers)
  t=$(date +%s)
  timeout "${PEERS_SECS:-300}" "$cm" bench --sections shmoo,peers --json "$out/peers.json" \
    >"$out/peers.txt" 2>&1 || status=1
  echo "shmoo+peers: $(secs "$t") s"; tail -n 60 "$out/peers.txt"
  timeout 120 "$py" scripts/torch-ref.py --bench "$out/peers.json" --json "$out/torch-ref.json" \
    >"$out/torch-ref.txt" 2>&1; echo "torch-ref rc=$?"; tail -n 30 "$out/torch-ref.txt"
  t=$(date +%s)
  timeout 120 "$cm" bench --sections ipc >"$out/ipc.txt" 2>&1; echo "ipc rc=$? $(secs "$t") s"
  tail -n 20 "$out/ipc.txt"
  timeout 120 "$py" scripts/torch-ipc.py >"$out/torch-ipc.txt" 2>&1; echo "torch-ipc rc=$?"
  tail -n 20 "$out/torch-ipc.txt"
  ;;
esac
exit $status
