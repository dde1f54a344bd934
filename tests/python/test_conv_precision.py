"""torch.backends.mkldnn.conv.fp32_precision's meaning in PyPTO (docs/precision.md), as
conv_precision: "high" (torch's "tf32") computes the float32 convolutions of 128 or more output
and input channels as three bf16 products of X's and W's heads and tails (bf16x3) where the CPU has
AMX-BF16, else in fp32; "medium" (torch's "bf16") as bf16 products; "highest" ("ieee", the
default) in fp32; depthwise convs stay fp32. The option, the optimize() argument, torch's own
settings (old and new API), the CLI flag, the ONNX export and the errors, each against an
independent reference (float64 PyTorch, ONNX Runtime)."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import pypto

AMX = pypto.device_info()["precision"]["bf16x3"]["fast"]
BF16 = pypto.device_info()["precision"]["bf16"]["fast"]
F = torch.nn.functional


class Cnn(torch.nn.Module):
    """Two convs the "high" rule splits (16 -> 128 3x3: depth 144; 128 -> 160 1x1), a depthwise
    one and a narrow one (160 -> 32) it leaves fp32."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(16, 128, 3, padding=1)
        self.dw = torch.nn.Conv2d(128, 128, 3, padding=1, groups=128)
        self.c2 = torch.nn.Conv2d(128, 160, 1)
        self.c3 = torch.nn.Conv2d(160, 32, 1, bias=False)

    def forward(self, x):
        return self.c3(F.relu(self.c2(self.dw(F.relu(self.c1(x))))))


def split(t):
    """A float32 tensor's bf16 head and tail, in float64 (the parts bf16x3 multiplies)."""
    head = t.to(torch.bfloat16).float()
    return head.double(), (t - head).to(torch.bfloat16).double()


@torch.no_grad()
def split_reference(model, x):
    """The Cnn in float64 with c1 and c2 computed as Xh Wh + Xl Wh + Xh Wl (plus the bias)."""
    def conv(a, layer, **kw):
        (ah, al), (wh, wl) = split(a.float()), split(layer.weight)
        y = sum(F.conv2d(p, q, **kw) for p, q in ((ah, wh), (al, wh), (ah, wl)))
        return y + layer.bias.double().view(1, -1, 1, 1)

    m = model.double()
    try:
        h = m.dw(F.relu(conv(x.double(), model.c1, padding=1)))
        return m.c3(F.relu(conv(h, model.c2)))
    finally:
        model.float()


@pytest.fixture
def cnn():
    torch.manual_seed(0)
    return Cnn().eval(), torch.randn(2, 16, 12, 12)


def fired(fast):
    return {k: v for r in fast.compiled.pass_report for k, v in r["fired"].items()}


def convs(fast):
    return [line for line in str(fast.compiled.graph).splitlines() if " = Conv(" in line]


def relative(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@torch.no_grad()
def exact(model, x):
    try:
        return model.double()(x.double())
    finally:
        model.float()


def test_high_splits_the_wide_convs_on_amx_and_keeps_fp32_elsewhere(cnn):
    model, x = cnn
    fast = pypto.optimize(model, (x,), conv_precision="high")
    got = fast(x)
    assert got.dtype == torch.float32
    f32 = pypto.optimize(model, (x,), conv_precision="highest")(x)
    if not AMX:  # PyTorch's "tf32" without fast hardware: fp32
        assert fired(fast).get("ConvPrecision/float32: no AMX-BF16") == 3
        assert not any("bf16x3" in line for line in convs(fast))
        assert torch.equal(got, f32)
        return
    assert fired(fast).get("ConvPrecision/bf16x3 Conv") == 2
    assert fired(fast).get("ConvPrecision/float32: fewer than 128 channels") == 1
    assert sum('precision="bf16x3"' in line for line in convs(fast)) == 2, convs(fast)
    # The split products, to fp32 accumulation; 1e-6-ish from the exact result, where bf16 is
    # 1e-3 off and fp32 1e-7.
    assert relative(got, split_reference(model, x)) < 2e-6
    err = relative(got, exact(model, x))
    assert 2e-7 < err < 5e-5, err
    assert relative(f32, exact(model, x)) < err


def test_medium_is_bf16_products_on_every_dense_conv(cnn):
    model, x = cnn
    fast = pypto.optimize(model, (x,), conv_precision="medium")
    got = fast(x)
    if not BF16:
        assert torch.equal(got, pypto.optimize(model, (x,))(x))
        return
    assert fired(fast).get("ConvPrecision/bf16 Conv") == 3  # the depthwise one stays fp32
    assert 1e-4 < relative(got, exact(model, x)) < 3e-2


def test_matmul_and_conv_precisions_are_separate(cnn):
    """matmul_precision leaves convolutions alone (as torch.set_float32_matmul_precision does) and
    conv_precision leaves the matrix products alone."""
    model, x = cnn
    fast = pypto.optimize(model, (x,), matmul_precision="high")
    assert not any("precision=" in line for line in convs(fast))
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64)).eval()
    lin = pypto.optimize(mlp, (torch.randn(32, 64),), conv_precision="high")
    assert "precision=" not in str(lin.compiled.graph)


