"""Whole PyTorch models through pypto.optimize, compared with PyTorch eager (fp32).

Each model is optimized once with a batch-1 example and then run at batch 1 and batch 2 through
the same compiled module (the batch is symbolic: no recompilation). Every output tensor must match
eager to max|got - want| / max|want| <= 1e-4. The compute-heavy ops must run on the CPU backend's
kernels, not fall back to the reference interpreter's.
"""

import pytest
import torch

import pypto
import torch_models as tm

TOLERANCE = 1e-4
# Ops that carry a model's time: each must run on a CPU backend kernel in every zoo model.
HEAVY_OPS = {"Conv", "MatMul", "Gemm", "BatchNormalization", "LayerNormalization", "Softmax",
             "MaxPool", "AveragePool", "GlobalAveragePool", "ReduceMean", "Gelu", "Tanh", "Erf",
             "Sigmoid", "Relu", "Clip", "Transpose", "HardSwish", "HardSigmoid"}
# The shape arithmetic a symbolic batch leaves in the graph (int64 Add/Mul on sizes, position
# ids, masks) runs on CPU kernels too: backend/cpu/generate.cpp and the integer elementwise ones.
SHAPE_OPS = {"Shape", "Size", "Range", "CumSum", "ConstantOfShape", "Add", "Sub", "Mul", "Div",
             "Mod", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "Where"}


@pytest.mark.parametrize("name", list(tm.ZOO))
def test_model_matches_eager_at_two_batch_sizes(name):
    model = tm.build(name)
    fast = pypto.optimize(model, example_inputs=tm.inputs(name, 1))
    assert isinstance(fast, torch.nn.Module)
    assert fast.dynamic_dims.get("batch", (None,))[0] == 1, fast.dynamic_dims
    tm.check_at_batch_sizes(model, fast, name, TOLERANCE)
    assert fast.compiled.level == 2
    on_reference = sorted({op for op, b in fast.compiled.node_backends
                           if b != "cpu" and op in HEAVY_OPS | SHAPE_OPS})
    assert not on_reference, f"on the reference kernels: {on_reference}"
