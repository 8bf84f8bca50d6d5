#!/usr/bin/env bash
# The GPU calls of the third round on issue 22 (one H200), from the repository root over bundle/
# (scripts/bundle.sh; ../shared/refbench copied to bundle/refbench/; for `final`, bundle/old/
# tests-all: `cargo test --release -p cuda-mem-tests --test all --no-run` in a worktree of
# 7d4f9a4, the executable copied there). Logs go to $OUT, tarred.
#
#   scripts/gpu-round3.sh diag     # where the 100-kernel graph's time goes (scripts/diag/
#                                  # kdiag.cu: the same kernel from seven images), graphs.cu,
#                                  # `cuda-mem bench --sections graphs`, tests-all
#   scripts/gpu-round3.sh diag2    # graphs_diag (bundle/cuda-13.0/bin) and graphs.cu
#   scripts/gpu-round3.sh placed   # scripts/diag/placed.cu, graphs.cu, the bench's graphs section
#                                  # with the probes' PTX and with graphs.cu's cubin
#   scripts/gpu-round3.sh bench    # graphs.cu and `cuda-mem bench --sections graphs,calls`
#                                  # interleaved, three times each
#   scripts/gpu-round3.sh final    # run.sh (every test), the review's races before their fixes,
#                                  # graphs.cu beside `cuda-mem bench --sections graphs,calls` x2
#   scripts/gpu-round3.sh memcheck # run.sh --memcheck (the whole suite under memcheck)
#   scripts/gpu-round3.sh verify   # run.sh (every test), run.sh --memcheck (the whole suite)
set -u
out=${OUT:-/tmp/cuda-mem-out}; mkdir -p "$out/logs"
export CUDA_MEM_LOG_DIR="$out/logs" NCCL_NVLS_ENABLE=0
b=bundle/cuda-13.0; cm="$b/bin/cuda-mem"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
secs() { echo $(( $(date +%s) - $1 )); }
graphs_cpp() {
  nvcc -O2 -arch=sm_90 -o /tmp/graphs bundle/refbench/graphs.cu &&
    timeout 20 bash -c '{ /tmp/graphs; /tmp/graphs k; }' >>"$out/graphs-ref.txt" 2>&1
  grep -E 'graph:|eager:' "$out/graphs-ref.txt" | tail -4
}
graphs_ours() {  # $1: sections, $2: name, then more bench options
  local t s=$1 n=$2; shift 2; t=$(date +%s)
  timeout 150 "$cm" bench --sections "$s" --json "$out/$n.json" "$@" >"$out/$n.txt" 2>&1
  echo "bench $s $* rc=$? $(secs "$t") s"
  grep -E 'raw calls only|graph nodes|cuda-mem \(|cudarc: eager|/ raw:|x cudarc|over raw|Verified|failed' "$out/$n.txt" | cut -c1-170 | head -40
}
tests_all() {
  local t; t=$(date +%s)
  CUDA_MEM_REQUIRE_GPU=1 CUDA_MEM_REQUIRE_IPC=1 CUDA_MEM_BIN="$PWD/$cm" \
    timeout 120 "$b/tests/tests-all" --test-threads=1 >"$out/tests-all.txt" 2>&1
  echo "tests-all rc=$? $(secs "$t") s: $(grep -E '^test result' "$out/tests-all.txt")"
  grep -E 'FAILED|panicked' "$out/tests-all.txt" | head -10
}
case "${1:-diag}" in
diag)
  d=scripts/diag
  nvcc -O2 -arch=sm_90 -o /tmp/kdiag $d/kdiag.cu -lcuda &&
    nvcc -ptx -arch=compute_75 -o "$out/bump75.ptx" $d/bumpk.cu &&
    nvcc -cubin -arch=sm_90 -o /tmp/bump90.cubin $d/bumpk.cu &&
    ptxas -arch=sm_90 -o /tmp/probes90.cubin $d/probes.ptx &&
    { cuobjdump -sass /tmp/bump90.cubin; cuobjdump -sass /tmp/probes90.cubin; } >"$out/sass.txt" 2>&1
  timeout 60 /tmp/kdiag $d/probes.ptx "$out/bump75.ptx" /tmp/probes90.cubin /tmp/bump90.cubin \
    >"$out/kdiag.txt" 2>&1; echo "kdiag rc=$?"; cat "$out/kdiag.txt"
  graphs_cpp
  graphs_ours graphs graphs1
  graphs_ours graphs graphs-nvcc-image --kernel-image /tmp/bump90.cubin
  graphs_cpp
  [ -n "${NO_TESTS:-}" ] || tests_all
  ;;
