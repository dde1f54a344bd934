"""torch.set_float32_matmul_precision's meaning in PyPTO (docs/precision.md): "high" computes the
float32 matrix products as three bf16 products of the operands' heads and tails (bf16x3) where the
CPU has AMX-BF16, else in fp32; "medium" as bf16 products; "highest" (the default) in fp32. The
option, the optimize() argument, torch's own setting, the CLI flag, the ONNX export and the
errors, each against an independent reference (float64 PyTorch, ONNX Runtime)."""

import re

import numpy as np
import pytest
import torch

import pypto

AMX = pypto.device_info()["precision"]["bf16x3"]["fast"]
BF16 = pypto.device_info()["precision"]["bf16"]["fast"]


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(96, 200)
        self.fc2 = torch.nn.Linear(200, 33)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def split(t):
    """A float32 tensor's bf16 head and tail, in float64 (the parts bf16x3 multiplies)."""
    head = t.to(torch.bfloat16).float()
    return head.double(), (t - head).to(torch.bfloat16).double()


@torch.no_grad()
def split_reference(model, x):
    """The Mlp in float64 with each Linear computed as Ah Bh + Al Bh + Ah Bl."""
    def linear(a, layer):
        (ah, al), (wh, wl) = split(a.float()), split(layer.weight)
        return ah @ wh.T + al @ wh.T + ah @ wl.T + layer.bias.double()

    return linear(torch.nn.functional.gelu(linear(x, model.fc1)), model.fc2)


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return Mlp().eval(), torch.randn(40, 96)


def fired(fast):
    return {k: v for r in fast.compiled.pass_report for k, v in r["fired"].items()}


def products(fast):
    return [line for line in str(fast.compiled.graph).splitlines()
            if " = MatMul(" in line or " = Gemm(" in line]


