"""fp16 mixed precision from Python: pypto.optimize(dtype=torch.float16), pypto.amp.autocast
(dtype=torch.float16), models in fp16 (model.half(), ONNX float16 graphs), Cast to and from
float16 against numpy, the ONNX export run by ONNX Runtime, precision_report and the CLI; and
reduced-precision schemes PyPTO does not support (float6, MatMulNBits) rejected with a message.

The references are independent of PyPTO: float64 on operands rounded to fp16 by torch's own
conversion, eager PyTorch under torch.autocast, numpy's float16 conversion, ONNX Runtime.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import pypto
import test_precision
from test_precision import mlp  # noqa: F401 - the fixture

F16 = torch.float16


def rounded_reference(model, x):
    """The MLP in float64 with each Linear's input and weight rounded to fp16 first."""
    return test_precision.rounded_reference(model, x, F16)


def optimize_f16_products(model, x):
    """pypto.optimize with the auto_mixed_precision option on, in f16."""
    pypto.set_optimization_options({"auto_mixed_precision": True, "mixed_precision_dtype": "f16"})
    try:
        return pypto.optimize(model, (x,))
    finally:
        pypto.reset_optimization_options()


def fired(fast):
    return {k: v for r in fast.compiled.pass_report for k, v in r["fired"].items()}


def test_optimize_dtype_f16_is_an_fp16_model(mlp):  # noqa: F811
    model, x = mlp
    fast = pypto.optimize(model, (x,), dtype=F16)
    assert fired(fast).get("AutoMixedPrecision/f16 MatMul/Gemm") == 2, fired(fast)
    products = [line for line in str(fast.compiled.graph).splitlines()
                if " = MatMul(" in line or " = Gemm(" in line]
    assert products and all('precision="f16"' in line for line in products), products
    assert set(b for _, b in fast.compiled.node_backends) == {"cpu"}
    got = fast(x)
    assert got.dtype == F16
    g = fast.compiled.graph
    assert g.type(g.outputs[0])[0] == "f16", g.type(g.outputs[0])
    want = rounded_reference(model, x)
    np.testing.assert_allclose(got.double().numpy(), want.numpy(), rtol=2 ** -10, atol=1e-6)
    # fp16 inputs are taken too, and mean the same as their fp32 values.
    assert torch.equal(fast(x.to(F16)), fast(x.to(F16).float()))
    # Eager PyTorch under torch.autocast(fp16) rounds more (every product's output): close.
    with torch.no_grad(), torch.autocast("cpu", dtype=F16):
        eager = model(x)
    np.testing.assert_allclose(got.float().numpy(), eager.float().numpy(), rtol=0, atol=5e-3)


def test_a_saved_f16_model_loads_as_one(mlp, tmp_path):  # noqa: F811
    model, x = mlp
    fast = pypto.optimize(model, (x,), dtype=F16)
    pypto.save(fast, tmp_path / "m.pto")
    back = pypto.load(tmp_path / "m.pto")
    got = back(x)
    assert got.dtype == F16
    np.testing.assert_allclose(got.double().numpy(), rounded_reference(model, x).numpy(),
                               rtol=2 ** -10, atol=1e-6)
    assert torch.equal(back(x.half()), fast(x.half()))


def test_amp_autocast_f16_computes_the_products_on_fp16_operands(mlp):  # noqa: F811
    model, x = mlp
    fast = pypto.optimize(model, (x,))
    with pypto.amp.autocast(dtype=F16):
        got = fast(x)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.double().numpy(), rounded_reference(model, x).numpy(),
                               rtol=1e-5, atol=1e-6)
    f32 = fast(x)
    assert (f32 - got).abs().max() > 1e-6  # the rounding happened
    # bf16 and fp16 copies side by side: each its own rounding.
    with pypto.amp.autocast(dtype=torch.bfloat16):
        bf = fast(x)
    assert (bf - got).abs().max() > 1e-5
    with pypto.amp.autocast(dtype=F16):
        assert torch.equal(fast(x), got)


