"""int8 from Python: pypto.quantization.quantize_dynamic, models quantized by
torch.ao.quantization.quantize_dynamic, the precision report of a quantized model, bad schemes.

The reference values are computed here in numpy (the quantization formula of ONNX's
DynamicQuantizeLinear, exact integer products), independently of PyPTO's kernels, its reference
interpreter and the eager implementation of pypto.quantization's module.
"""

import numpy as np
import pytest
import torch

import pypto
from test_precision import minilm, sentence_embeddings


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(96, 200)
        self.fc2 = torch.nn.Linear(200, 33, bias=False)

    def forward(self, x):
        return self.fc2(torch.nn.functional.relu(self.fc1(x)))


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return Mlp().eval(), torch.randn(3, 7, 96)


def np_dynamic_linear(x, weight, bias, per_row, per_channel):
    """The int8 Linear in numpy: weight symmetric int8 (scale max|w| / 127 per output channel or
    per tensor), x to uint8 per row or per tensor with DynamicQuantizeLinear's formula."""
    w = weight.astype(np.float32)
    amax = np.abs(w).max(1) if per_channel else np.array([np.abs(w).max()])
    ws = np.where(amax > 0, amax / np.float32(127), 1).astype(np.float32)
    wq = np.clip(np.round(w / ws.reshape(-1, 1)), -127, 127).astype(np.int64)
    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    groups = rows if per_row else rows.reshape(1, -1)
    mn = np.minimum(groups.min(1), 0).astype(np.float32)
    mx = np.maximum(groups.max(1), 0).astype(np.float32)
    s = (np.where(mx == mn, np.float32(1), mx - mn) / np.float32(255)).astype(np.float32)
    zp = np.round(np.clip(-mn / s, 0, 255)).astype(np.float32)
    if not per_row:
        s, zp = np.full(len(rows), s[0], np.float32), np.full(len(rows), zp[0], np.float32)
    q = np.clip(np.round(rows / s[:, None]) + zp[:, None], 0, 255).astype(np.int64)
    acc = (q - zp[:, None].astype(np.int64)) @ wq.T
    y = acc.astype(np.float32) * (s[:, None] * ws[None, :]).astype(np.float32)
    if bias is not None:
        y = y + bias.astype(np.float32)
    return y.reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("activation", ["per_row", "per_tensor"])
