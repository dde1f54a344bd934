"""onnxruntime's channel-blocked layout (domain com.microsoft.nchwc), what a session saves with
optimized_model_filepath at ORT_ENABLE_ALL on an x86 CPU: the importer reads each blocked value as
the NCHW tensor of its padded channels and puts the convolutions' reordered filters back in OIHW
order (src/frontend/onnx/contrib_ops.cpp, "NCHWc"). Files onnxruntime wrote on this machine are
compared with onnxruntime running the same file and with PyTorch; files in the other block size
(8, an AVX2 CPU's) are written here with the filter order done in numpy."""

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import pypto

NCHWC = "com.microsoft.nchwc"


def _randomize(m):
    """Random BatchNorm statistics and a head that does not vanish, so outputs say something."""
    torch.manual_seed(3)
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
        if isinstance(mod, torch.nn.Linear):
            mod.weight.data.normal_(0, 0.05)
    return m.eval()


class Mixed(torch.nn.Module):
    """Most of what onnxruntime's NCHWc transformer rewrites: a 3-channel stem (an NCHW input), 24
    channels (padded to the block), a grouped conv, LeakyRelu, a BatchNorm after a Sigmoid (made a
    depthwise 1x1 conv), a squeeze-excite Mul, nearest and bilinear Upsample, AveragePool, MaxPool,
    a channel Concat, Tanh, and an Add of two blocked values."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 24, 3, padding=1)
        self.c2 = torch.nn.Conv2d(24, 32, 3, stride=2, padding=1)
        self.g = torch.nn.Conv2d(32, 64, 3, padding=1, groups=2)
        self.bn = torch.nn.BatchNorm2d(64)
        self.se1 = torch.nn.Conv2d(64, 16, 1)
        self.se2 = torch.nn.Conv2d(16, 64, 1)
        self.c3 = torch.nn.Conv2d(64, 32, 1)
        self.c4 = torch.nn.Conv2d(96, 40, 3, padding=1)

    def forward(self, x):
        f = torch.nn.functional
        a = torch.relu(self.c1(x))
        b = f.leaky_relu(self.c2(a), 0.1)
        g = self.bn(torch.sigmoid(self.g(b)))
        g = g * torch.sigmoid(self.se2(torch.relu(self.se1(f.adaptive_avg_pool2d(g, 1)))))
        c = self.c3(g)
        u = f.interpolate(c, scale_factor=2, mode="nearest")
        u2 = f.interpolate(c, scale_factor=2, mode="bilinear", align_corners=False)
        p = f.avg_pool2d(u + u2, 3, stride=1, padding=1)
        cat = torch.cat([p, f.max_pool2d(a.repeat(1, 2, 1, 1)[:, :32], 1), u], 1)
        return torch.tanh(self.c4(cat)) + f.max_pool2d(cat[:, :40], 1)


class ChannelsLast(torch.nn.Module):
    """NHWC in and out: onnxruntime folds the Transposes into ReorderInput/ReorderOutput
    (channels_last)."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(32, 48, 3, padding=1)
        self.c2 = torch.nn.Conv2d(48, 40, 1)

    def forward(self, x):
        y = self.c2(torch.relu(self.c1(x.permute(0, 3, 1, 2))))
        return y.permute(0, 2, 3, 1)


def _optimized(tmp_path, model, x, dynamic=False):
    """The model exported to ONNX and saved by onnxruntime at ORT_ENABLE_ALL."""
    raw, opt = tmp_path / "raw.onnx", tmp_path / "all.onnx"
    torch.onnx.export(model, (torch.from_numpy(x),), str(raw), input_names=["x"],
                      output_names=["y"], dynamo=False, opset_version=17,
                      dynamic_axes={"x": {0: "batch"}} if dynamic else None)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(opt)
    ort.InferenceSession(str(raw), so, providers=["CPUExecutionProvider"])
    ops = collections.Counter(n.op_type for n in onnx.load(opt).graph.node if n.domain == NCHWC)
    if not ops:
        pytest.skip("onnxruntime wrote no NCHWc ops on this CPU (it needs AVX2 or AVX-512)")
    return opt, ops


