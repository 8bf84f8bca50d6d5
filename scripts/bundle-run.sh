#!/usr/bin/env bash
# Runner of a bundle made by scripts/bundle.sh: runs every test executable (one test at a
# time) and every example with CUDA_MEM_REQUIRE_GPU=1, so GPU tests fail rather than skip when
# no device is found, and ends with one line `N passed, M failed`.
#
#   run.sh              # everything
#   run.sh --memcheck   # the executables that use the GPU (integration suite, sys smoke
#                       # test, examples) under compute-sanitizer --tool memcheck with leak
#                       # checking; skips the deliberate-fault and exit-time child tests.
#                       # CUDA API errors are not reported: the suite provokes them on purpose
#                       # (out of memory, double registration) and checks them itself.
#
# tests/tests-random (the randomized model test) runs its small default here (20 programs of
# 100 operations; 5 under --memcheck); the big run is selected by its environment, e.g.
#   CUDA_MEM_RANDOM_PROGRAMS=1000 CUDA_MEM_RANDOM_OPS=200 tests/tests-random --nocapture
set -u
here=$(cd "$(dirname "$0")" && pwd)
# A bundle built against a toolkit without libcudart_static.a carries libcudart.so.N here.
[ -d "$here/lib" ] && export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
head -n1 "$here/VERSION" 2>/dev/null
export CUDA_MEM_REQUIRE_GPU=1
export CUDA_MEM_BIN="$here/bin/cuda-mem"
export CUDA_MEM_STRESS_SECS="${CUDA_MEM_STRESS_SECS:-10}"
memcheck=0
[ "${1:-}" = "--memcheck" ] && memcheck=1
# Under the sanitizer kernels are serialized and slow: timing preconditions become notes.
[ $memcheck = 1 ] && export CUDA_MEM_SANITIZER=1
sanitizer=(compute-sanitizer --tool memcheck --leak-check full --report-api-errors no
           --error-exitcode 97 --print-limit 20)
passed=0; failed=0
log_dir="${CUDA_MEM_LOG_DIR:-$here/logs}"; mkdir -p "$log_dir"

run_tests() {  # $1: executable; rest: extra args
  local exe=$1; shift
  local name; name=$(basename "$exe")
  local log="$log_dir/$name.log"; [ $memcheck = 1 ] && log="$log_dir/$name.memcheck.log"
  local cmd=("$exe" --test-threads=1 --nocapture "$@")
  [ $memcheck = 1 ] && cmd=("${sanitizer[@]}" "${cmd[@]}")
  "${cmd[@]}" >"$log" 2>&1; local rc=$?
  local p f
  read -r p f < <(awk '/^test result:/ { for (i = 1; i < NF; i++) {
      if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
    END { print p + 0, f + 0 }' "$log")
  if [ $rc -ne 0 ] && [ "$f" = 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
  printf '%-40s rc=%-3s passed=%-4s failed=%s\n' "$name" "$rc" "$p" "$f"
  if [ $rc -ne 0 ] || [ "$f" != 0 ]; then
    grep -E 'FAILED|panicked|ERROR SUMMARY|Invalid|error' "$log" | head -40
  fi
  if [ $memcheck = 1 ]; then grep -E 'ERROR SUMMARY' "$log" | sed 's/^/    /'; fi
}

for exe in "$here"/tests/*; do
  [ -x "$exe" ] || continue
  if [ $memcheck = 1 ]; then
    case "$(basename "$exe")" in
      tests-all | tests-random | cuda-mem-sys-smoke) ;;
      *) continue ;;  # no GPU code (unit tests), or the CLI's bench as child processes
    esac
    CUDA_MEM_LEAK_CYCLES="${CUDA_MEM_LEAK_CYCLES:-1000}" CUDA_MEM_STRESS_SECS=3 \
      CUDA_MEM_RANDOM_PROGRAMS="${CUDA_MEM_RANDOM_PROGRAMS:-5}" \
      run_tests "$exe" --skip faults:: --skip multi_gpu:: \
        --skip review::review_a_forgotten_nccl_group \
        --skip review::review_staged_copy_ring_reuse_waits_and_survives_forget \
        --skip ipc::an_exporter_that_exits_early \
        --skip review3::review3_a_pool_allocation_racing_a_capture_begin \
        --skip review3::review3_a_copy_racing_a_foreign_capture_begin \
        --skip review7::review7_a_buffer_given_up_to_a_foreign_capture
      # (The two skipped review tests leak on purpose: a forgotten NCCL group's communicator,
      # and a forgotten StagedCopy's 2 MiB staging ring; `mem::forget` is safe and leaks. The
      # IPC test's child exporter exits without freeing, which is what it tests. The two
      # review3 races leak by design: a pool free refused during another thread's capture, and
      # buffers given up to a foreign capture; so does review7's given-up pair, 256 KiB each,
      # one pooled and one cudaMalloc: memcheck reported exactly those two, round 4.)
  else
    run_tests "$exe"
  fi
done

for exe in "$here"/bin/*; do
    case "$(basename "$exe")" in cuda-mem) continue ;; esac
    # A CPU benchmark: no CUDA call, which the sanitizer reports as an error.
    [ $memcheck = 1 ] && [ "$(basename "$exe")" = pool_bookkeeping ] && continue
    # A timing diagnostic of raw graph replays (thousands of launches): minutes under the
    # sanitizer, and nothing of the library's memory handling that the suite does not cover.
    [ $memcheck = 1 ] && [ "$(basename "$exe")" = graphs_diag ] && continue
    name=$(basename "$exe")
    cmd=("$exe")
    # (graphs_diag writes its graphs' DOT files into the directory it is given.)
    [ "$name" = graphs_diag ] && cmd+=("$log_dir")
    [ $memcheck = 1 ] && cmd=("${sanitizer[@]}" "$exe")
    if "${cmd[@]}" >"$log_dir/example-$name.log" 2>&1; then
      passed=$((passed + 1)); printf '%-40s ok\n' "example $name"
    else
      failed=$((failed + 1)); printf '%-40s FAILED\n' "example $name"; tail -20 "$log_dir/example-$name.log"
    fi
    [ $memcheck = 1 ] && grep -E 'ERROR SUMMARY|LEAK SUMMARY' "$log_dir/example-$name.log" | sed 's/^/    /'
done
echo "$passed passed, $failed failed"
[ $failed = 0 ]