@pytest.mark.parametrize("per_channel", [True, False])
def test_quantize_dynamic_matches_the_int8_arithmetic(mlp, activation, per_channel):
    model, x = mlp
    q = pypto.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8,
                                            per_channel=per_channel, activation=activation)
    assert isinstance(q.fc1, pypto.quantization.DynamicQuantizedLinear)
    assert isinstance(model.fc1, torch.nn.Linear)  # a copy: the float model is unchanged
    fast = pypto.optimize(q, (x,))
    backends = fast.compiled.node_backends
    assert [op for op, _ in backends].count("DynamicQuantizeMatMul") == 2, backends
    assert all(b == "cpu" for _, b in backends), backends
    got = fast(x).numpy()
    per_row = activation == "per_row"
    with torch.no_grad():
        h = np_dynamic_linear(x.numpy(), model.fc1.weight.numpy(), model.fc1.bias.numpy(),
                              per_row, per_channel)
        want = np_dynamic_linear(np.maximum(h, 0), model.fc2.weight.numpy(), None, per_row,
                                 per_channel)
        eager = q(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(eager, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # And it is close to fp32: int8 noise, not a wrong product.
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(got - ref).max() < 0.03 * np.abs(ref).max()


def test_quantize_dynamic_by_module_name_and_the_precision_report(mlp):
    model, x = mlp
    q = pypto.quantization.quantize_dynamic(model, {"fc2"})
    assert isinstance(q.fc1, torch.nn.Linear) and not isinstance(
        q.fc1, pypto.quantization.DynamicQuantizedLinear)
    assert isinstance(q.fc2, pypto.quantization.DynamicQuantizedLinear)
    fast = pypto.optimize(q, (x,))
    report = fast.precision_report()
    assert report.precision == "int8" and "VPDPBUSD" in report.how or "widening" in report.how
    with torch.no_grad():
        d = (fast(x) - model(x)).abs()
        want = float(d.max() / model(x).abs().max())
    assert report.max_rel_error == pytest.approx(want, rel=1e-3, abs=1e-7)
    assert 0 < report.max_rel_error < 0.03
    assert "int8 against fp32" in str(report)
    inplace = pypto.quantization.quantize_dynamic(Mlp().eval(), inplace=True)
    with pytest.raises(RuntimeError, match="float model it came from is not known"):
        pypto.optimize(inplace, (x,)).precision_report()


def test_a_torch_ao_dynamically_quantized_model_is_optimized(mlp):
    """torch.ao.quantization.quantize_dynamic's model runs on PyPTO's int8 kernels with its own
    int8 weights; PyPTO quantizes activations to the full 8 bits where fbgemm uses 7
    (reduce_range), so it lands at least as close to fp32 as PyTorch does."""
    import warnings

    model, x = mlp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qa = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    fast = pypto.optimize(qa, (x,))
    assert [op for op, _ in fast.compiled.node_backends].count("DynamicQuantizeMatMul") == 2
    with torch.no_grad():
        ref, theirs = model(x), qa(x)
    got = fast(x)
    # The same int8 weights as numpy sees them.
    wq = qa.fc1.weight().int_repr().numpy()
    assert np.array_equal(fast._orig_mod.fc1.weight.numpy(), wq)
    scale = float(ref.abs().max())
    assert float((got - ref).abs().max()) <= 1.2 * float((theirs - ref).abs().max()) + 1e-6
    assert float((got - theirs).abs().max()) < 0.05 * scale


def test_unsupported_schemes_are_rejected(mlp):
    model, _ = mlp
    qd = pypto.quantization.quantize_dynamic
    with pytest.raises(NotImplementedError, match="quint4x2: 4-bit"):
        qd(model, dtype=torch.quint4x2)
    with pytest.raises(NotImplementedError, match="float8_e4m3fn: float8"):
        qd(model, dtype=torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="float16"):
        qd(model, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="only torch.nn.Linear"):
        qd(model, {torch.nn.Conv2d})
    with pytest.raises(ValueError, match="no module named"):
        qd(model, {"fc9"})
    with pytest.raises(ValueError, match="activation must be"):
        qd(model, activation="per_channel")
    with pytest.raises(ValueError, match="no torch.nn.Linear"):
        qd(torch.nn.ReLU())
    with pytest.raises(TypeError, match="qconfig_spec entries"):
        qd(model, {3})


def test_real_minilm_int8_sentence_embeddings():
    """all-MiniLM-L6-v2 (real weights) through pypto.quantization.quantize_dynamic (int8
    weights per channel, activations per token): cosine similarity to PyTorch's fp32 sentence
    embeddings >= 0.99 for every sentence, every Linear on the int8 kernel."""
    model, enc = minilm()
    kw = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    with torch.no_grad():
        want = sentence_embeddings(model(**kw).last_hidden_state, kw["attention_mask"])
    q = pypto.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    fast = pypto.optimize(q, example_kwargs=kw)
    ops = [op for op, _ in fast.compiled.node_backends]
    # q, k, v, out, ffn in and ffn out in each of the 6 layers, and the pooler
    assert ops.count("DynamicQuantizeMatMul") == 6 * 6 + 1
    assert all(b == "cpu" for op, b in fast.compiled.node_backends if op.startswith("Dyn"))
    got = sentence_embeddings(fast(**kw).last_hidden_state, kw["attention_mask"])
    cos = (got * want).sum(1)
    assert cos.min() >= 0.99, cos


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.fc = torch.nn.Linear(16, 5)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = self.dw(torch.relu(self.conv2(h)))
        return self.fc(h.mean((2, 3)))


def test_calibrate_makes_a_static_int8_conv_net():
    """calibrate: BatchNorm folded, each non-depthwise Conv2d's input range taken over the
    calibration batches (checked here against hooks of our own), int8 weights per channel; the
    optimized model equals the eager quantized one (torch's conv over the integers) and is within
    int8 noise of fp32."""
    torch.manual_seed(0)
    model = ConvNet().eval()
    with torch.no_grad():  # a BatchNorm that does something
        model.bn1.running_mean.uniform_(-0.5, 0.5)
        model.bn1.running_var.uniform_(0.5, 2.0)
    batches = [torch.randn(2, 3, 16, 16) for _ in range(3)]
    seen = {}
    hook = model.conv2.register_forward_pre_hook(
        lambda m, a: seen.setdefault("conv2", []).append(a[0].detach()))
    with torch.no_grad():
        for b in batches:
            model(b)
    hook.remove()
    q = pypto.quantization.calibrate(model, batches)
    assert isinstance(q.conv1, pypto.quantization.StaticQuantizedConv2d)
    assert isinstance(q.conv2, pypto.quantization.StaticQuantizedConv2d)
    assert isinstance(q.bn1, torch.nn.Identity)  # folded into conv1
    assert type(q.dw) is torch.nn.Conv2d and type(q.fc) is torch.nn.Linear
    h = torch.cat([t.flatten() for t in seen["conv2"]])
    lo, hi = min(float(h.min()), 0.0), max(float(h.max()), 0.0)
    assert q.conv2.x_scale == pytest.approx((hi - lo) / 255, rel=1e-6)
    assert q.conv2.x_zero_point == round(-lo / q.conv2.x_scale)
    x = torch.randn(1, 3, 16, 16)
    fast = pypto.optimize(q, (x,))
    ops = [op for op, _ in fast.compiled.node_backends]
    assert ops.count("ConvInteger") == 2 and "BatchNormalization" not in ops, ops
    with torch.no_grad():
        eager, ref = q(x), model(x)
    got = fast(x)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5 * float(eager.abs().max()))
    assert float((got - ref).abs().max()) < 0.05 * float(ref.abs().max())
    assert fast.precision_report().max_rel_error < 0.05


def test_calibrate_options_per_channel_and_inplace():
    """per_channel=False gives one weight scale per conv (and a larger error than per channel on a
    net whose output channels differ in scale); inplace=True quantizes the model itself, so no
    float original remains for precision_report."""
    torch.manual_seed(0)
    model = ConvNet().eval()
    with torch.no_grad():  # output channels of very different magnitudes
        model.conv2.weight.mul_(torch.logspace(-2, 0, 16).reshape(16, 1, 1, 1))
    batches = [torch.randn(2, 3, 16, 16) for _ in range(3)]
    x = torch.randn(1, 3, 16, 16)
    errors = {}
    for per_channel in (True, False):
        q = pypto.quantization.calibrate(model, batches, per_channel=per_channel)
        assert q.conv2.weight_scale.unique().numel() == (16 if per_channel else 1)
        errors[per_channel] = pypto.optimize(q, (x,)).precision_report().max_rel_error
    assert errors[True] < errors[False], errors
    q = pypto.quantization.calibrate(model, batches, inplace=True)
    assert q is model and isinstance(model.conv1, pypto.quantization.StaticQuantizedConv2d)
    with pytest.raises(RuntimeError, match="float model it came from is not known"):
        pypto.optimize(model, (x,)).precision_report()


def test_a_per_channel_torch_ao_model_keeps_its_scales(mlp):
    """torch.ao with a per-channel weight observer: the int8 weights and per-channel scales are
    carried over as they are."""
    import warnings

    model, x = mlp
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qa = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear: qconfig},
                                                    dtype=torch.qint8)
    fast = pypto.optimize(qa, (x,))
    w = qa.fc1.weight()
    assert torch.equal(fast._orig_mod.fc1.weight, w.int_repr())
    torch.testing.assert_close(fast._orig_mod.fc1.weight_scale,
                               w.q_per_channel_scales().float())
    with torch.no_grad():
        ref, theirs = model(x), qa(x)
    assert float((fast(x) - ref).abs().max()) <= 1.2 * float((theirs - ref).abs().max()) + 1e-6


