#!/usr/bin/env bash
# The main job: builds the `cuda-mem` command line in release mode and runs it.
#
#   scripts/cuda-mem.sh                 # cuda-mem bench: what each kind of memory costs here
#   scripts/cuda-mem.sh info            # devices and their memory capabilities
#   scripts/cuda-mem.sh bench --quick   # under 30 s
#
# Installs what is missing by itself (scripts/setup.sh). Honours CARGO_TARGET_DIR (and any
# target-dir in cargo's configuration): the binary is taken from cargo's own report.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(scripts/setup.sh | tail -n1)
export CUDA_PATH="$root"
# Built on its own (`-p cuda-mem-cli`, never with the workspace): a workspace build unifies in
# cuda-mem's `testing` feature (the fault seams) from the tests crate.
exe=$(cargo build --release -q -p cuda-mem-cli --bin cuda-mem --message-format=json |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda-mem":
        print(m["executable"])')
[ -n "$exe" ] || { echo "cuda-mem.sh: cargo reported no cuda-mem executable" >&2; exit 1; }
if grep -qaF 'forced by cuda_mem::testing' "$exe"; then
  echo "cuda-mem.sh: $exe carries cuda-mem's test seams (feature \`testing\`)" >&2; exit 1
fi
[ $# -gt 0 ] || set -- bench
exec "$exe" "$@"
