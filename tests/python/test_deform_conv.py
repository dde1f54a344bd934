"""DeformConv (ONNX opset 19, deformable convolution v1/v2): the reference kernel and the CPU
kernel (src/backend/cpu/conv/deform_conv.cpp) against torchvision.ops.deform_conv2d and
onnxruntime; and torchvision's op through pypto.optimize (python/pypto/frontend/torchvision_ops.py)
against eager."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import pypto

torchvision = pytest.importorskip("torchvision")

CASES = {
    # name: (N, C, H, W, M, k, stride, pad, dilation, group, offset_group, mask, bias)
    "basic": (1, 4, 9, 11, 6, 3, 1, 1, 1, 1, 1, False, True),
    "mask_v2": (2, 8, 12, 10, 16, 3, 1, 1, 1, 1, 2, True, True),
    "stride_dilation": (1, 6, 15, 13, 5, 3, 2, 2, 2, 1, 3, True, False),
    "groups": (1, 8, 8, 8, 12, 3, 1, 0, 1, 4, 2, False, True),
    "kernel_5_no_pad": (2, 3, 14, 9, 4, 5, 1, 0, 1, 1, 1, True, True),
    "wide": (1, 64, 20, 20, 64, 3, 1, 1, 1, 1, 1, True, True),
}


def _inputs(case, rng):
    n, c, h, w, m, k, s, p, d, g, og, use_mask, use_bias = case
    oh = (h + 2 * p - d * (k - 1) - 1) // s + 1
    ow = (w + 2 * p - d * (k - 1) - 1) // s + 1
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((m, c // g, k, k)) * 0.3).astype(np.float32)
    # Offsets of a few pixels, some far outside the image (samples of zero).
    off = (rng.standard_normal((n, og * k * k * 2, oh, ow)) * 2.0).astype(np.float32)
    off[:, :2] += 40.0
    mask = rng.random((n, og * k * k, oh, ow)).astype(np.float32) if use_mask else None
    bias = rng.standard_normal(m).astype(np.float32) if use_bias else None
    return x, wt, off, mask, bias


def _onnx_model(case, x, wt, off, mask, bias):
    n, c, h, w, m, k, s, p, d, g, og, use_mask, use_bias = case
    names = ["x", "w", "off", "b" if use_bias else "", "mask" if use_mask else ""]
    while not names[-1]:
        names.pop()
    vi = lambda nm, a: helper.make_tensor_value_info(nm, TensorProto.FLOAT, a.shape)  # noqa: E731
    feeds = {"x": x, "off": off}
    if use_mask:
        feeds["mask"] = mask
    node = helper.make_node("DeformConv", names, ["y"], strides=[s, s], pads=[p] * 4,
                            dilations=[d, d], group=g, offset_group=og, kernel_shape=[k, k])
    inits = [numpy_helper.from_array(wt, "w")]
    if use_bias:
        inits.append(numpy_helper.from_array(bias, "b"))
    graph = helper.make_graph([node], "deform", [vi(nm, a) for nm, a in feeds.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), feeds


def _torchvision(case, x, wt, off, mask, bias):
    s, p, d = case[6], case[7], case[8]
    with torch.inference_mode():
        return torchvision.ops.deform_conv2d(
            torch.from_numpy(x), torch.from_numpy(off), torch.from_numpy(wt),
            None if bias is None else torch.from_numpy(bias), stride=s, padding=p, dilation=d,
            mask=None if mask is None else torch.from_numpy(mask)).numpy()


@pytest.mark.parametrize("name", list(CASES))
def test_against_torchvision_and_onnxruntime(tmp_path, name):
    case = CASES[name]
    x, wt, off, mask, bias = _inputs(case, np.random.default_rng(len(name)))
    model, feeds = _onnx_model(case, x, wt, off, mask, bias)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    want = _torchvision(case, x, wt, off, mask, bias)
    assert np.abs(want).max() > 0.1
    peer = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(peer, want, rtol=1e-4, atol=1e-4)  # the two references agree
    for level in (0, 2):
        exe = pypto.onnx.load(str(path), level=level)
        np.testing.assert_allclose(np.asarray(exe(**feeds)), want, rtol=1e-4, atol=1e-4)
        assert [b for op, b in exe._compiled.node_backends if op == "DeformConv"] == ["cpu"]


class DcnBlock(torch.nn.Module):
    """A DCNv2 block as detection models write it: a conv predicts offsets and mask, then
    torchvision's DeformConv2d, BatchNorm and ReLU."""

    def __init__(self, c=16, offset_groups=2):
        super().__init__()
        self.pred = torch.nn.Conv2d(c, offset_groups * 27, 3, padding=1)
        self.dcn = torchvision.ops.DeformConv2d(c, c, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(c)
        self.og = offset_groups

    def forward(self, x):
        p = self.pred(x)
        off, mask = p[:, :self.og * 18], torch.sigmoid(p[:, self.og * 18:])
        return torch.relu(self.bn(self.dcn(x, off, mask)))


def test_pypto_optimize_runs_torchvision_deform_conv():
    torch.manual_seed(0)
    model = DcnBlock().eval()
    with torch.no_grad():
        model.pred.weight.mul_(5.0)  # offsets of a few pixels
        model.bn.running_mean.uniform_(-0.3, 0.3)
    x = torch.randn(2, 16, 13, 17)
    fast = pypto.optimize(model, x)
    with torch.inference_mode():
        want = model(x)
        got = fast(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert ("DeformConv", "cpu") in fast._compiled.node_backends