def run_python(code):
    package = str(Path(pypto.__file__).resolve().parents[1])  # this pypto, however it was found
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": package})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_torch_settings_are_followed_old_and_new_api():
    """Each in a fresh process (torch's precision state is global): the new API's per-backend
    values and the global one they default to, the old set_float32_matmul_precision, a mix of
    the two (where torch.get_float32_matmul_precision raises) and the options winning."""
    out = run_python("""
        import torch
        from pypto import options as o

        def show(tag):
            print(tag, o.matmul_precision(), o.matmul_precision(op="conv"))

        show("default")
        torch.backends.mkldnn.conv.fp32_precision = "bf16"
        show("conv-bf16")
        torch.backends.mkldnn.conv.fp32_precision = "tf32"
        show("conv-tf32")
        torch.backends.mkldnn.conv.fp32_precision = "none"
        torch.backends.fp32_precision = "tf32"
        show("global-tf32")
        torch.backends.fp32_precision = "ieee"
        torch.set_float32_matmul_precision("medium")
        show("legacy-medium")
        torch.backends.mkldnn.matmul.fp32_precision = "tf32"  # a mix: the old getter raises
        try:
            torch.get_float32_matmul_precision()
            print("getter ok")
        except RuntimeError:
            print("getter raises")
        show("mixed-tf32")
        o.set_optimization_options({"matmul_precision": "highest", "conv_precision": "medium"})
        show("options")
    """)
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert lines["default"] == "highest highest"
    assert lines["conv-bf16"] == "highest medium"
    assert lines["conv-tf32"] == "highest high"
    assert lines["global-tf32"] == "high high"
    assert lines["legacy-medium"] == "medium highest"
    assert lines["mixed-tf32"] == "high highest"
    assert lines["options"] == "highest medium"


def test_optimize_follows_torchs_conv_setting(cnn):
    model, x = cnn
    before = torch.backends.mkldnn.conv.fp32_precision
    torch.backends.mkldnn.conv.fp32_precision = "bf16"
    try:
        fast = pypto.optimize(model, (x,))
        assert (fired(fast).get("ConvPrecision/bf16 Conv") == 3) == BF16
        pypto.set_optimization_options({"conv_precision": "highest"})
        assert not any("precision=" in line for line in convs(pypto.optimize(model, (x,))))
    finally:
        torch.backends.mkldnn.conv.fp32_precision = before
        pypto.reset_optimization_options()
    assert not any("precision=" in line for line in convs(pypto.optimize(model, (x,))))


def test_bad_values_are_errors(cnn):
    model, x = cnn
    with pytest.raises(ValueError, match="'highest', 'high', 'medium'"):
        pypto.optimize(model, (x,), conv_precision="tf32")
    with pytest.raises(TypeError, match="conv_precision must be a str"):
        pypto.optimize(model, (x,), conv_precision=1)
    with pytest.raises(ValueError, match="conv_precision"):
        pypto.set_optimization_options({"conv_precision": "low"})
    with pytest.raises(TypeError, match="'conv_precision' must be str or None"):
        pypto.set_optimization_options({"conv_precision": 2})
    o = pypto._C.CompileOptions()
    o.conv_precision = "fastest"  # the C++ options reject it when compiling
    with pytest.raises(ValueError, match="conv_precision must be"):
        pypto._C.compile(pypto.optimize(model, (x,)).compiled.graph, o, False, "")


def test_onnx_export_of_split_convs_runs_on_onnx_runtime(cnn, tmp_path):
    """The export writes each bf16x3 conv as three Convs of Cast-rounded heads and tails, the
    bias with the first: ONNX Runtime computes what PyPTO does, to fp32 rounding."""
    ort = pytest.importorskip("onnxruntime")
    model, x = cnn
    fast = pypto.optimize(model, (x,), conv_precision="high")
    path = tmp_path / "high.onnx"
    pypto.onnx.export(fast, (x,), path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0])
    assert relative(got, fast(x)) < 1e-5
    if AMX:  # and not the fp32 convs: farther from the exact result than those
        f32 = pypto.optimize(model, (x,), conv_precision="highest")(x)
        assert relative(got, exact(model, x)) > 2 * relative(f32, exact(model, x))


