# shellcheck shell=bash
# Sourced by the scripts in this folder: paths and the one CMake configuration they share.

PTO_VENV=${PTO_VENV:-$HOME/.cache/pypto/venv}
PTO_CACHE=${PTO_CACHE:-$HOME/.cache/pypto}
PY=$PTO_VENV/bin/python
export PTO_CACHE

# Configure (cheap when nothing changed) and build targets in a build folder.
#   pto_build DIR [CMAKE_ARGS...] -- [TARGETS...]
pto_build() {
  local dir=$1 cmake_args=() targets=()
  shift
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do cmake_args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  targets=("$@")
  mkdir -p "$dir"
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTO_WERROR=ON \
    -DPTO_PYTHON="$PY" "${launcher[@]}" "${cmake_args[@]}" >"$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log"; echo "cmake configure failed in $dir" >&2; return 1; }
  ninja -C "$dir" ${PTO_JOBS:+-j "$PTO_JOBS"} "${targets[@]}"
}
