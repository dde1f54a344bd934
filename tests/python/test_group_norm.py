"""GroupNorm between convolutions (ResNetV2/BiT, U-Nets): torch.onnx.export's spelled-out form
(Reshape, InstanceNormalization, Reshape, Mul, Add) recognized as one GroupNormalization, and at
level 3 run on the blocked layout (GroupNormBlocked, with the Relu after it fused), so that the
convolutions around it stay blocked. Results against PyTorch eager and onnxruntime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import pypto

TOLERANCE = 1e-4


class GnBlock(torch.nn.Module):
    """conv -> GroupNorm -> ReLU -> conv -> GroupNorm -> + x: a pre-activation residual block."""

    def __init__(self, channels, groups, affine=True):
        super().__init__()
        self.c1 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.n1 = torch.nn.GroupNorm(groups, channels, affine=affine)
        self.c2 = torch.nn.Conv2d(channels, channels, 1)
        self.n2 = torch.nn.GroupNorm(groups, channels, affine=affine)
        torch.manual_seed(1)
        if affine:
            for n in (self.n1, self.n2):
                n.weight.data.uniform_(0.5, 1.5)
                n.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = torch.relu(self.n1(self.c1(x)))
        return self.n2(self.c2(y)) + x


def _rel(got, want):
    return float(np.abs(np.asarray(got) - np.asarray(want)).max() / np.abs(want).max())


def _level3_of_export(model, x, tmp_path):
    """model exported at opset 17 (torch's spelled-out GroupNorm), loaded at level 3 and checked
    against eager on x; returns the plan's node ops."""
    path = str(tmp_path / "gn.onnx")
    torch.onnx.export(model, (x,), path, opset_version=17, dynamo=False)
    with torch.no_grad():
        want = model(x).numpy()
    m = pypto.onnx.load(path, level=3)
    assert _rel(m(x.numpy()), want) < TOLERANCE
    return [op for op, _ in m._compiled.node_backends]


# (channels, groups): 2 channels a group (BiT's 64 / 32), a whole 16-lane block a group, 5 a
# group with 60 channels (padded lanes), all channels one group, and one channel a group.
SHAPES = [(64, 32), (48, 3), (60, 12), (32, 1), (32, 32)]


@pytest.mark.parametrize("channels,groups", SHAPES)
def test_exported_group_norm_is_recognized_and_runs_blocked(tmp_path, channels, groups):
    torch.manual_seed(0)
    model = GnBlock(channels, groups).eval()
    # Far from 0 (mean 30): the statistics must not lose the variance to the mean.
    x = torch.randn(2, channels, 13, 11) + 30
    path = str(tmp_path / "gn.onnx")
    torch.onnx.export(model, (x,), path, opset_version=17, dynamo=False)
    assert any(n.op_type == "InstanceNormalization" for n in onnx.load(path).graph.node)
    with torch.no_grad():
        want = model(x).numpy()
    peer = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ref = peer.run(None, {peer.get_inputs()[0].name: x.numpy()})[0]
    assert _rel(ref, want) < TOLERANCE
    for level in (1, 2, 3):
        m = pypto.onnx.load(path, level=level)
        assert _rel(m(x.numpy()), want) < TOLERANCE, level
        ops = [op for op, _ in m._compiled.node_backends]
        assert "InstanceNormalization" not in ops, (level, ops)
        if level == 3:
            assert ops.count("GroupNormBlocked") == 2, ops
            assert all(b == "cpu" for op, b in m._compiled.node_backends if op == "GroupNormBlocked")
            assert "ConvBlocked" in ops and "Relu" not in ops, ops  # the Relu went into the norm
        else:
            assert ops.count("GroupNormalization") == 2, (level, ops)


def test_group_norm_without_affine_from_export(tmp_path):
    torch.manual_seed(0)
    ops = _level3_of_export(GnBlock(32, 4, affine=False).eval(), torch.randn(1, 32, 9, 9), tmp_path)
    assert ops.count("GroupNormBlocked") == 2, ops


def test_group_norm_from_optimize_runs_blocked():
    torch.manual_seed(0)
    model = GnBlock(64, 32).eval()
    x = torch.randn(2, 64, 15, 15)
    fast = pypto.optimize(model, example_inputs=x, level=3)
    with torch.no_grad():
        want = model(x).numpy()
        got = fast(x).numpy()
    assert _rel(got, want) < TOLERANCE
    ops = [op for op, _ in fast.compiled.node_backends]
    assert ops.count("GroupNormBlocked") == 2, ops


def test_group_norm_with_a_second_reader_keeps_its_relu_apart(tmp_path):
    """The norm's output read by the Relu and by the residual add: the Relu cannot go into it."""

    class TwoReaders(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(32, 32, 3, padding=1)
            self.n = torch.nn.GroupNorm(8, 32)
            self.d = torch.nn.Conv2d(32, 32, 1)

        def forward(self, x):
            y = self.n(self.c(x))
            return self.d(torch.relu(y)) + y

    torch.manual_seed(0)
    ops = _level3_of_export(TwoReaders().eval(), torch.randn(1, 32, 10, 10), tmp_path)
    assert "GroupNormBlocked" in ops and "Relu" in ops, ops


def test_group_norm_with_dynamic_batch_and_plane(tmp_path):
    """A dynamic export reshapes back to Shape(x), the groups to [0, G, -1]: still one
    GroupNormalization, blocked at level 3, right at several shapes through one model."""
    torch.manual_seed(0)
    model = GnBlock(64, 32).eval()
    path = str(tmp_path / "gn.onnx")
    torch.onnx.export(model, (torch.randn(2, 64, 13, 11),), path, opset_version=17, dynamo=False,
                      input_names=["x"], dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}})
    for level in (2, 3):
        m = pypto.onnx.load(path, level=level)
        for shape in [(1, 64, 13, 11), (3, 64, 9, 20)]:
            x = torch.randn(*shape)
            with torch.no_grad():
                want = model(x).numpy()
            assert _rel(m(x.numpy()), want) < TOLERANCE, (level, shape)
        ops = [op for op, _ in m._compiled.node_backends]
        assert "InstanceNormalization" not in ops, ops
        assert ops.count("GroupNormBlocked" if level == 3 else "GroupNormalization") == 2, ops