def test_resnet18_under_high_is_near_fp32():
    """A real CNN under "high" (torchvision's ResNet-18, random weights): within 1e-4 of eager
    fp32, the zoo's tolerance, with its wide convs split on AMX."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=50).eval()
    x = torch.randn(1, 3, 96, 96)
    fast = pypto.optimize(model, (x,), conv_precision="high", level=3)
    with torch.no_grad():
        want = model(x)
    assert relative(fast(x), want) < 1e-4
    if AMX:  # the 128- to 512-channel convs (not the stem and the 64-channel stage)
        assert fired(fast).get("ConvPrecision/bf16x3 Conv", 0) >= 10


def cnn_onnx(path):
    """The Cnn as an ONNX file (PyPTO's own export of its fp32 compile)."""
    torch.manual_seed(0)
    model, x = Cnn().eval(), torch.randn(1, 16, 12, 12)
    pypto.onnx.export(pypto.optimize(model, (x,), conv_precision="highest", level=0), (x,), path)
    return Path(path)


def test_cli_conv_precision(tmp_path):
    from test_cli import expect_error, pto

    model = cnn_onnx(tmp_path / "cnn.onnx")
    r = pto("compile", model, "--conv-precision", "high", "--stats")
    assert r.returncode == 0, r.stderr
    how = pypto.device_info()["precision"]["bf16x3"]["how"]
    assert f"precision: bf16x3 products ({how}) against fp32, on random inputs:" in r.stdout
    err = float(re.search(r"max relative error ([0-9.e+-]+)", r.stdout).group(1))
    if AMX:
        assert "ConvPrecision/bf16x3 Conv x2" in r.stdout, r.stdout
        assert 1e-8 < err < 1e-4, r.stdout
    else:
        assert err == 0, r.stdout
    r2 = pto("compile", model, "--conv-precision", "high", "--stats",
             env={"PTO_DISABLE_EXT": "amx_bf16"})
    assert "ConvPrecision/float32: no AMX-BF16 x3" in r2.stdout, r2.stdout
    for cmd in (["run", model], ["bench", model, "--iterations", "3", "--warmup", "1"],
                ["profile", model]):
        r = pto(*cmd, "--conv-precision", "medium")
        assert r.returncode == 0, (cmd, r.stderr)
    expect_error(pto("compile", model, "--conv-precision", "tf32"),
                 "--conv-precision takes highest, high or medium, got 'tf32'", code=2)
    expect_error(pto("run", model, "--conv-precision", "high", "--engine", "reference"),
                 "--conv-precision needs the cpu engine", code=2)
    assert pto("compile", model, "-o", tmp_path / "m.pto").returncode == 0
    expect_error(pto("run", tmp_path / "m.pto", "--conv-precision", "high"),
                 "--conv-precision", code=2)
    assert "ConvPrecision" in pto("compile", "--list-passes").stdout



def test_torch_compile_follows_the_conv_precision_option(cnn):
    """torch.compile(backend="pypto") compiles with the options too: its convs split where
    optimize's are, to the same values (the float64 split reference on AMX, fp32 elsewhere)."""
    model, x = cnn
    pypto.set_optimization_options({"conv_precision": "high"})
    try:
        compiled = torch.compile(model, backend="pypto")
        with torch.no_grad():
            got = compiled(x)
    finally:
        pypto.reset_optimization_options()
        torch._dynamo.reset()
    if AMX:
        assert relative(got, split_reference(model, x)) < 2e-6
        assert relative(got, exact(model, x)) > relative(
            pypto.optimize(model, (x,), conv_precision="highest")(x), exact(model, x))
    else:
        assert relative(got, exact(model, x)) < 2e-6


def test_precision_report_measures_the_chosen_precision(cnn):
    """precision_report() of a float32 module compiled under conv_precision (or
    matmul_precision) is that mode against strict fp32: "bf16x3" for "high", "bf16" for
    "medium", with the error the outputs show against an fp32 compile, not a bf16 autocast copy."""
    model, x = cnn
    f32 = pypto.optimize(model, (x,), conv_precision="highest")(x)
    for setting, name, lo, hi in (("high", "bf16x3", 2e-7, 5e-5), ("medium", "bf16", 1e-4, 3e-2)):
        fast = pypto.optimize(model, (x,), conv_precision=setting)
        report = fast.precision_report()
        assert report.precision == name
        assert report.how == pypto.device_info()["precision"][name]["how"]
        err = report.max_rel_error
        assert err == pytest.approx(relative(fast(x), f32), rel=1e-6, abs=1e-12)
        fast_hw = AMX if setting == "high" else BF16
        assert (lo < err < hi) if fast_hw else err == 0, (setting, err)
