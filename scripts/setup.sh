#!/usr/bin/env bash
# Installs what cuda-mem needs to build, and nothing that is already there.
#
#   scripts/setup.sh            # libclang + (only when no CUDA toolkit is found) CUDA 13.0
#   CUDA_MEM_CUDA=12.9 scripts/setup.sh   # the CUDA 12.9 wheels instead, into .cuda/12.9
#
# Prints, as its last line, the toolkit root to build against (for `eval`-free use:
# `CUDA_PATH=$(scripts/setup.sh | tail -n1)`). A toolkit that is already installed is
# never modified: the wheels go into the project-local, git-ignored folder .cuda/<version>.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
want=${CUDA_MEM_CUDA:-}
log() { echo "setup: $*" >&2; }
sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# --- libclang, for bindgen ---------------------------------------------------
have_libclang() {
  [ -n "${LIBCLANG_PATH:-}" ] && ls "$LIBCLANG_PATH"/libclang*.so* >/dev/null 2>&1 && return 0
  ldconfig -p 2>/dev/null | grep -q 'libclang\(-[0-9.]*\)\?\.so' && return 0
  ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1
}
if ! have_libclang; then
  log "libclang not found: installing libclang-dev with apt-get"
  sudo_ apt-get update -qq >&2
  sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-dev >&2
fi

# --- CUDA toolkit ------------------------------------------------------------
is_toolkit() {
  [ -f "$1/include/cuda_runtime_api.h" ] || return 1
  local l; for l in lib64 lib lib/x86_64-linux-gnu; do
    compgen -G "$1/$l/libcudart*" >/dev/null && return 0
  done
  return 1
}

if [ -z "$want" ]; then
  # An installed toolkit wins: the same places the build script searches.
  for d in "${CUDA_PATH:-}" "${CUDA_HOME:-}" "${CUDA_ROOT:-}" "${CUDA_TOOLKIT_ROOT_DIR:-}" \
           "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/bin/nvcc)")")" \
           /usr/local/cuda /opt/cuda /usr; do
    if [ -n "$d" ] && is_toolkit "$d"; then log "using the installed toolkit at $d"; echo "$d"; exit 0; fi
  done
  want=13.0
fi

case "$want" in
  13.0) wheels=(nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88) ;;
  12.9) wheels=(nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-nvcc-cu12==12.9.86) ;;
  *) log "unknown CUDA_MEM_CUDA=$want (known: 13.0, 12.9)"; exit 2 ;;
esac
root="$here/.cuda/$want"
if is_toolkit "$root"; then log "CUDA $want wheels already in $root"; echo "$root"; exit 0; fi

if ! python3 -m pip --version >/dev/null 2>&1; then
  log "pip not found: installing python3-pip with apt-get"
  sudo_ apt-get update -qq >&2
  sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >&2
fi
command -v unzip >/dev/null || { sudo_ apt-get update -qq >&2; sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq unzip >&2; }
dl="$here/.cuda/wheels-$want"
mkdir -p "$dl"
log "downloading ${wheels[*]} into $dl"
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
  -d "$dl" "${wheels[@]}" >&2
tmp=$(mktemp -d)
for w in "$dl"/*.whl; do unzip -q -o "$w" 'nvidia/*' -d "$tmp"; done
rm -rf "$root"; mkdir -p "$root/include" "$root/lib"
# The wheels spread one toolkit over several folders: cu13/ (13.x), cuda_runtime/ and
# cuda_nvcc/ (12.x). Merge the headers (crt/ included) and cudart into one root.
for sub in cu13 cuda_runtime cuda_nvcc; do
  [ -d "$tmp/nvidia/$sub/include" ] && cp -r "$tmp/nvidia/$sub/include/." "$root/include/"
  [ -d "$tmp/nvidia/$sub/lib" ] && cp "$tmp/nvidia/$sub/lib/"libcudart* "$root/lib/" 2>/dev/null || true
done
rm -rf "$tmp"
for so in "$root"/lib/libcudart.so.*; do [ -e "$so" ] && ln -sf "$(basename "$so")" "$root/lib/libcudart.so"; done
is_toolkit "$root" || { log "the wheels did not give a usable toolkit in $root"; exit 1; }
log "CUDA $want ready in $root"
echo "$root"
