"""Level 3's blocked-channel layout (AssignLayouts, docs/passes.md) from PyTorch: results against
PyTorch eager, and the plan's steps showing that blocked convolutions ran on the CPU backend.

The ten core zoo models (torch_models.CORE) run at level 3 here (the zoo test runs them at level
2), at batch 1 and 2 through one compiled module, to max|got - want| / max|want| <= 1e-4.
"""

import pytest
import torch

import pypto
import torch_models as tm

TOLERANCE = 1e-4


class SmallCnn(torch.nn.Module):
    """Convs with odd channel counts, a depthwise conv, a residual add, a per-channel affine, a
    concat on channels, pooling and a Linear head: every boundary AssignLayouts handles."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 32, 3, stride=2, padding=1)
        self.bn = torch.nn.BatchNorm2d(32)
        self.dw = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.pw = torch.nn.Conv2d(32, 32, 1)
        self.odd = torch.nn.Conv2d(32, 20, 3, padding=2, dilation=2)
        self.scale = torch.nn.Parameter(torch.randn(1, 32, 1, 1))
        self.head = torch.nn.Linear(52, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.stem(x)))
        z = torch.nn.functional.relu6(self.dw(y))
        z = self.pw(z) + y  # residual
        z = z * self.scale + 0.5  # per-channel constant, scalar
        w = torch.sigmoid(self.odd(z))  # 20 channels: not a multiple of the block
        cat = torch.cat([z, w], dim=1)
        cat = torch.nn.functional.max_pool2d(cat, 2)
        return self.head(cat.mean(dim=(2, 3)))


def test_small_cnn_at_level_3_matches_eager_and_runs_blocked_kernels():
    torch.manual_seed(0)
    model = SmallCnn().eval()
    with torch.no_grad():  # non-trivial BN statistics
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 33, 29)
    fast = pypto.optimize(model, example_inputs=x, level=3)
    with torch.inference_mode():
        want = model(x)
    got = fast(x)
    assert tm.relative_error(got, want) <= TOLERANCE
    if pypto.device_info()["isa"] == "generic":  # no vectors, no channel block: nothing blocked
        assert "ConvBlocked" not in [op for op, _ in fast.compiled.node_backends]
        return
    # The blocked convs and the reorders ran on the CPU backend, and a conv took its epilogue.
    steps = fast.compiled.steps
    ops = [op for op, backend in fast.compiled.node_backends]
    # Four blocked convs: the depthwise one and the 1x1 after it as one DwPwConvBlocked.
    assert ops.count("ConvBlocked") == 2 and ops.count("DwPwConvBlocked") == 1, ops
    assert all(b == "cpu" for op, b in fast.compiled.node_backends
               if op in ("ConvBlocked", "DwPwConvBlocked", "ReorderToBlocked",
                         "ReorderFromBlocked"))
    assert any(s["rule"].startswith("ConvBlocked+") for s in steps), steps
    # The stem (3 channels) reads the NCHW input itself: no reorder in; one or two out.
    assert ops.count("ReorderToBlocked") == 0 and 1 <= ops.count("ReorderFromBlocked") <= 2
    fired = {k: v for r in fast.compiled.pass_report if r["name"] == "AssignLayouts"
             for k, v in r["fired"].items()}
    assert fired.get("AssignLayouts/ConvBlocked(depthwise)") == 1, fired
    # Level 2 runs no blocked kernel.
    fast2 = pypto.optimize(model, example_inputs=x, level=2)
    assert "ConvBlocked" not in [op for op, _ in fast2.compiled.node_backends]


@pytest.mark.parametrize("name", tm.CORE)
def test_zoo_model_at_level_3_matches_eager(name):
    model = tm.build(name)
    fast = pypto.optimize(model, example_inputs=tm.inputs(name, 1), level=3)
    tm.check_at_batch_sizes(model, fast, name, TOLERANCE)
    assert fast.compiled.level == 3
    on_reference = sorted({op for op, b in fast.compiled.node_backends
                           if b != "cpu" and op in ("Conv", "ConvBlocked", "ReorderToBlocked",
                                                    "ReorderFromBlocked")})
    assert not on_reference, f"on the reference kernels: {on_reference}"


def test_grouped_convs_run_blocked_where_groups_fill_whole_blocks():
    """Grouped convs run blocked at level 3 where each group's channels fill whole blocks and match
    eager: all of RegNetX-400MF's (groups of 16 channels); ResNeXt-50 32x4d's last two stages (16
    and 32 channels a group), while its first two (4 and 8, on AVX-512's blocks of 16) stay NCHW."""
    import torchvision

    torch.manual_seed(0)
    x = torch.randn(1, 3, 96, 96)
    for build, grouped, nchw in ((torchvision.models.regnet_x_400mf, 22, 0),
                                 (torchvision.models.resnext50_32x4d, 9, 7)):
        model = build().eval()
        fast = pypto.optimize(model, example_inputs=x, level=3)
        with torch.inference_mode():
            want = model(x)
        assert tm.relative_error(fast(x), want) <= TOLERANCE, build.__name__
        if pypto.device_info()["isa"] != "avx512":
            continue  # blocks of 8 (AVX2) block more of them; generic blocks nothing
        fired = {k: v for r in fast.compiled.pass_report if r["name"] == "AssignLayouts"
                 for k, v in r["fired"].items()}
        assert fired.get("AssignLayouts/ConvBlocked(grouped)") == grouped, fired
        ops = [op for op, _ in fast.compiled.node_backends]
        assert ops.count("Conv") == nchw, (build.__name__, ops.count("Conv"))
