"""Ops that ran on the reference interpreter in real models now run on CPU kernels, checked
against ONNX Runtime (ONNX graphs written with onnx.helper) and PyTorch eager: a PRelu that is not
fused with anything (it has no kernel of its own and runs as a one-node tile program), and
MaxPool / AveragePool over 3-D windows (MViT's attention pooling, 3-D CNNs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import helper

import pypto
from one_node import run_one_node


def _run(tmp_path, node, x, inits=(), opset=17):
    return run_one_node(tmp_path, node, x, inits, opset)


@pytest.mark.parametrize("x_shape, slope_shape", [
    ((2, 16, 9, 11), (16, 1, 1)),   # nn.PReLU(16) as PyTorch exports it
    ((2, 16, 9, 11), (1,)),         # nn.PReLU()
    ((3, 40), (40,)),
    ((1, 4, 5, 6), (1, 4, 1, 1)),
])
def test_lone_prelu_on_cpu(tmp_path, x_shape, slope_shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    slope = rng.uniform(0.05, 0.5, slope_shape).astype(np.float32)
    got, want, backends = _run(tmp_path, helper.make_node("PRelu", ["x", "s"], ["y"]), x,
                               [("s", slope)], opset=9)
    assert backends == {"PRelu": "cpu"}
    np.testing.assert_allclose(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3, 3], strides=[1, 2, 2], pads=[1, 1, 1, 1, 1, 1]),
    dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[0, 1, 0, 1, 0, 1], ceil_mode=1),
    dict(kernel_shape=[1, 2, 2], strides=[1, 2, 2]),
])
def test_pool_3d_on_cpu(tmp_path, op, attrs):
    x = np.random.default_rng(1).standard_normal((2, 5, 6, 9, 10)).astype(np.float32)
    if op == "AveragePool":
        attrs = dict(attrs, count_include_pad=1 if "ceil_mode" in attrs else 0)
    got, want, backends = _run(tmp_path, helper.make_node(op, ["x"], ["y"], **attrs), x)
    assert backends == {op: "cpu"}
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


class _AttentionPool(torch.nn.Module):
    """MViT's pooling of a [B, heads, T*H*W, C] sequence through MaxPool3d."""

    def __init__(self):
        super().__init__()
        self.pool = torch.nn.MaxPool3d((3, 3, 3), stride=(1, 2, 2), padding=(1, 1, 1))

    def forward(self, x):
        b, n, _, c = x.shape
        x = self.pool(x.transpose(2, 3).reshape(b * n, c, 4, 8, 8))
        return x.reshape(b, n, c, -1).transpose(2, 3)


def test_mvit_attention_pool_on_cpu():
    torch.manual_seed(0)
    model = _AttentionPool().eval()
    fast = pypto.optimize(model, example_inputs=(torch.randn(1, 2, 256, 16),))
    assert {b for _, b in fast.compiled.node_backends} == {"cpu"}, fast.compiled.node_backends
    for batch in (1, 3):
        x = torch.randn(batch, 2, 256, 16)
        torch.testing.assert_close(fast(x), model(x), rtol=0, atol=0)
