"""The compiler levels from Python: what stats() reports, that level 2 fuses and plans memory,
that the options change what is built, and that every level gives eager PyTorch's numbers."""

import numpy as np
import pytest
import torch

import pypto


class ConvNet(torch.nn.Module):
    """Conv-BN-ReLU blocks with a residual: what ResNets are made of."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(8)
        self.c3 = torch.nn.Conv2d(8, 8, 1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        z = torch.relu(self.b2(self.c2(y)) + y)
        z = torch.nn.functional.hardswish(self.c3(z))
        return self.fc(z.mean(dim=(2, 3)))


def conv_net():
    torch.manual_seed(0)
    m = ConvNet().eval()
    for bn in (m.b1, m.b2):  # non-trivial statistics, so folding them is visible in the numbers
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-0.2, 0.2)
    return m


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_every_level_matches_eager(level):
    model = conv_net()
    x = torch.randn(2, 3, 12, 12)
    fast = pypto.optimize(model, example_inputs=(x,), level=level)
    with torch.inference_mode():
        want = model(x)
    torch.testing.assert_close(fast(x), want, rtol=1e-4, atol=1e-5)
    x3 = torch.randn(3, 3, 12, 12)  # another batch size through the same compiled module
    torch.testing.assert_close(fast(x3), model(x3), rtol=1e-4, atol=1e-5)


def test_level_2_fuses_and_plans_memory():
    model = conv_net()
    x = torch.randn(1, 3, 16, 16)
    s0 = pypto.optimize(model, example_inputs=(x,), level=0).stats()
    s1 = pypto.optimize(model, example_inputs=(x,), level=1).stats()
    s2 = pypto.optimize(model, example_inputs=(x,), level=2).stats()
    assert s0["kernels"] == s0["nodes"] and s0["fused_kernels"] == 0
    assert s1["nodes"] < s0["nodes"]  # BatchNormalization folded into the convolutions
    assert s2["kernels"] < s1["kernels"] and s2["fused_kernels"] >= 3
    # Few intermediates here, so less than the unplanned sum, and no less than what is live at once.
    assert s2["memory_planned"] and s2["live_peak_bytes"] <= s2["peak_bytes"]
    assert s2["peak_bytes"] < s2["unplanned_peak_bytes"]
    assert not s0["memory_planned"] and s0["peak_bytes"] == s0["unplanned_peak_bytes"]
    rules = {step["rule"] for step in
             pypto.optimize(model, example_inputs=(x,), level=2).compiled.steps}
    assert any(r.startswith("Conv+") and r.endswith("+Relu") and "+Add" not in r for r in rules)
    assert "Conv+Add+Relu" in rules  # the residual block: conv, BN (folded), add, relu


def test_memory_optimization_option_has_an_effect():
    model = conv_net()
    x = torch.randn(1, 3, 16, 16)
    try:
        pypto.set_optimization_options({"memory_optimization": False})
        off = pypto.optimize(model, example_inputs=(x,), level=2)
        s = off.stats()
        assert not s["memory_planned"] and s["peak_bytes"] == s["unplanned_peak_bytes"]
        torch.testing.assert_close(off(x), model(x), rtol=1e-4, atol=1e-5)
    finally:
        pypto.reset_optimization_options()
    assert pypto.optimize(model, example_inputs=(x,), level=2).stats()["memory_planned"]


def test_jit_lennard_jones_is_one_kernel():
    @pypto.jit
    def lj(r):
        s6 = (3.4 / r) ** 6
        return 4 * 0.1 * (s6 * s6 - s6)

    r = torch.rand(4099) + 1.0
    torch.testing.assert_close(lj(r), lj.__wrapped__(r), rtol=2e-6, atol=0)
    assert lj.stats()["kernels"] == 1
    with pytest.raises(RuntimeError, match="not been called"):
        pypto.jit(lambda r: r * 2).stats()


def test_pass_report_and_profile_name_the_kernels():
    model = conv_net()
    x = torch.randn(1, 3, 16, 16)
    fast = pypto.optimize(model, example_inputs=(x,), level=2)
    report = fast.compiled.pass_report
    fold = next(r for r in report if r["name"] == "FoldBatchNorm")
    assert sum(fold["fired"].values()) == 2
    prof = fast.profile(x)
    assert len(prof) == fast.stats()["kernels"]
    assert any(op.startswith("Conv+") for _, op, _ in prof)


def test_onnx_model_stats(tmp_path):
    model = conv_net()
    x = torch.randn(1, 3, 16, 16)
    path = tmp_path / "m.onnx"
    pypto.onnx.export(model, (x,), str(path))
    exe = pypto.onnx.load(str(path), level=2)
    np.testing.assert_allclose(exe(x.numpy()), model(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    s = exe.stats(x.shape)
    assert s["kernels"] < s["nodes_in"] and s["memory_planned"]


def test_onnx_weights_held_once(tmp_path):
    """Weights the GEMM/conv kernels pack are released from the compiled graph: the three convs
    and the Linear of conv_net (BatchNorm folded into the convs first), not the biases. Export
    still writes a complete model, which loads and runs to the same numbers."""
    model = conv_net().eval()
    x = torch.randn(2, 3, 16, 16)
    path = tmp_path / "m.onnx"
    pypto.onnx.export(model, (x,), str(path))
    want = model(x).detach().numpy()
    packed = sum(m.weight.numel() * 4 for m in (model.c1, model.c2, model.c3, model.fc))
    try:
        for release in (True, False):
            pypto.set_optimization_options({"release_packed_weights": release})
            exe = pypto.onnx.load(str(path), level=2)
            np.testing.assert_allclose(exe(x.numpy()), want, rtol=1e-4, atol=1e-5)
            s = exe.stats(x.shape)
            assert s["released_weight_bytes"] == (packed if release else 0)
            assert s["packed_weight_bytes"] >= packed
            again = tmp_path / f"again_{release}.onnx"
            pypto.onnx.export(exe, None, str(again))
            np.testing.assert_allclose(pypto.onnx.load(str(again))(x.numpy()), want,
                                       rtol=1e-4, atol=1e-5)
    finally:
        pypto.reset_optimization_options()
    # compile(consume=True) takes the graph's contents (the weights can then go as they are
    # packed); without it the caller's graph keeps them, and nothing is released.
    g = pypto._C.onnx_load(str(path))
    kept = pypto._C.compile(g, pypto._C.CompileOptions())
    assert len(g.ops) > 0 and kept.stats(None)["released_weight_bytes"] == 0
    del kept  # it shares g's weights: while it lives, releasing them would free nothing
    taken = pypto._C.compile(g, pypto._C.CompileOptions(), True)
    assert len(g.ops) == 0 and taken.stats(None)["released_weight_bytes"] == packed


def test_stats_count_weights_and_packed_copies():
    model = conv_net()
    x = torch.randn(1, 3, 16, 16)
    s = pypto.optimize(model, example_inputs=(x,), level=2).stats()
    params = sum(p.numel() * 4 for p in model.parameters())
    # Folded BatchNorm adds conv biases and drops BN parameters: within the parameter count.
    assert 0 < s["weight_bytes"] <= params + 4096  # plus a few scalar and shape constants
    # The three convolutions and the Linear are packed; panels round up, never below the data.
    conv_fc = sum(m.weight.numel() * 4 for m in (model.c1, model.c2, model.c3, model.fc))
    assert s["packed_weight_bytes"] >= conv_fc
    # The BatchNorm-folded weights of c1 and c2 are PyPTO's own: released once packed. c3's and
    # the Linear's are the module's parameters (shared, not copied): kept.
    assert s["released_weight_bytes"] == sum(m.weight.numel() * 4 for m in (model.c1, model.c2))


class InceptionBlock(torch.nn.Module):
    """Four parallel branches (1x1; 1x1-3x3; 1x1-5x5; pool-1x1) concatenated, twice: small
    independent kernels that run at the same time (stages)."""

    def __init__(self, c=16):
        super().__init__()
        self.blocks = torch.nn.ModuleList()
        for _ in range(2):
            self.blocks.append(torch.nn.ModuleList([
                torch.nn.Conv2d(c, c // 4, 1),
                torch.nn.Sequential(torch.nn.Conv2d(c, c // 4, 1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(c // 4, c // 4, 3, padding=1)),
                torch.nn.Sequential(torch.nn.Conv2d(c, c // 8, 1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(c // 8, c // 4, 5, padding=2)),
                torch.nn.Sequential(torch.nn.MaxPool2d(3, 1, 1), torch.nn.Conv2d(c, c // 4, 1)),
            ]))

    def forward(self, x):
        for branches in self.blocks:
            x = torch.relu(torch.cat([b(x) for b in branches], 1))
        return x


def test_concurrent_kernels_match_eager_and_sequential():
    """With two threads the branches run as stages; the results equal eager PyTorch's and, bit
    for bit, those of the same model compiled with concurrent_kernels off (no stages)."""
    model = InceptionBlock().eval()
    saved = pypto.get_num_threads()
    try:
        pypto.set_num_threads(2)
        exes = {}
        for on in (True, False):
            pypto.set_optimization_options({"concurrent_kernels": on})
            exes[on] = pypto.optimize(model, example_inputs=(torch.randn(1, 16, 9, 9),))
        assert exes[True].stats()["stages"] >= 2 and exes[True].stats()["staged_kernels"] >= 6
        assert exes[False].stats()["stages"] == 0
        for batch in (1, 3):
            x = torch.randn(batch, 16, 9, 9)
            with torch.no_grad():
                want = model(x)
            got = exes[True](x)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
            assert torch.equal(got, exes[False](x))
    finally:
        pypto.reset_optimization_options()
        pypto.set_num_threads(saved)