def test_group_norm_with_a_unit_scale(tmp_path):
    """A GroupNorm whose scale is all ones (default init) loses its Mul to the passes; the bias Add
    that is left still joins the norm."""
    torch.manual_seed(0)
    model = GnBlock(32, 8).eval()
    with torch.no_grad():
        for n in (model.n1, model.n2):
            n.weight.fill_(1.0)
    ops = _level3_of_export(model, torch.randn(1, 32, 9, 9), tmp_path)
    assert ops.count("GroupNormBlocked") == 2 and ops.count("Add") == 1, ops  # the residual only


class UnetResBlock(torch.nn.Module):
    """A diffusion UNet's input conv and residual block: GroupNorm(32) -> SiLU -> conv, twice, plus
    the block's input."""

    def __init__(self, channels):
        super().__init__()
        self.inp = torch.nn.Conv2d(4, channels, 3, padding=1)
        self.n1 = torch.nn.GroupNorm(32, channels)
        self.c1 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.n2 = torch.nn.GroupNorm(32, channels)
        self.c2 = torch.nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        f = torch.nn.functional
        x = self.inp(x)
        return x + self.c2(f.silu(self.n2(self.c1(f.silu(self.n1(x))))))


@pytest.mark.parametrize("route", ["onnx", "optimize"])
def test_group_norm_takes_its_silu(tmp_path, route):
    torch.manual_seed(0)
    model = UnetResBlock(64).eval()
    x = torch.randn(1, 4, 12, 12)
    if route == "onnx":
        ops = _level3_of_export(model, x, tmp_path)
    else:
        m = pypto.optimize(model, example_inputs=x, level=3)
        with torch.no_grad():
            assert _rel(m(x).numpy(), model(x).numpy()) < TOLERANCE
        ops = [op for op, _ in m.compiled.node_backends]
    assert ops.count("GroupNormBlocked") == 2 and "Sigmoid" not in ops, ops
