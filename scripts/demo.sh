#!/usr/bin/env bash
# The main job: installs and builds what is missing, then runs a model through `pto run` and shows
# its outputs, its time and a check against onnxruntime.
#   bash scripts/demo.sh [MODEL|file.onnx] [-- more pto run options]
# MODEL: resnet18 (default), mobilenet_v2, bert, gpt2; exported once to ~/.cache/pypto/models.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

bash scripts/setup.sh
echo "demo: building pto in build/"
pto_build build -- pto_cli
exec "$PY" scripts/demo.py --pto build/pto "$@"