def test_auto_mixed_precision_option_f16(mlp):  # noqa: F811
    model, x = mlp
    fast = optimize_f16_products(model, x)
    assert fast(x).dtype == torch.float32
    np.testing.assert_allclose(fast(x).double().numpy(), rounded_reference(model, x).numpy(),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="mixed_precision_dtype must be one of 'bf16', 'f16', "
                                         "got 'fp8'"):
        pypto.set_optimization_options({"mixed_precision_dtype": "fp8"})


def test_transformer_block_f16_against_eager_autocast():
    """A transformer encoder layer (attention, LayerNorm, GELU MLP) with dtype=torch.float16,
    against eager PyTorch under torch.autocast("cpu", dtype=torch.float16): fp16 outputs within
    fp16 noise of eager's, and as close to fp32 as eager is."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, activation="gelu",
                                             batch_first=True).eval()
    x = torch.randn(2, 11, 64)
    fast = pypto.optimize(layer, (x,), dtype=F16)
    got = fast(x)
    assert got.dtype == F16
    with torch.no_grad():
        want = layer(x)
        with torch.autocast("cpu", dtype=F16):
            eager = layer(x)
    np.testing.assert_allclose(got.float().numpy(), eager.float().numpy(), rtol=0, atol=2e-2)
    err = (got.float() - want).abs().max().item()
    eager_err = (eager.float() - want).abs().max().item()
    assert err <= 1.5 * eager_err + 1e-3, (err, eager_err)
    assert fired(fast).get("AutoMixedPrecision/f16 MatMul/Gemm", 0) >= 3


@pytest.mark.parametrize("dtype", [F16, torch.bfloat16])
def test_a_half_model_with_the_same_dtype_takes_half_inputs(dtype):
    """optimize(model.half(), dtype=torch.float16) (bf16 alike): the graph's inputs are half
    already, so they are passed as they are, not widened."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 40), torch.nn.ReLU(),
                                torch.nn.Linear(40, 8)).eval().to(dtype)
    x = torch.randn(4, 48).to(dtype)
    got = pypto.optimize(model, (x,), dtype=dtype)(x)
    assert got.dtype == dtype
    with torch.no_grad():
        exact = model.double()(x.double())
    assert (got.double() - exact).abs().max() < 0.02 * exact.abs().max()


def test_half_model_exported_to_onnx_runs_like_onnx_runtime(tmp_path):
    """model.half() exported by torch.onnx: an ONNX graph with float16 tensors; PyPTO's outputs
    (fp16) against ONNX Runtime's on the same file."""
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 80), torch.nn.ReLU(),
                                torch.nn.Linear(80, 10), torch.nn.Softmax(-1)).eval().half()
    x = torch.randn(5, 32).half()
    path = tmp_path / "half.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["x"], dynamo=False, opset_version=17)
    m = pypto.onnx.load(path)
    assert all(b == "cpu" for _, b in m._compiled.node_backends), m._compiled.node_backends
    got = m(x.numpy())
    assert got.dtype == np.float16
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = sess.run(None, {"x": x.numpy()})[0]
    assert theirs.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), theirs.astype(np.float32), rtol=0,
                               atol=2e-3)


def test_an_fp16_onnx_conv_net_runs_on_the_blocked_kernels(tmp_path):
    """An fp16 ONNX file (model.half() exported, as models are shipped to halve their size): its
    convs compute in fp32 on the f16 weights (no CPU PyPTO runs on multiplies in f16), so at
    level 3 they run on the blocked direct and Winograd kernels as an fp32 model's do, not on the
    implicit GEMM that rounds activations to f16; the output matches ONNX Runtime's on the same
    file and is at least as close to exact as PyTorch's own fp16 arithmetic."""
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = test_precision.bn_with_statistics(test_precision.ConvNet()).half()
    x = torch.randn(2, 3, 40, 36).half()
    path = tmp_path / "convnet_fp16.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0].astype(np.float32)
    outs = {}
    for level in (2, 3):
        m = pypto.onnx.load(path, level=level)
        fired = {k: v for r in m._compiled.pass_report for k, v in r["fired"].items()}
        assert fired.get("PromoteHalf/f16 convs in fp32") == 5, fired  # not the depthwise one
        assert "PromoteHalf/f16 products" in fired, fired  # the Linear's Gemm keeps f16
        backends = m._compiled.node_backends
        assert {b for _, b in backends} == {"cpu"}, backends
        ops = {op for op, _ in backends}
        assert ("ConvBlocked" in ops) == (level == 3), ops
        outs[level] = m(x.numpy())
        assert outs[level].dtype == np.float16
        scale = np.abs(theirs).max()
        np.testing.assert_allclose(outs[level].astype(np.float32), theirs, atol=2e-3 * scale)
    # Within one fp16 step at the output's scale of eager's error: the final rounding to fp16 may
    # fall on the other side (the error is the same at every level, and before this change).
    ulp = 2.0 ** (np.floor(np.log2(np.abs(theirs).max())) - 10)
    test_precision.assert_as_close_to_exact_as_eager(model, x, torch.from_numpy(outs[3]), atol=ulp, bound=0.01)


