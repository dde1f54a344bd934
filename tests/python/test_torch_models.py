"""Whole PyTorch models through pypto.optimize, compared with PyTorch eager (fp32).

Each model is optimized once with a batch-1 example and then run at batch 1 and batch 2 through
the same compiled module (the batch is symbolic: no recompilation). Every output tensor must match
eager to max|got - want| / max|want| <= 1e-4. The compute-heavy ops must run on the CPU backend's
kernels, not fall back to the reference interpreter's.
"""

import pytest
import torch
import torch.utils._pytree as pytree

import pypto
import torch_models as tm

TOLERANCE = 1e-4
# Ops that carry a model's time: each must run on a CPU backend kernel in every zoo model.
# (Arithmetic like Add and Mul also appears on int64 shape values, which stay on the reference.)
HEAVY_OPS = {"Conv", "MatMul", "Gemm", "BatchNormalization", "LayerNormalization", "Softmax",
             "MaxPool", "AveragePool", "GlobalAveragePool", "ReduceMean", "Gelu", "Tanh", "Erf",
             "Sigmoid", "Relu", "Clip", "Transpose", "HardSwish", "HardSigmoid"}


@pytest.mark.parametrize("name", list(tm.ZOO))
def test_model_matches_eager_at_two_batch_sizes(name):
    model = tm.build(name)
    fast = pypto.optimize(model, example_inputs=tm.inputs(name, 1))
    assert isinstance(fast, torch.nn.Module)
    assert fast.dynamic_dims.get("batch", (None,))[0] == 1, fast.dynamic_dims
    for batch in (1, 2):
        args = tm.inputs(name, batch)
        with torch.inference_mode():
            want = model(*args)
        got = fast(*args)
        assert type(got) is type(want)
        got_leaves, got_spec = pytree.tree_flatten(got)
        want_leaves, want_spec = pytree.tree_flatten(want)
        assert got_spec == want_spec
        for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
            err = tm.relative_error(g, w)
            assert err <= TOLERANCE, f"batch {batch}, output {i}: relative error {err:.3e}"
    assert fast.compiled.level == 2
    on_reference = sorted({op for op, b in fast.compiled.node_backends
                           if b != "cpu" and op in HEAVY_OPS})
    assert not on_reference, f"on the reference kernels: {on_reference}"