def test_calibrate_rejects_what_it_cannot_do():
    with pytest.raises(ValueError, match="no torch.nn.Conv2d"):
        pypto.quantization.calibrate(Mlp().eval(), [torch.randn(1, 96)])
    with pytest.raises(ValueError, match="empty"):
        pypto.quantization.calibrate(ConvNet().eval(), [])


def test_gpt2_conv1d_layers_are_quantized():
    """transformers' Conv1D (GPT-2's Linear, weight [in, out]) counts as a Linear."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=100, n_positions=32,
                                  use_cache=False, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2Model(cfg).eval()
    ids = torch.randint(0, 100, (1, 12))
    q = pypto.quantization.quantize_dynamic(model)
    assert isinstance(q.h[0].attn.c_attn, pypto.quantization.DynamicQuantizedLinear)
    fast = pypto.optimize(q, (ids,))
    ops = [op for op, _ in fast.compiled.node_backends]
    assert ops.count("DynamicQuantizeMatMul") == 4, ops  # c_attn, c_proj, c_fc, mlp c_proj
    with torch.no_grad():
        want = model(ids).last_hidden_state
        eager = q(ids).last_hidden_state
    got = fast(ids).last_hidden_state
    torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4 * float(eager.abs().max()))
    assert float((got - want).abs().max()) < 0.03 * float(want.abs().max())


def test_onnx_runtime_static_qdq_model_runs_on_integer_ops(tmp_path):
    """A conv net quantized by onnxruntime.quantization.quantize_static in its default QDQ form
    (per-tensor and per-channel weights): each Conv and the Gemm run on the integer ops (pass
    LowerQdqToInteger: QLinearConv, ConvInteger, MatMulInteger) and the outputs agree with ONNX
    Runtime's on the same file to float rounding."""
    import onnxruntime as ort
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    torch.manual_seed(0)
    model = ConvNet().eval()
    x = torch.randn(1, 3, 16, 16)
    fp32 = tmp_path / "net.onnx"
    torch.onnx.export(model, (x,), str(fp32), input_names=["x"], dynamo=False, opset_version=17)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": torch.randn(1, 3, 16, 16).numpy()} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    for per_channel in (False, True):
        q = tmp_path / f"net_qdq_{per_channel}.onnx"
        quantize_static(str(fp32), str(q), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=per_channel, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8)
        m = pypto.onnx.load(q)
        ops = [op for op, _ in m._compiled.node_backends]
        # Convs whose results are requantized run as QLinearConv, the Gemm (float output) as
        # MatMulInteger.
        assert ops.count("ConvInteger") + ops.count("QLinearConv") == 3, ops
        assert ops.count("MatMulInteger") == 1, ops
        assert "Conv" not in ops and "Gemm" not in ops
        got = m(x.numpy())
        want = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"]).run(
            None, {"x": x.numpy()})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