def test_onnx_export_of_f16_products_runs_on_onnx_runtime(mlp, tmp_path):  # noqa: F811
    """precision="f16" exports as Cast(to=float16) + Cast(to=float) on each operand."""
    ort = pytest.importorskip("onnxruntime")
    import onnx

    model, x = mlp
    fast = optimize_f16_products(model, x)
    path = tmp_path / "mlp_f16.onnx"
    pypto.onnx.export(fast, (x,), path)
    casts = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Cast"]
    assert sorted({a.i for n in casts for a in n.attribute}) == [TensorProto.FLOAT,
                                                                 TensorProto.FLOAT16]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ort_out = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(ort_out, rounded_reference(model, x).numpy(), rtol=1e-5,
                               atol=1e-6)


def test_precision_report_f16(mlp):  # noqa: F811
    model, x = mlp
    fast = pypto.optimize(model, (x,), dtype=F16)
    report = fast.precision_report()
    want = model(x).detach().double()
    got = fast(x).double()
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert report.precision == "f16"
    assert report.max_rel_error == pytest.approx(err, rel=0.05, abs=1e-7)
    assert 1e-6 < report.max_rel_error < 2e-3
    info = pypto.device_info()["precision"]["f16"]
    assert info["fast"] is False  # no fp16 arithmetic is used: fp32 speed
    assert "fp32 FMA on operands rounded to fp16" in info["how"] and "fp32 speed" in info["how"]
    assert info["how"] in str(report) and "f16 against fp32" in str(report)
    # A plain compile's report inside pypto.amp.autocast(fp16) is its fp16 copy's.
    plain = pypto.optimize(model, (x,))
    with pypto.amp.autocast(dtype=F16):
        assert plain.precision_report().precision == "f16"
    assert plain.precision_report().precision == "bf16"


# ---- Cast to and from float16 against numpy ----

def cast_model(path):
    """x: float32 -> Cast(to=FLOAT16) -> y16; h: float16 -> Cast(to=FLOAT) -> h32."""
    import onnx

    nodes = [helper.make_node("Cast", ["x"], ["y16"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["h"], ["h32"], to=TensorProto.FLOAT)]
    g = helper.make_graph(
        nodes, "casts",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT16, ["m"])],
        [helper.make_tensor_value_info("y16", TensorProto.FLOAT16, ["n"]),
         helper.make_tensor_value_info("h32", TensorProto.FLOAT, ["m"])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def cast_inputs():
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = every[np.isfinite(every)].astype(np.float64)
    finite = np.unique(finite)
    mid = (finite[:-1] + finite[1:]) / 2  # ties between fp16 neighbours: to even
    mid = mid.astype(np.float32)
    x = np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)),
                        np.nextafter(mid, np.float32(-np.inf)),
                        np.array([65504, 65519.996, 65520, 1e6, -1e6, 2 ** -25, 2 ** -24,
                                  3 * 2 ** -26, 1e-30, -1e-30, 0.0, -0.0, np.inf, -np.inf,
                                  np.nan], dtype=np.float32),
                        np.random.default_rng(0).standard_normal(1001).astype(np.float32)])
    return x, every


