#!/usr/bin/env bash
# The main job: installs and builds what is missing, then optimizes a model with pypto.optimize,
# checks it against PyTorch eager, and prints its speed against eager and where the time goes.
#   bash scripts/demo.sh [MODEL] [--batch N] [--repeat N]
# MODEL: resnet18 (default), resnet50, mobilenet_v2, mobilenet_v3_small, efficientnet_b0,
# vit_b_16, convnext_tiny, bert, gpt2, t5_encoder (random weights, built in code).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

bash scripts/setup.sh
echo "demo: building PyPTO in build/"
pto_build build -- pypto_C pto_cli
exec "$PY" scripts/demo.py "$@"