def relative(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def test_high_splits_the_products_on_amx_and_keeps_fp32_elsewhere(mlp):
    model, x = mlp
    with torch.no_grad():
        exact = model.double()(x.double())
        model.float()
    fast = pypto.optimize(model, (x,), matmul_precision="high")
    got = fast(x)
    assert got.dtype == torch.float32
    f32 = pypto.optimize(model, (x,), matmul_precision="highest")(x)
    if not AMX:  # PyTorch's "high" without fast hardware: fp32
        assert fired(fast).get("MatMulPrecision/float32: no AMX-BF16") == 2
        assert not any("bf16x3" in line for line in products(fast))
        assert torch.equal(got, f32)
        return
    assert fired(fast).get("MatMulPrecision/bf16x3 MatMul/Gemm") == 2
    assert all('precision="bf16x3"' in line for line in products(fast)), products(fast)
    # The split products, to fp32 accumulation; 1e-6-ish from the exact result, where bf16 is
    # 1e-3 off and fp32 1e-7.
    assert relative(got, split_reference(model, x)) < 2e-6
    err = relative(got, exact)
    assert 2e-7 < err < 5e-5, err
    assert relative(f32, exact) < err
    medium = pypto.optimize(model, (x,), matmul_precision="medium")(x)
    assert relative(medium, exact) > 20 * err


def test_few_rows_stay_fp32_under_high(mlp):
    """A product of fewer than 16 rows (a decode step's) by its static shape keeps fp32: too few
    rows for a tile, and the weights' heads and tails stream slower than fp32's panels."""
    model, _ = mlp
    x = torch.randn(3, 96)
    fast = pypto.optimize(model, (x,), matmul_precision="high", dynamic=False)
    assert not any("bf16x3" in line for line in products(fast))
    if AMX:
        assert fired(fast).get("MatMulPrecision/float32: fewer than 16 rows") == 2
    with torch.no_grad():
        np.testing.assert_allclose(fast(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_medium_is_bf16_products_only(mlp):
    model, x = mlp
    fast = pypto.optimize(model, (x,), matmul_precision="medium")
    got = fast(x)
    assert got.dtype == torch.float32
    with torch.no_grad():
        exact = model.double()(x.double())
        model.float()
    if not BF16:
        assert torch.equal(got, pypto.optimize(model, (x,))(x))
        return
    assert all('precision="bf16"' in line for line in products(fast)), products(fast)
    assert 1e-4 < relative(got, exact) < 3e-2


def test_torch_float32_matmul_precision_is_followed_and_the_option_wins(mlp):
    model, x = mlp
    want = "bf16x3" if AMX else None
    torch.set_float32_matmul_precision("high")
    try:
        fast = pypto.optimize(model, (x,))
        assert any(want in line for line in products(fast)) if want else not any(
            "bf16x3" in line for line in products(fast))
        pypto.set_optimization_options({"matmul_precision": "highest"})
        assert not any("precision=" in line for line in products(pypto.optimize(model, (x,))))
    finally:
        torch.set_float32_matmul_precision("highest")
        pypto.reset_optimization_options()
    assert not any("precision=" in line for line in products(pypto.optimize(model, (x,))))
    pypto.set_optimization_options({"matmul_precision": "high"})
    try:
        fast = pypto.optimize(model, (x,))
        assert (fired(fast).get("MatMulPrecision/bf16x3 MatMul/Gemm") == 2) == AMX
    finally:
        pypto.reset_optimization_options()


def test_a_saved_model_keeps_its_split_products(mlp, tmp_path):
    """pypto.save writes the weights back from their heads and tails (values that split the same
    way again) and the graph's precision="bf16x3": the loaded model gives the same bits."""
    model, x = mlp
    fast = pypto.optimize(model, (x,), matmul_precision="high")
    pypto.save(fast, tmp_path / "high.pto")
    back = pypto.load(tmp_path / "high.pto")
    assert torch.equal(back(x), fast(x))
    assert ('precision="bf16x3"' in str(back.compiled.graph)) == AMX


def test_bad_values_are_errors(mlp):
    model, x = mlp
    with pytest.raises(ValueError, match="'highest', 'high', 'medium'"):
        pypto.optimize(model, (x,), matmul_precision="fast")
    with pytest.raises(TypeError, match="matmul_precision must be a str"):
        pypto.optimize(model, (x,), matmul_precision=1)
    with pytest.raises(ValueError, match="matmul_precision"):
        pypto.set_optimization_options({"matmul_precision": "low"})
    with pytest.raises(TypeError, match="'matmul_precision' must be str or None"):
        pypto.set_optimization_options({"matmul_precision": 2})
    o = pypto._C.CompileOptions()
    o.matmul_precision = "fastest"  # the C++ options reject it when compiling
    with pytest.raises(ValueError, match="matmul_precision must be"):
        pypto._C.compile(pypto.optimize(model, (x,)).compiled.graph, o, False, "")


def test_onnx_export_of_split_products_runs_on_onnx_runtime(mlp, tmp_path):
    """The export writes each bf16x3 product as its three products of Cast-rounded heads and
    tails: ONNX Runtime computes what PyPTO does, to fp32 rounding."""
    ort = pytest.importorskip("onnxruntime")
    model, x = mlp
    fast = pypto.optimize(model, (x,), matmul_precision="high")
    path = tmp_path / "high.onnx"
    pypto.onnx.export(fast, (x,), path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0])
    assert relative(got, fast(x)) < 1e-5  # GELU and the sums' order apart, the same
    if AMX:  # and not the fp32 products: farther from the exact result than those
        with torch.no_grad():
            exact = model.double()(x.double())
            model.float()
        f32 = pypto.optimize(model, (x,), matmul_precision="highest")(x)
        assert relative(got, exact) > 2 * relative(f32, exact)


def test_bert_under_high_is_near_fp32():
    """A transformer under "high": within 1e-4 of eager fp32 (the zoo's tolerance), with every
    Linear split on AMX."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128)
    model = transformers.BertModel(config).eval()
    kw = {"input_ids": torch.randint(0, 500, (2, 17)),
          "attention_mask": torch.ones(2, 17, dtype=torch.int64)}
    fast = pypto.optimize(model, example_kwargs=kw, matmul_precision="high")
    with torch.no_grad():
        want = model(**kw).last_hidden_state
    got = fast(**kw).last_hidden_state
    assert relative(got, want) < 1e-4
    if AMX:
        assert fired(fast).get("MatMulPrecision/bf16x3 MatMul/Gemm", 0) >= 2 * 6


def test_cli_matmul_precision(tmp_path):
    from test_cli import expect_error, pto
    from test_precision import mlp_onnx

    model = mlp_onnx(tmp_path / "mlp.onnx", rows=32)  # a tile's worth of rows
    r = pto("compile", model, "--matmul-precision", "high", "--stats")
    assert r.returncode == 0, r.stderr
    how = pypto.device_info()["precision"]["bf16x3"]["how"]
    assert f"precision: bf16x3 products ({how}) against fp32, on random inputs:" in r.stdout
    err = float(re.search(r"output 'y': max relative error ([0-9.e+-]+)", r.stdout).group(1))
    if AMX:
        assert "MatMulPrecision/bf16x3 MatMul/Gemm x2" in r.stdout, r.stdout
        assert 1e-8 < err < 1e-4, r.stdout
    else:
        assert err == 0, r.stdout
    # AMX turned off: fp32, as PyTorch's "high" without fast hardware.
    r2 = pto("compile", model, "--matmul-precision", "high", "--stats",
             env={"PTO_DISABLE_EXT": "amx_bf16"})
    assert "MatMulPrecision/float32: no AMX-BF16 x2" in r2.stdout, r2.stdout
    assert "bf16x3:" in pto("info").stdout
    for cmd in (["run", model], ["bench", model, "--iterations", "3", "--warmup", "1"],
                ["profile", model]):
        r = pto(*cmd, "--matmul-precision", "medium")
        assert r.returncode == 0, (cmd, r.stderr)
    expect_error(pto("compile", model, "--matmul-precision", "low"),
                 "--matmul-precision takes highest, high or medium, got 'low'", code=2)
    expect_error(pto("run", model, "--matmul-precision", "high", "--engine", "reference"),
                 "needs the cpu engine", code=2)
    assert pto("compile", model, "-o", tmp_path / "m.pto").returncode == 0
    expect_error(pto("run", tmp_path / "m.pto", "--matmul-precision", "high"),
                 "--matmul-precision", code=2)
