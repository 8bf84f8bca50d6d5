#!/usr/bin/env bash
# The GPU calls of the fourth round on issue 22 (one H200), from the repository root over
# bundle/ (scripts/bundle.sh; ../shared/refbench copied to bundle/refbench/). Logs go to $OUT,
# tarred.
#
#   scripts/gpu-round4.sh procs   # graphs.cu as it is (k and mixed), then `cuda-mem bench
#                                 # --sections graphs --graphs-reference`: graphs.cu's protocol
#                                 # process by process beside graphs.cu itself, twice (the
#                                 # second with graphs.cu's own kernel image)
#   scripts/gpu-round4.sh final   # tests-all, the new tests under memcheck, the hot-path
#                                 # harness's graph rows, graphs.cu and the bench's graphs
#                                 # section three times
set -u
out=${OUT:-/tmp/cuda-mem-out}; mkdir -p "$out/logs"
export CUDA_MEM_LOG_DIR="$out/logs" NCCL_NVLS_ENABLE=0
b=bundle/cuda-13.0; cm="$b/bin/cuda-mem"
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm,clocks.max.sm --format=csv,noheader
secs() { echo $(( $(date +%s) - $1 )); }
# graphs.cu as it is, and the same file with its figures printed to three decimals (its host
# time is ~1.5 us: one decimal is a step of 6%); nothing else differs (the diff is printed).
build_refs() {
  nvcc -O2 -arch=sm_90 -o /tmp/graphs bundle/refbench/graphs.cu &&
    sed 's/%\.1f/%.3f/g' bundle/refbench/graphs.cu >/tmp/graphs_fine.cu &&
    nvcc -O2 -arch=sm_90 -o /tmp/graphs_fine /tmp/graphs_fine.cu &&
    nvcc -cubin -arch=sm_90 -o /tmp/bump90.cubin scripts/diag/bumpk.cu
  diff bundle/refbench/graphs.cu /tmp/graphs_fine.cu >"$out/graphs-fine.diff"; cat "$out/graphs-fine.diff"
}
graphs_cpp() {
  timeout 20 bash -c '{ /tmp/graphs; /tmp/graphs k; }' >>"$out/graphs-ref.txt" 2>&1
  grep -E 'graph:|eager:' "$out/graphs-ref.txt" | tail -4
}
bench_graphs() {  # $1: name, then more bench options
  local t n=$1; shift; t=$(date +%s)
  timeout 240 "$cm" bench --sections graphs --graphs-reference /tmp/graphs_fine \
    --json "$out/$n.json" "$@" >"$out/$n.txt" 2>&1
  echo "bench graphs $* rc=$? $(secs "$t") s"
  grep -E 'process|graphs_processes|raw calls only|cuda-mem \(|/ raw:|x cudarc|Verified|failed' "$out/$n.txt" | cut -c1-230 | head -60
}
tests_all() {
  local t; t=$(date +%s)
  CUDA_MEM_REQUIRE_GPU=1 CUDA_MEM_REQUIRE_IPC=1 CUDA_MEM_BIN="$PWD/$cm" \
    timeout 150 "$b/tests/tests-all" --test-threads=1 >"$out/tests-all.txt" 2>&1
  echo "tests-all rc=$? $(secs "$t") s: $(grep -E '^test result' "$out/tests-all.txt")"
  grep -E 'FAILED|panicked' "$out/tests-all.txt" | head -10
}
case "${1:-procs}" in
procs)
  build_refs
  graphs_cpp
  bench_graphs procs1
  [ -n "${ONE:-}" ] || bench_graphs procs2-nvcc-image --kernel-image /tmp/bump90.cubin
  graphs_cpp
  ;;
final)
  build_refs
  tests_all
  t=$(date +%s)
  CUDA_MEM_REQUIRE_GPU=1 CUDA_MEM_REQUIRE_IPC=1 timeout 200 compute-sanitizer --tool memcheck \
    --leak-check full --error-exitcode 9 "$b/tests/tests-all" --test-threads=1 review7 graph_launches_go \
    capturing_stream inside_a_capture >"$out/memcheck-new.txt" 2>&1
  echo "memcheck, the new tests (review7, IPC under capture) rc=$? $(secs "$t") s"
  grep -E '^test |test result|ERROR SUMMARY|LEAK' "$out/memcheck-new.txt" | head -20
  # The launches' host cost over the raw call in one process, many interleaved pairs (the
  # graph rows of the hot-path harness, on the real runtime: a captured memset of 1 and 3 buffers).
  HOT_PATH_ONLY=graph timeout 120 "$b/bin/hot_path" 41 512 >"$out/hot-path-graph.txt" 2>&1
  echo "hot_path graph rows rc=$?"; cat "$out/hot-path-graph.txt"
  for i in 1 2 3; do graphs_cpp; bench_graphs "final$i"; done
  ;;
esac
cd "$out" && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz . && ls
