"""3-D convolutions (video and volume models) on the CPU's 2-D conv kernels through the
LowerConv3D pass, compared with PyTorch eager (pypto.optimize) and ONNX Runtime (an ONNX file
torch.onnx writes): strides, padding, dilation, groups, depthwise, with and without a bias, a
BatchNorm folded first, a symbolic batch. No node may be left to the reference interpreter."""

import numpy as np
import onnxruntime as ort
import pytest
import torch

import pypto


def _on_reference(compiled) -> list[str]:
    return sorted({op for op, b in compiled.node_backends if b != "cpu"})


@pytest.mark.parametrize("cin,cout,k,stride,pad,dil,groups,bias", [
    (3, 8, 3, 1, 1, 1, 1, True),             # R3D's 3x3x3
    (4, 6, (3, 1, 1), 1, (1, 0, 0), 1, 1, False),  # R(2+1)D's temporal conv
    (4, 6, (1, 3, 3), (1, 2, 2), (0, 1, 1), 1, 1, True),  # its spatial conv, strided
    (3, 5, (3, 7, 7), (1, 2, 2), (1, 3, 3), 1, 1, False),  # a stem
    (6, 6, 3, 2, 1, 1, 3, True),              # groups, strided depth
    (8, 8, 3, 1, 2, 2, 8, False),             # depthwise, dilated
    (4, 4, 2, (2, 1, 1), 0, 1, 1, True),      # even kernel, no padding, output depth 2
])
def test_conv3d_matches_eager(cin, cout, k, stride, pad, dil, groups, bias):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv3d(cin, cout, k, stride, pad, dil, groups, bias),
        torch.nn.BatchNorm3d(cout), torch.nn.ReLU()).eval()
    with torch.no_grad():  # a BN that is not the identity, folded into the conv first
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
        model[1].weight.uniform_(0.5, 1.5)
    x = torch.randn(2, cin, 5, 9, 10)
    fast = pypto.optimize(model, (x,))
    assert _on_reference(fast.compiled) == []
    ops = [op for op, _ in fast.compiled.node_backends]
    assert "Conv" in ops
    for b in (2, 1, 3):
        xb = torch.randn(b, cin, 5, 9, 10)
        with torch.inference_mode():
            torch.testing.assert_close(fast(xb), model(xb), rtol=1e-4, atol=1e-5)


def test_conv3d_onnx_file_matches_onnx_runtime(tmp_path):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv3d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv3d(8, 4, (3, 3, 3), stride=(2, 1, 1))).eval()
    x = torch.randn(1, 3, 6, 8, 8)
    path = tmp_path / "c3d.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["x"], dynamo=True, external_data=False)
    exe = pypto.onnx.load(path)
    assert _on_reference(exe._compiled) == []
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = np.random.default_rng(0).standard_normal((1, 3, 6, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(exe(feed), sess.run(None, {"x": feed})[0], rtol=1e-4, atol=1e-5)
    # Level 1 keeps the 3-D conv as it is (on the reference interpreter), with the same result.
    plain = pypto.onnx.load(path, level=1)
    assert "Conv" in _on_reference(plain._compiled)
    np.testing.assert_allclose(plain(feed), sess.run(None, {"x": feed})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("precision", ["high", "medium", "bf16"])
def test_conv3d_keeps_its_reduced_precision_when_lowered(precision):
    """A 3-D conv marked by ConvPrecision ("high": bf16x3, "medium": bf16) or by
    dtype=torch.bfloat16 keeps the mark on the 2-D conv LowerConv3D makes of it: level 2 gives
    what the reference interpreter computes for the marked 3-D conv at level 1 (the same
    products), and not the fp32 result."""
    info = pypto.device_info()["precision"]
    if not info["bf16x3" if precision == "high" else "bf16"]["fast"]:
        pytest.skip("the CPU computes this precision in fp32: nothing is marked")
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Conv3d(16, 128, 3, padding=1)).eval()
    x = torch.randn(1, 16, 4, 6, 6)
    kw = ({"dtype": torch.bfloat16} if precision == "bf16"
          else {"conv_precision": precision})
    fast = pypto.optimize(model, (x,), **kw)
    assert _on_reference(fast.compiled) == []
    assert "precision=" in str(fast.compiled.graph)
    oracle = pypto.optimize(model, (x,), level=1, **kw)  # the 3-D conv on the reference
    assert "Conv" in _on_reference(oracle.compiled)
    got, want = fast(x).float(), oracle(x).float()
    with torch.inference_mode():
        f32 = model(x)
    scale = f32.abs().max()
    assert ((got - want).abs().max() / scale) < (1e-6 if precision == "high" else 5e-3)
    assert ((got - f32).abs().max() / scale) > (5e-7 if precision == "high" else 1e-4)
