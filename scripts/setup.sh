#!/usr/bin/env bash
# Installs what cuda-mem needs to build, and nothing that is already there.
#
#   scripts/setup.sh                          # libclang + (only when no toolkit is found) CUDA 13.0
#   CUDA_MEM_CUDA=12.0 scripts/setup.sh       # any 12.x or 13.x: its runtime wheels, into .cuda/12.0
#   CUDA_MEM_CUDA=newest scripts/setup.sh     # the newest nvidia-cuda-runtime on PyPI, today
#
# The exact wheel versions are resolved with `pip index versions` (newest patch release of
# that X.Y). Prints, as its last line, the toolkit root to build against (for `eval`-free use:
# `CUDA_PATH=$(scripts/setup.sh | tail -n1)`). A toolkit that is already installed is
# never modified: the wheels go into the project-local, git-ignored folder .cuda/<X.Y>.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
want=${CUDA_MEM_CUDA:-}
log() { echo "setup: $*" >&2; }
sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_install() {
  log "installing $* with apt-get"
  sudo_ apt-get update -qq >&2
  sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# --- libclang, for bindgen ---------------------------------------------------
# What bindgen (clang-sys) loads: libclang.so, libclang-N.so or libclang.so.N (also
# libclang-N.so.M). Never libclang-cpp.so.N: that is the C++ library, which bindgen cannot use.
is_libclang() {
  local n; n=$(basename "$1")
  case "$n" in libclang-cpp*) return 1 ;; esac
  [[ "$n" =~ ^libclang(-[0-9.]+)?\.so(\.[0-9]+)*$ ]]
}
have_libclang() {
  local f
  for f in ${LIBCLANG_PATH:+"$LIBCLANG_PATH"/libclang*.so*} \
           /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/x86_64-linux-gnu/libclang*.so* \
           /usr/lib64/libclang*.so* /usr/local/lib/libclang*.so*; do
    is_libclang "$f" && return 0
  done
  local line
  while read -r line; do is_libclang "${line##*=> }" && return 0; done \
    < <(ldconfig -p 2>/dev/null | grep 'libclang' || true)
  return 1
}
if [ "${1:-}" = "--libclang-check" ]; then  # for tests: is this a libclang? ($2)
  is_libclang "$2"; exit
fi
if ! have_libclang; then
  log "libclang not found (libclang-cpp does not count)"
  apt_install libclang-dev
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
  nvcc_root=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/bin/nvcc)")")
  for d in "${CUDA_PATH:-}" "${CUDA_HOME:-}" "${CUDA_ROOT:-}" "${CUDA_TOOLKIT_ROOT_DIR:-}" \
           "$nvcc_root" /usr/local/cuda /usr/local/cuda-1[23].* /opt/cuda \
           ${CONDA_PREFIX:+"$CONDA_PREFIX/targets/x86_64-linux"} /usr; do
    if [ -n "$d" ] && is_toolkit "$d"; then log "using the installed toolkit at $d"; echo "$d"; exit 0; fi
  done
  want=13.0
fi

if ! python3 -m pip --version >/dev/null 2>&1; then apt_install python3-pip; fi
command -v unzip >/dev/null || apt_install unzip

# Newest version of package $1 on PyPI whose number starts with $2 ("" = newest of all).
pypi_newest() {
  local line
  line=$(python3 -m pip index versions "$1" 2>/dev/null | sed -n 's/^Available versions: //p')
  [ -n "$line" ] || { log "pip index versions $1 failed (no network, or no such package)"; return 1; }
  local pattern="^"
  [ -z "$2" ] || pattern="^${2//./\\.}(\\.|$)"
  tr ',' '\n' <<<"$line" | tr -d ' ' | { grep -E "$pattern" || true; } | head -n1
}

if [ "$want" = newest ]; then
  v=$(pypi_newest nvidia-cuda-runtime "") || exit 1
  [ -n "$v" ] || { log "no nvidia-cuda-runtime version on PyPI"; exit 1; }
  want=$(cut -d. -f1,2 <<<"$v")
  log "newest CUDA runtime on PyPI: $v (CUDA $want)"
fi
[[ "$want" =~ ^(12|13)\.[0-9]+$ ]] || { log "CUDA_MEM_CUDA=$want: expected 12.x, 13.x or newest"; exit 2; }
root="$here/.cuda/$want"
if is_toolkit "$root"; then log "CUDA $want wheels already in $root"; echo "$root"; exit 0; fi

# 13.x: nvidia-cuda-runtime + nvidia-cuda-crt. 12.x: nvidia-cuda-runtime-cu12 + the crt/
# headers that ship in nvidia-cuda-nvcc-cu12.
case "$want" in
  13.*) pkgs=(nvidia-cuda-runtime nvidia-cuda-crt) ;;
  12.*) pkgs=(nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12) ;;
esac
wheels=()
for p in "${pkgs[@]}"; do
  v=$(pypi_newest "$p" "$want") || exit 1
  [ -n "$v" ] || { log "no $p $want.* on PyPI"; exit 1; }
  wheels+=("$p==$v")
done
dl="$here/.cuda/wheels-$want"
mkdir -p "$dl"
log "downloading ${wheels[*]} into $dl"
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$dl" "${wheels[@]}" >&2
tmp=$(mktemp -d)
for w in "$dl"/*.whl; do unzip -q -o "$w" 'nvidia/*/include/*' 'nvidia/*/lib/libcudart*' -d "$tmp" 2>/dev/null || true; done
rm -rf "$root"; mkdir -p "$root/include" "$root/lib"
# The wheels spread one toolkit over several folders: cu13/ (13.x), cuda_runtime/ and
# cuda_nvcc/ (12.x). Merge the headers (crt/ included) and cudart into one root.
for sub in cu13 cuda_runtime cuda_nvcc; do
  if [ -d "$tmp/nvidia/$sub/include" ]; then cp -r "$tmp/nvidia/$sub/include/." "$root/include/"; fi
  if [ -d "$tmp/nvidia/$sub/lib" ]; then cp "$tmp/nvidia/$sub/lib/"libcudart* "$root/lib/" 2>/dev/null || true; fi
done
rm -rf "$tmp" "$dl"
for so in "$root"/lib/libcudart.so.*; do [ -e "$so" ] && ln -sf "$(basename "$so")" "$root/lib/libcudart.so"; done
printf '%s\n' "${wheels[@]}" > "$root/WHEELS"
is_toolkit "$root" || { log "the wheels did not give a usable toolkit in $root"; exit 1; }
log "CUDA $want ready in $root (${wheels[*]})"
echo "$root"