def check_casts(y16, h32, x, every):
    want16 = x.astype(np.float16)  # numpy: round to nearest even, overflow to inf
    nan = np.isnan(want16)
    assert np.array_equal(np.isnan(y16), nan)
    assert np.array_equal(y16.view(np.uint16)[~nan], want16.view(np.uint16)[~nan])
    want32 = every.astype(np.float32)
    nan = np.isnan(want32)
    assert np.array_equal(np.isnan(h32), nan)
    assert np.array_equal(h32.view(np.uint32)[~nan], want32.view(np.uint32)[~nan])


def test_cast_f16_round_trip_against_numpy(tmp_path):
    x, every = cast_inputs()
    m = pypto.onnx.load(cast_model(tmp_path / "cast.onnx"))
    assert all(b == "cpu" for _, b in m._compiled.node_backends)
    y16, h32 = m(x, every)
    check_casts(y16, h32, x, every)
    # Round trip: every finite fp16 value through fp32 and back is itself.
    back, _ = m(h32[np.isfinite(h32)], every[:1])
    assert np.array_equal(back.view(np.uint16), every[np.isfinite(every)].view(np.uint16))


def test_cast_f16_without_f16c_against_numpy(tmp_path):
    """The same with PTO_DISABLE_EXT=f16c (the scalar conversions), in a fresh process."""
    path = cast_model(tmp_path / "cast.onnx")
    script = (
        "import sys, numpy as np, pypto, test_precision_f16 as t\n"
        "assert 'f16c' in pypto.device_info()['precision']['f16']['how']\n"
        "x, every = t.cast_inputs()\n"
        f"m = pypto.onnx.load({str(path)!r})\n"
        "t.check_casts(*m(x, every), x, every)\n"
        "print('ok')\n")
    env = dict(os.environ, PTO_DISABLE_EXT="f16c",
               PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(__file__), timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


# ---- the command line: --precision f16 ----

def test_cli_precision_f16(tmp_path):
    import re

    from test_cli import pto
    from test_precision import mlp_onnx

    model = mlp_onnx(tmp_path / "mlp.onnx")
    r = pto("compile", model, "--precision", "f16", "--stats")
    assert r.returncode == 0, r.stderr
    how = pypto.device_info()["precision"]["f16"]["how"]
    assert f"precision: f16 products ({how}) against fp32, on random inputs:" in r.stdout
    err = float(re.search(r"output 'y': max relative error ([0-9.e+-]+)", r.stdout).group(1))
    assert 1e-6 < err < 3e-3, r.stdout
    info = pto("info")
    assert f"f16:         {how}" in info.stdout, info.stdout
    for cmd in (["run", model], ["bench", model, "--iterations", "3", "--warmup", "1"],
                ["profile", model]):
        r = pto(*cmd, "--precision", "f16")
        assert r.returncode == 0, (cmd, r.stderr)


# ---- schemes PyPTO does not support: float6 ----

def save(path, nodes, inputs, outputs, inits=(), opset=21, domains=()):
    import onnx

    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    onnx.save(helper.make_model(g, opset_imports=imports), str(path))
    return path


def vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


def test_unsupported_low_precision_models_are_rejected_with_the_node_and_type(tmp_path):
    # int4, float8 and float4 are storage dtypes (tests/python/test_storage_dtypes.py); float6
    # is not supported. (onnxruntime's 4-bit MatMulNBits runs on its own kernel: test_mat_mul_nbits.py.)
    cases = {}
    cases["float6 input"] = (save(
        tmp_path / "fp6_in.onnx",
        [helper.make_node("Cast", ["x6"], ["y"], to=TensorProto.FLOAT, name="from_fp6")],
        [vi("x6", TensorProto.FLOAT6E2M3, [2, 4])], [vi("y", TensorProto.FLOAT, [2, 4])]),
        ["input 'x6'", "FLOAT6E2M3"])
    for what, (path, names) in cases.items():
        with pytest.raises((ValueError, NotImplementedError)) as e:
            pypto.onnx.load(path)
        for name in names:
            assert name in str(e.value), (what, str(e.value))
