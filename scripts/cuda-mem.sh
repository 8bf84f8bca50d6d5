#!/usr/bin/env bash
# The main job: builds the `cuda-mem` command line in release mode and runs it.
#
#   scripts/cuda-mem.sh                 # cuda-mem bench: what each kind of memory costs here
#   scripts/cuda-mem.sh info            # devices and their memory capabilities
#   scripts/cuda-mem.sh bench --quick   # under 30 s
#
# Installs what is missing by itself (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(scripts/setup.sh | tail -n1)
export CUDA_PATH="$root"
cargo build --release -q -p cuda-mem-cli
[ $# -gt 0 ] || set -- bench
exec target/release/cuda-mem "$@"
