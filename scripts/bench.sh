#!/usr/bin/env bash
# Builds pto_bench and the Python extension, then runs bench/run.py (options pass through:
# --quick, --models resnet18,bert, --threads 1,2, ...). Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
pto_build build -- pto_bench pypto_C
exec "$PY" bench/run.py --pto-bench build/bench/pto_bench "$@"
