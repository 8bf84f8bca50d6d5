#!/usr/bin/env bash
# Builds every test, example and the cuda-mem binary of the workspace in release mode into one
# self-contained folder, with a runner, for an x86-64 Linux machine that has only the NVIDIA
# driver (cudart is linked statically).
#
#   scripts/bundle.sh                     # bundle/cuda-13.0/ (or the installed toolkit's)
#   CUDA_MEM_CUDA=12.9 scripts/bundle.sh  # bundle/cuda-12.9/
#
# On the GPU machine:  bundle/cuda-13.0/run.sh            (ends with `N passed, M failed`)
#                      bundle/cuda-13.0/run.sh --memcheck (each test under compute-sanitizer)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(scripts/setup.sh | tail -n1)
export CUDA_PATH="$root"
ver=$(awk '/#define CUDART_VERSION/ {print int($3/1000) "." int($3%1000/10); exit}' "$root/include/cuda_runtime_api.h")
out="bundle/cuda-$ver"
rm -rf "$out"; mkdir -p "$out/tests" "$out/bin"

# Executables from cargo's JSON messages: "<package>-<target>" for tests, plain names else.
collect() {
  python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"): continue
    t = m["target"]; pkg = m["package_id"].split("#")[0].rstrip("/").split("/")[-1]
    if m["profile"]["test"]:
        print("tests", pkg + "-" + t["name"], m["executable"])
    else:
        print("bin", t["name"], m["executable"])
'
}
{
  cargo test --release --workspace --no-run --message-format=json 2>/dev/null
  cargo build --release --workspace --bins --examples --message-format=json 2>/dev/null
} | collect | while read -r dir name exe; do
  cp "$exe" "$out/$dir/$name"
done
cp scripts/bundle-run.sh "$out/run.sh"
chmod +x "$out/run.sh"
echo "CUDA $ver" > "$out/VERSION"
du -sh "$out"
ls "$out/tests" "$out/bin"