placed)
  nvcc -O2 -arch=sm_90 -o /tmp/placed scripts/diag/placed.cu && timeout 60 /tmp/placed 8 >"$out/placed.txt" 2>&1
  echo "placed rc=$?"; cat "$out/placed.txt"
  graphs_cpp
  graphs_ours graphs graphs-placed
  nvcc -cubin -arch=sm_90 -o /tmp/bump90.cubin scripts/diag/bumpk.cu &&
    graphs_ours graphs graphs-placed-nvcc --kernel-image /tmp/bump90.cubin
  graphs_cpp
  ;;
diag2)
  mkdir -p "$out/dot"
  timeout 120 "$b/bin/graphs_diag" "$out/dot" >"$out/graphs-diag.txt" 2>&1; echo "graphs_diag rc=$?"
  cat "$out/graphs-diag.txt"
  graphs_cpp
  ;;
bench)
  tests_all
  for i in 1 2 3; do graphs_cpp; graphs_ours graphs,calls "bench$i"; done
  ;;
final)
  # Every test, the review's races on the code before their fixes (bundle/old/tests-all, built
  # from 7d4f9a4), and the bench beside graphs.cu, twice.
  t=$(date +%s)
  CUDA_MEM_REQUIRE_IPC=1 timeout "${SUITE_SECS:-330}" "$b/run.sh" >"$out/suite.txt" 2>&1
  echo "run.sh rc=$? in $(secs "$t") s"; grep -E 'rc=|passed, .* failed' "$out/suite.txt" | head -40
  if [ -x bundle/old/tests-all ]; then
    CUDA_MEM_REQUIRE_GPU=1 timeout 60 bundle/old/tests-all --test-threads=1 racing \
      >"$out/old-races.txt" 2>&1
    echo "before the fixes (7d4f9a4), the racing tests: rc=$?"
    grep -E '^test |test result' "$out/old-races.txt" | head -20
  fi
  for i in 1 2; do graphs_cpp; graphs_ours graphs,calls "final$i"; done
  ;;
memcheck)
  for i in 1 2; do
    CUDA_MEM_REQUIRE_GPU=1 timeout 30 "$b/tests/tests-all" --test-threads=1 --nocapture per_thread \
      >"$out/per-thread-$i.txt" 2>&1
    echo "per-thread tests, run $i: rc=$?"
    grep -E '^test |busy after|panicked|test result' "$out/per-thread-$i.txt" | head -12
  done
  t=$(date +%s)
  CUDA_MEM_REQUIRE_IPC=1 timeout "${MEMCHECK_SECS:-540}" "$b/run.sh" --memcheck >"$out/memcheck.txt" 2>&1
  echo "run.sh --memcheck rc=$? in $(secs "$t") s"
  grep -E 'rc=|passed, .* failed|ERROR SUMMARY|LEAK|example' "$out/memcheck.txt" | head -60
  ;;
verify)
  t=$(date +%s)
  CUDA_MEM_REQUIRE_IPC=1 timeout "${SUITE_SECS:-330}" "$b/run.sh" >"$out/suite.txt" 2>&1
  echo "run.sh rc=$? in $(secs "$t") s"; grep -E 'rc=|passed, .* failed' "$out/suite.txt" | head -40
  t=$(date +%s)
  CUDA_MEM_REQUIRE_IPC=1 timeout "${MEMCHECK_SECS:-400}" "$b/run.sh" --memcheck >"$out/memcheck.txt" 2>&1
  echo "run.sh --memcheck rc=$? in $(secs "$t") s"
  grep -E 'rc=|passed, .* failed|ERROR SUMMARY|LEAK' "$out/memcheck.txt" | head -40
  ;;
esac
cd "$out" && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz . && ls
