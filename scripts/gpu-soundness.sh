#!/usr/bin/env bash
# The soundness work's GPU call (issue 19), from the repository root on a machine with the
# NVIDIA driver, over bundles made by scripts/bundle.sh (copied to bundle/). Each step is
# chosen by a variable, so that one call does what the device time allows; logs go to $OUT.
#
#   SUITE=1        bundle/cuda-13.0/run.sh: every test, one at a time, CUDA_MEM_REQUIRE_GPU=1
#   RANDOM_PROGRAMS=N RANDOM_OPS=M
#                  the randomized model test at that size (bundle/cuda-13.0/tests/tests-random)
#   NEG=1          negative controls: every bundle/neg-*/ folder holds a test executable built
#                  from the code *before* a fix (or with one fix reverted) and the tests to run
#                  (FILTERS: one test name filter a line; ENV: variables for it). Each is
#                  expected to FAIL; the line says whether it did.
#   MEMCHECK=1     bundle/cuda-13.0/run.sh --memcheck (the suite under compute-sanitizer)
#
# Exit status: nonzero when the suite, the randomized run or memcheck failed (a negative
# control that passes is reported, not an exit status: it shows what a test cannot catch).
set -u
out=${OUT:-/tmp/cuda-mem-out}; mkdir -p "$out/logs"
export CUDA_MEM_LOG_DIR="$out/logs"
export NCCL_NVLS_ENABLE=0
b=bundle/cuda-13.0; [ -d "$b" ] || b=$(ls -d bundle/cuda-* | head -n1)
status=0
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
secs() { echo $(( $(date +%s) - $1 )); }

if [ "${SUITE:-0}" = 1 ]; then
  t=$(date +%s)
  echo "== suite ($b)"
  timeout "${SUITE_SECS:-420}" "$b/run.sh" >"$out/suite.txt" 2>&1; rc=$?
  grep -E 'rc=|passed, .* failed|FAILED|panicked' "$out/suite.txt" | head -60
  echo "suite rc=$rc in $(secs "$t") s"; [ "$rc" = 0 ] || status=1
fi

if [ "${RANDOM_PROGRAMS:-0}" != 0 ]; then
  t=$(date +%s)
  echo "== randomized model test: $RANDOM_PROGRAMS programs x ${RANDOM_OPS:-200} ops"
  CUDA_MEM_REQUIRE_GPU=1 CUDA_MEM_RANDOM_PROGRAMS=$RANDOM_PROGRAMS \
    CUDA_MEM_RANDOM_OPS=${RANDOM_OPS:-200} timeout "${RANDOM_SECS:-400}" \
    "$b/tests/tests-random" --test-threads=1 --nocapture >"$out/random.txt" 2>&1; rc=$?
  grep -E '^random|mismatch|FAILED|panicked|test result' "$out/random.txt" | head -40
  echo "random rc=$rc in $(secs "$t") s"; [ "$rc" = 0 ] || status=1
fi

if [ "${NEG:-0}" = 1 ]; then
  for n in bundle/neg-*/; do
    [ -d "$n" ] || continue
    name=$(basename "$n")
    exe=$(ls "$n"/tests-* | head -n1)
    while read -r filter; do
      [ -n "$filter" ] || continue
      t=$(date +%s)
      log="$out/logs/$name-$(echo "$filter" | tr -c 'A-Za-z0-9_' _).txt"
      ( [ -f "$n/ENV" ] && set -a && . "$n/ENV"; set +a
        CUDA_MEM_REQUIRE_GPU=1 timeout "${NEG_SECS:-120}" "$exe" "$filter" --test-threads=1 \
          --nocapture >"$log" 2>&1 ); rc=$?
      verdict="FAILED as expected"; [ "$rc" = 0 ] && verdict="PASSED (the control caught nothing)"
      echo "NEG $name $filter: rc=$rc $verdict ($(secs "$t") s)"
      grep -E "panicked|assertion|^random.*mismatch|^MISMATCH|minimal|test result" "$log" | head -8 | sed 's/^/    /'
    done <"$n/FILTERS"
  done
fi

if [ "${MEMCHECK:-0}" = 1 ]; then
  t=$(date +%s)
  echo "== memcheck ($b)"
  timeout "${MEMCHECK_SECS:-400}" "$b/run.sh" --memcheck >"$out/memcheck.txt" 2>&1; rc=$?
  grep -E 'rc=|ERROR SUMMARY|LEAK SUMMARY|passed, .* failed' "$out/memcheck.txt" | head -40
  echo "memcheck rc=$rc in $(secs "$t") s"; [ "$rc" = 0 ] || status=1
fi
tar czf "$out/logs.tgz" -C "$out" logs 2>/dev/null && rm -rf "$out/logs"
exit $status