def _models():
    import torchvision
    return {
        "mixed": (Mixed, (2, 3, 20, 24), True),
        "channels_last": (ChannelsLast, (1, 9, 11, 32), False),
        "mobilenet_v3_small": (torchvision.models.mobilenet_v3_small, (1, 3, 64, 64), False),
        "resnext": (lambda: torchvision.models.resnext50_32x4d(), (1, 3, 48, 48), False),
    }


@pytest.mark.parametrize("name", ["mixed", "channels_last", "mobilenet_v3_small", "resnext"])
def test_onnxruntime_optimized_file(tmp_path, name):
    ctor, shape, dynamic = _models()[name]
    model = _randomize(ctor())
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    path, ops = _optimized(tmp_path, model, x, dynamic)
    assert ops["Conv"] > 0
    with torch.inference_mode():
        eager = model(torch.from_numpy(x)).numpy()
    assert np.abs(eager).max() > 0.1  # a vanishing output would check nothing
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for level in (0, 2, 3):
        got = np.asarray(pypto.onnx.load(str(path), level=level)(x))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
        np.testing.assert_allclose(got, eager, rtol=1e-4, atol=2e-5)


def test_dynamic_batch_and_written_back(tmp_path):
    """A dynamic batch (onnxruntime splits the block off with a Reshape to add two values whose
    shapes it cannot prove equal) at two batch sizes through one model; written back in standard
    ops that onnxruntime reads."""
    model = _randomize(Mixed())
    x = np.random.default_rng(6).standard_normal((1, 3, 20, 24)).astype(np.float32)
    path, _ = _optimized(tmp_path, model, x, dynamic=True)
    assert any(n.op_type == "Reshape" for n in onnx.load(path).graph.node)
    exe = pypto.onnx.load(str(path))
    for batch in (1, 3):
        xb = np.random.default_rng(batch).standard_normal((batch, 3, 20, 24)).astype(np.float32)
        with torch.inference_mode():
            np.testing.assert_allclose(np.asarray(exe(xb)), model(torch.from_numpy(xb)).numpy(),
                                       rtol=1e-4, atol=2e-5)
    out = tmp_path / "written.onnx"
    pypto.onnx.export(exe, None, out)
    assert not [n.op_type for n in onnx.load(out).graph.node if n.domain.startswith("com.")]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with torch.inference_mode():
        np.testing.assert_allclose(got, model(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=2e-5)


# ---- files in the other block size, written here ----

def _oihwbibo(w, b):
    """onnxruntime's OIHWBiBo filter order, [O/b][I/b][KH][KW][b_in][b_out], for block b (the
    dims stay [O, I, KH, KW], as onnxruntime writes them)."""
    o, i, kh, kw = w.shape
    return w.reshape(o // b, b, i // b, b, kh, kw).transpose(0, 2, 4, 5, 3, 1).reshape(w.shape)


def _oihwbo(w, b):
    """onnxruntime's OIHWBo order, [O/b][I][KH][KW][b] (depthwise convs, NCHW inputs)."""
    o, i, kh, kw = w.shape
    return w.reshape(o // b, b, i, kh, kw).transpose(0, 2, 3, 4, 1).reshape(w.shape)


def _blocked_file(tmp_path, block, channels):
    """x [1, 3, 10, 12] -> Conv 3x3 to `channels` (NCHW input, OIHWBo) + Relu -> depthwise 3x3 ->
    Conv 1x1 to `channels` (OIHWBiBo) -> ReorderOutput; as standard ops and as NCHWc ops for
    `block` (channels a multiple of it)."""
    rng = np.random.default_rng(block + channels)
    w1 = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3
    wd = rng.standard_normal((channels, 1, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((channels, channels, 1, 1)).astype(np.float32) * 0.3
    bias = rng.standard_normal(channels).astype(np.float32)
    inits = lambda ws: [numpy_helper.from_array(a, n) for n, a in ws.items()]  # noqa: E731
    pads = dict(pads=[1, 1, 1, 1])
    vi = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    plain = helper.make_graph([
        helper.make_node("Conv", ["x", "w1", "b"], ["c1"], **pads),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "wd", "b"], ["c2"], group=channels, **pads),
        helper.make_node("Conv", ["c2", "w2", "b"], ["y"]),
    ], "plain", [vi("x", [1, 3, 10, 12])], [vi("y", [1, channels, 10, 12])],
        inits(dict(w1=w1, wd=wd, w2=w2, b=bias)))
    blocked = helper.make_graph([
        helper.make_node("Conv", ["x", "w1", "b"], ["c1"], domain=NCHWC, activation="Relu",
                         **pads),
        helper.make_node("Conv", ["c1", "wd", "b"], ["c2"], domain=NCHWC, group=channels, **pads),
        helper.make_node("Conv", ["c2", "w2", "b"], ["c3"], domain=NCHWC),
        helper.make_node("ReorderOutput", ["c3"], ["y"], domain=NCHWC, channels=channels),
    ], "blocked", [vi("x", [1, 3, 10, 12])], [vi("y", [1, channels, 10, 12])],
        inits(dict(w1=_oihwbo(w1, block), wd=_oihwbo(wd, block), w2=_oihwbibo(w2, block),
                   b=bias)))
    paths = []
    for g, name in ((plain, "plain.onnx"), (blocked, "blocked.onnx")):
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(NCHWC, 1)])
        onnx.save(m, tmp_path / name)
        paths.append(str(tmp_path / name))
    return paths


def _run(path, x):
    return np.asarray(pypto.onnx.load(path)(x))


def test_block_8_found_from_the_filters(tmp_path, monkeypatch):
    """24 channels fit a block of 8 only: read as such on any CPU; PTO_NCHWC_BLOCK=16 is an
    error naming the block that fits."""
    plain, blocked = _blocked_file(tmp_path, 8, 24)
    x = np.random.default_rng(0).standard_normal((1, 3, 10, 12)).astype(np.float32)
    want = ort.InferenceSession(plain, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    monkeypatch.delenv("PTO_NCHWC_BLOCK", raising=False)
    np.testing.assert_allclose(_run(blocked, x), want, rtol=1e-4, atol=2e-5)
    monkeypatch.setenv("PTO_NCHWC_BLOCK", "16")
    with pytest.raises(ValueError, match="PTO_NCHWC_BLOCK=16 does not fit.*8 does"):
        pypto.onnx.load(blocked)
    monkeypatch.setenv("PTO_NCHWC_BLOCK", "4")
    with pytest.raises(ValueError, match="must be 8 or 16"):
        pypto.onnx.load(blocked)


@pytest.mark.parametrize("block", [8, 16])
def test_ambiguous_block_follows_pto_nchwc_block(tmp_path, monkeypatch, block):
    """32 channels fit both blocks: the file says nothing about which; PTO_NCHWC_BLOCK decides,
    and reading the file with the other block gives another answer."""
    plain, blocked = _blocked_file(tmp_path, block, 32)
    x = np.random.default_rng(1).standard_normal((1, 3, 10, 12)).astype(np.float32)
    want = ort.InferenceSession(plain, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    monkeypatch.setenv("PTO_NCHWC_BLOCK", str(block))
    np.testing.assert_allclose(_run(blocked, x), want, rtol=1e-4, atol=2e-5)
    monkeypatch.setenv("PTO_NCHWC_BLOCK", str(24 - block))
    assert np.abs(_run(blocked, x) - want).max() > 1e-2


def test_unread_nchwc_op_is_a_clear_error(tmp_path):
    g = helper.make_graph(
        [helper.make_node("ReorderInput", ["x"], ["r"], domain=NCHWC),
         helper.make_node("Frobnicate", ["r"], ["y"], domain=NCHWC)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 4, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(NCHWC, 1)])
    onnx.save(m, tmp_path / "m.onnx")
    with pytest.raises(NotImplementedError, match="Frobnicate.*NCHWc ops PyPTO reads.*EXTENDED"):
        pypto.onnx.load(str(tmp_path / "m.onnx"))


def test_malformed_reorders_are_clear_errors(tmp_path):
    """ReorderOutput asking for more channels than its input has, and an unknown channel count
    for ReorderInput, are errors naming the node."""
    def load(nodes, shape):
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(NCHWC, 1)])
        onnx.save(m, tmp_path / "m.onnx")
        return pypto.onnx.load(str(tmp_path / "m.onnx"))

    with pytest.raises(ValueError, match="channels 40 exceeds"):
        load([helper.make_node("ReorderOutput", ["x"], ["y"], domain=NCHWC, channels=40)],
             [1, 32, 4, 4])
    with pytest.raises(NotImplementedError, match="channel count is not known"):
        load([helper.make_node("ReorderInput", ["x"], ["y"], domain=NCHWC)], [1, "c", 4, 4])
