#!/usr/bin/env bash
# The GPU calls of the second round on issues 20-22 (one H200), from the repository root over
# bundle/ (scripts/bundle.sh; ../shared/refbench copied to bundle/refbench/; bundle/c12: the
# CUDA 12.0 load-mode build's cuda-mem, tests-all, cuda-mem-sys tests and lib/). Logs go to $OUT.
#
#   scripts/gpu-round2.sh verify   # every test (run.sh), memcheck of the capture/graph/IPC/
#                                  # launch/review tests, and the CUDA 12.0 load-mode bundle
#                                  # started without LD_LIBRARY_PATH
#   scripts/gpu-round2.sh final    # tests-all, memcheck of the new tests, calls/graphs/host
#   scripts/gpu-round2.sh bench    # tests-all, then graphs.cu beside `cuda-mem bench` (the
#                                  # baseline sections against the committed 16-core run; then
#                                  # graphs, peers, host, shmoo), PyTorch's reference rows
set -u
out=${OUT:-/tmp/cuda-mem-out}; mkdir -p "$out/logs"
export CUDA_MEM_LOG_DIR="$out/logs" NCCL_NVLS_ENABLE=0
b=bundle/cuda-13.0; cm="$b/bin/cuda-mem"
py=python3; [ -x /opt/torch/.venv/bin/python ] && py=/opt/torch/.venv/bin/python
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
secs() { echo $(( $(date +%s) - $1 )); }
# The graph, IPC, launch, review and hot-path tests under memcheck (the tests that leak by
# design skipped, as run.sh --memcheck skips them).
memcheck_new() {
  local t; t=$(date +%s)
  CUDA_MEM_SANITIZER=1 CUDA_MEM_REQUIRE_GPU=1 CUDA_MEM_REQUIRE_IPC=1 CUDA_MEM_BIN="$PWD/$cm" \
    timeout "${MEMCHECK_SECS:-200}" compute-sanitizer --tool memcheck --leak-check full \
    --report-api-errors no --error-exitcode 97 --print-limit 20 \
    "$b/tests/tests-all" --test-threads=1 graph:: ipc:: launch:: review3:: review4:: hot:: \
    --skip ipc::an_exporter_that_exits_early \
    --skip review3::review3_a_pool_allocation_racing_a_capture_begin \
    --skip review3::review3_a_copy_racing_a_foreign_capture_begin >"$out/memcheck.txt" 2>&1
  echo "memcheck rc=$? in $(secs "$t") s"
  grep -E 'test result|ERROR SUMMARY|FAILED|panicked|Leaked' "$out/memcheck.txt" | head -20
}
case "${1:-verify}" in
verify)
  t=$(date +%s)
  CUDA_MEM_REQUIRE_IPC=1 timeout "${SUITE_SECS:-330}" "$b/run.sh" >"$out/suite.txt" 2>&1
  echo "run.sh rc=$? in $(secs "$t") s"; grep -E 'rc=|passed, .* failed' "$out/suite.txt" | head -40
  memcheck_new
  c=bundle/c12; t=$(date +%s)
  echo "== 12.0 load mode, no LD_LIBRARY_PATH, nothing named:"
  env -u LD_LIBRARY_PATH -u CUDA_MEM_CUDART "$c/bin/cuda-mem" info 2>&1 | head -8
  export CUDA_MEM_CUDART="$PWD/$c/lib/libcudart.so.12"
  echo "== 12.0 load mode, CUDA_MEM_CUDART=$CUDA_MEM_CUDART:"
  env -u LD_LIBRARY_PATH "$c/bin/cuda-mem" info 2>&1 | head -8
  for e in "$c"/tests/*; do
    env -u LD_LIBRARY_PATH CUDA_MEM_REQUIRE_GPU=1 CUDA_MEM_REQUIRE_IPC=1 CUDA_MEM_BIN="$PWD/$c/bin/cuda-mem" \
      timeout 150 "$e" --test-threads=1 >"$out/c12-$(basename "$e").txt" 2>&1
    echo "12.0 $(basename "$e") rc=$? $(grep -E '^test result' "$out/c12-$(basename "$e").txt" | tail -1)"
  done
  echo "12.0: $(secs "$t") s"
  ;;
bench)
  t=$(date +%s)
  CUDA_MEM_REQUIRE_GPU=1 CUDA_MEM_REQUIRE_IPC=1 CUDA_MEM_BIN="$PWD/$cm" \
    timeout 100 "$b/tests/tests-all" --test-threads=1 >"$out/tests-all.txt" 2>&1
  echo "tests-all rc=$? $(secs "$t") s: $(grep -E '^test result' "$out/tests-all.txt")"
  grep -E 'FAILED|panicked' "$out/tests-all.txt" | head -10
  nvcc -O2 -arch=sm_90 -o /tmp/graphs bundle/refbench/graphs.cu &&
    timeout 20 bash -c '{ /tmp/graphs; /tmp/graphs k; }' >"$out/graphs-ref.txt" 2>&1
  t=$(date +%s)
  timeout "${BENCH_SECS:-200}" "$cm" bench --sections copies,bidir,kernels,alloc,pools,calls \
    --baseline docs/results/issues-20-23/bench-16core.json --json "$out/bench.json" \
    >"$out/bench-run.txt" 2>&1; echo "bench rc=$? $(secs "$t") s"
  grep -E 'over raw|regress' "$out/bench-run.txt" | head -30
  t=$(date +%s)
  timeout "${BENCH2_SECS:-200}" "$cm" bench --sections graphs,peers,host,shmoo --json "$out/bench2.json" \
    >"$out/bench2-run.txt" 2>&1; echo "bench2 rc=$? $(secs "$t") s"
  grep -E 'graph nodes|/ raw:|x cudarc|failed|staged_vs_pinned|band|lowest|Verified' \
    "$out/bench2-run.txt" | cut -c1-150 | head -70
  timeout 60 "$py" scripts/torch-ref.py --bench "$out/bench2.json" --json "$out/torch-ref.json" \
    >"$out/torch-ref.txt" 2>&1; echo "torch-ref rc=$?"
  ;;
final)
  # The last state: tests-all, memcheck of the capture/graph/IPC/review tests, and the
  # sections that the last changes touch (calls, host, graphs beside graphs.cu).
  t=$(date +%s)
  CUDA_MEM_REQUIRE_GPU=1 CUDA_MEM_REQUIRE_IPC=1 CUDA_MEM_BIN="$PWD/$cm" \
    timeout 100 "$b/tests/tests-all" --test-threads=1 >"$out/tests-all.txt" 2>&1
  echo "tests-all rc=$? $(secs "$t") s: $(grep -E '^test result' "$out/tests-all.txt")"
  grep -E 'FAILED|panicked' "$out/tests-all.txt" | head -10
  memcheck_new
  nvcc -O2 -arch=sm_90 -o /tmp/graphs bundle/refbench/graphs.cu &&
    timeout 20 bash -c '{ /tmp/graphs; /tmp/graphs k; }' >"$out/graphs-ref.txt" 2>&1
  t=$(date +%s)
  timeout 150 "$cm" bench --sections calls,graphs,host --json "$out/final.json" \
    >"$out/final-run.txt" 2>&1; echo "bench rc=$? $(secs "$t") s"
  grep -E 'over raw|graph nodes|launch / raw|x cudarc|staged_vs_pinned|Verified' \
    "$out/final-run.txt" | cut -c1-150 | head -60
  ;;
esac
cd "$out" && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz . && ls
