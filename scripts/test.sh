#!/usr/bin/env bash
# Runs every check and test of the workspace: formatting, clippy, docs, the CPU test suite
# (GPU tests skip visibly without a device; CUDA_MEM_REQUIRE_GPU=1 makes them fail instead)
# and Miri over the code that needs no GPU (where the nightly Miri component is installed).
#
#   scripts/test.sh                        # against the installed toolkit, or CUDA 13.0 wheels
#   CUDA_MEM_CUDA=12.0 scripts/test.sh     # against the CUDA 12.0 wheels (any 12.x / 13.x)
#   CUDA_MEM_CUDA=newest scripts/test.sh   # against the newest runtime on PyPI
#   CUDA_MEM_SKIP_MIRI=1 scripts/test.sh   # everything but Miri (CI runs Miri once)
#
# Installs what is missing by itself (scripts/setup.sh): libclang, and the CUDA wheels into
# .cuda/ only when no toolkit is found (or the one asked for). Builds into CARGO_TARGET_DIR
# when set; switching toolkits rebuilds only cuda-mem-sys and the crates that depend on it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(scripts/setup.sh | tail -n1)
export CUDA_PATH="$root"
# No LD_LIBRARY_PATH: a toolkit without libcudart_static.a (the 12.x wheels) has cudart opened
# at run time from the file the build found (cuda-mem-sys/src/loader.rs).
echo "== cuda-mem tests against $CUDA_PATH"
export RUSTFLAGS="${RUSTFLAGS:-} -D warnings"
export RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings"

cargo fmt --all -- --check
# cuda-mem's modules form layers: an import cycle among them fails the run.
python3 scripts/check-layers.py
# cuda-mem alone, with its default features: free of cudarc (the tests crate turns the `cudarc`
# feature on for every workspace build below, so that the interop tests and the cudarc_kernel
# example are built and checked on every toolkit), and clean without it.
if cargo tree -p cuda-mem -e normal --prefix none | grep -q '^cudarc '; then
  echo "cudarc is a dependency of cuda-mem's default build"; exit 1
fi
# The cuda-mem binary, built alone as scripts/bundle.sh and scripts/cuda-mem.sh build it, never
# has the fault seams (`testing`) compiled in: it asks for `measure` only. (A workspace build
# unifies `testing` in from the tests crate, so those scripts build the binary on its own.)
cli_features=$(cargo tree -p cuda-mem-cli -e features -i cuda-mem)
if grep -qF 'cuda-mem feature "testing"' <<<"$cli_features"; then
  echo "cuda-mem-cli's own build enables cuda-mem's \`testing\` feature (its fault seams):"
  echo "$cli_features"; exit 1
fi
grep -qF 'cuda-mem feature "measure"' <<<"$cli_features" ||
  { echo "cuda-mem-cli's feature tree does not show cuda-mem's \`measure\`:"; echo "$cli_features"; exit 1; }
cargo clippy -p cuda-mem --lib -- -D warnings
cargo doc -p cuda-mem --no-deps
cargo clippy --workspace --all-targets -- -D warnings
cargo doc --workspace --no-deps
cargo test --workspace

if [ -n "${CUDA_MEM_SKIP_MIRI:-}" ]; then
  echo "SKIP Miri: CUDA_MEM_SKIP_MIRI is set"
  exit 0
fi
if ! cargo +nightly miri --version >/dev/null 2>&1 && command -v rustup >/dev/null; then
  echo "== installing Miri (rustup component add miri --toolchain nightly)"
  timeout 600 rustup component add miri rust-src --toolchain nightly >/dev/null 2>&1 || true
fi
if cargo +nightly miri --version >/dev/null 2>&1; then
  echo "== Miri (code that needs no GPU)"
  # Every unit test of cuda-mem, with the features that compile them all (`measure`: a pooled
  # buffer's whole bookkeeping on stand-in handles; `testing`: the seams' fields). None makes
  # a runtime call (the GPU tests live in the tests crate); the few that do what Miri cannot
  # (an mmap it does not model, inline asm) say so with `#[cfg_attr(miri, ignore = "...")]`.
  cargo +nightly miri test -p cuda-mem --lib --features testing,measure
else
  echo "SKIP Miri: the nightly toolchain with the miri component is not installed" \
       "(rustup toolchain install nightly --component miri)"
fi
