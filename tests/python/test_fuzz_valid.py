"""Random valid ONNX graphs (fuzz_valid.py: elementwise chains with broadcasting, reductions,
norms, MatMul/Gemm, Conv+BN, pools, views, slices, gathers, integer and bool work) at every level
on one and two threads, against onnxruntime with its graph optimizations off: a fixed set of
seeds, well under a minute. PTO_FUZZ_VALID=N adds N seeds after them (a longer run; the
campaign driver, `python tests/python/fuzz_valid.py --seeds A:B`, isolates crashes and hangs).
PTO_FUZZ_VALID_TORCH=N runs N seeds (default 2) of the torch-level variant (pypto.optimize
against eager)."""

from __future__ import annotations

import os

import pytest

from fuzz_valid import check_case, check_torch_case, make_case

SEEDS = list(range(200))
EXTRA = int(os.environ.get("PTO_FUZZ_VALID", "0"))
TORCH = int(os.environ.get("PTO_FUZZ_VALID_TORCH", "2"))


@pytest.mark.parametrize("seed", SEEDS + list(range(1000, 1000 + EXTRA)))
def test_random_graph_agrees_with_onnxruntime(seed):
    model, feeds = make_case(seed)
    findings = check_case(model, feeds)
    # ('skip', why): onnxruntime rejected the graph; ('disagree', why): ONNX's own reference
    # evaluator sides with PyPTO against onnxruntime.
    if isinstance(findings, tuple):
        pytest.skip(f"seed {seed}: {findings[0]}: {findings[1][:200]}")
    assert findings == [], f"seed {seed}: python tests/python/fuzz_valid.py --one {seed}"


@pytest.mark.parametrize("seed", list(range(TORCH)))
def test_random_module_agrees_with_eager(seed):
    assert check_torch_case(seed) == []
