#!/usr/bin/env bash
# Builds every test, example and the cuda-mem binary of the workspace in release mode into one
# self-contained folder, with a runner, for an x86-64 Linux machine that has only the NVIDIA
# driver. The cuda-mem binary is built on its own (`-p cuda-mem-cli`), without the library's
# fault seams, which a workspace build unifies in from the tests crate (feature `testing`).
# cudart is linked statically where the toolkit has libcudart_static.a; otherwise
# (the CUDA 12.0 to 12.6 wheels) cuda-mem-sys opens it at run time, and the bundle carries the
# toolkit's libcudart.so.N in lib/, found through the executables' rpath ($ORIGIN/../lib)
# and run.sh's LD_LIBRARY_PATH (the path baked in at build time does not exist there).
#
#   scripts/bundle.sh                         # bundle/cuda-13.0/ (or the installed toolkit's)
#   CUDA_MEM_CUDA=12.0 scripts/bundle.sh      # bundle/cuda-12.0/ (dynamic cudart carried)
#   CUDA_MEM_CUDA=newest scripts/bundle.sh    # bundle/cuda-13.5/ (today's newest on PyPI)
#
# Builds into CARGO_TARGET_DIR when set (executables are taken from cargo's JSON messages).
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
# The rpath costs nothing where cudart is static; where it is not, it finds bundle/lib.
export RUSTFLAGS="${RUSTFLAGS:-} -C link-arg=-Wl,-rpath,\$ORIGIN/../lib"
msgs=$(mktemp)
trap 'rm -f "$msgs"' EXIT
# Build output goes to stderr (errors stay visible); only the JSON is read.
cargo test --release --workspace --no-run --message-format=json >"$msgs"
cargo build --release --workspace --bins --examples --message-format=json >>"$msgs"
# Not the workspace's cuda-mem binary: it has cuda-mem's `testing` feature (the fault seams).
collect <"$msgs" | while read -r dir name exe; do
  if [ "$dir/$name" != bin/cuda-mem ]; then cp "$exe" "$out/$dir/$name"; fi
done
# The shipped binary, built alone: only the features cuda-mem-cli asks for (`measure`). It is
# copied at once: both builds write the same target/release/cuda-mem.
cargo build --release -p cuda-mem-cli --bin cuda-mem --message-format=json >"$msgs"
collect <"$msgs" | while read -r dir name exe; do
  if [ "$dir/$name" = bin/cuda-mem ]; then cp "$exe" "$out/bin/cuda-mem"; fi
done
[ -x "$out/bin/cuda-mem" ] || { echo "bundle.sh: no cuda-mem executable was built" >&2; exit 1; }
# Proof that it is that build: no string of the test seams (string literals survive stripping),
# and its version line names the library features it was built with.
if grep -qaF 'forced by cuda_mem::testing' "$out/bin/cuda-mem"; then
  echo "bundle.sh: bin/cuda-mem carries cuda-mem's test seams (feature \`testing\`)" >&2; exit 1
fi

# A cudart that is not linked in travels with the bundle: one linked dynamically (a NEEDED
# entry, CUDA_MEM_SYS_LINK=dynamic) or one opened at run time (the executables then carry the
# name of cuda-mem-sys's loader variable, CUDA_MEM_CUDART).
need=$(readelf -d "$out/bin/cuda-mem" | sed -n 's/.*NEEDED.*\[\(libcudart\.so[^]]*\)\].*/\1/p')
if [ -z "$need" ] && grep -qaF CUDA_MEM_CUDART "$out/bin/cuda-mem"; then
  need="libcudart.so.${ver%%.*}"
fi
link="static cudart"
if [ -n "$need" ]; then
  lib=$(find -L "$root" -name "$need" -type f 2>/dev/null | head -n1)
  [ -n "$lib" ] || { echo "bundle.sh: $need not found under $root" >&2; exit 1; }
  mkdir -p "$out/lib"
  cp -L "$lib" "$out/lib/$need"
  link="cudart not linked in: lib/$need"
fi
# (`--version` makes no CUDA call.)
features=$("$out/bin/cuda-mem" --version)
case "$features" in
  *"library features: "*testing*) echo "bundle.sh: $features: built with \`testing\`" >&2; exit 1 ;;
  *"library features: "*) ;;
  *) echo "bundle.sh: bin/cuda-mem --version names no library features: $features" >&2; exit 1 ;;
esac
# The C++ and PyTorch references that `gpu-session.sh bench|multi` build and run, beside the
# bundles (bundle/refbench/), from $CUDA_MEM_REFBENCH (default /work/shared/refbench).
refbench=${CUDA_MEM_REFBENCH:-/work/shared/refbench}
if [ -d "$refbench" ]; then
  mkdir -p bundle/refbench
  cp "$refbench"/*.cu "$refbench"/*.py bundle/refbench/ 2>/dev/null || true
fi
cp scripts/bundle-run.sh "$out/run.sh"
chmod +x "$out/run.sh"
printf 'CUDA %s (%s), headers from %s\n' "$ver" "$link" "$root" > "$out/VERSION"
printf '%s\n' "$features" >> "$out/VERSION"
[ -f "$root/WHEELS" ] && sed 's/^/  wheel /' "$root/WHEELS" >> "$out/VERSION"
du -sh "$out"
ls "$out/tests" "$out/bin"
