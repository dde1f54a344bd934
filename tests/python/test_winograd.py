"""Winograd F(4x4, 3x3) at level 3 (docs/backend/conv.md): torchvision ResNet-18 against PyTorch
eager, with the plan showing which blocked convolutions run Winograd.

The tolerance is the level-3 zoo test's, max|got - want| / max|want| <= 1e-4: Winograd's rounding
(about 1e-5 of max|y| per layer on random data) stays well inside it through the whole network.
"""

import os

import pytest
import torch

import pypto
import torch_models as tm

TOLERANCE = 1e-4
WINOGRAD = "winograd F(4x4,3x3)"


def conv_algorithms(fast) -> list[str]:
    """What each ConvBlocked step runs, in plan order."""
    c = fast.compiled
    return [c.describe_step(i) for i, s in enumerate(c.steps)
            if s["op"] == "ConvBlocked" or s["rule"].startswith("ConvBlocked")]


@pytest.fixture
def cost_rule():
    """The cost rule decides (PTO_WINOGRAD unset), whatever the environment says."""
    saved = os.environ.pop("PTO_WINOGRAD", None)
    yield
    if saved is not None:
        os.environ["PTO_WINOGRAD"] = saved


def check(model, fast, image: int, batches=(1, 2)):
    """`fast` against eager `model` on random images of each batch size, at TOLERANCE."""
    for batch in batches:
        torch.manual_seed(batch)
        x = torch.randn(batch, 3, image, image)
        with torch.inference_mode():
            want = model(x)
        err = tm.relative_error(fast(x), want)
        assert err <= TOLERANCE, f"batch {batch}: relative error {err:.3e}"


def test_resnet18_at_224_runs_winograd_and_matches_eager(cost_rule):
    model = tm.build("resnet18")
    fast = pypto.optimize(model, example_inputs=torch.randn(1, 3, 224, 224), level=3)
    check(model, fast, 224)
    if pypto.device_info()["isa"] == "generic":  # no channel block: nothing is blocked
        return
    algos = conv_algorithms(fast)
    # 13 of ResNet-18's convs are 3x3 stride 1 (layer1: 4, layers 2-4: 3 each, planes 56 to 7):
    # all Winograd at every batch; the stem, the strided 3x3 and the 1x1 convs stay direct.
    assert algos.count(WINOGRAD) == 13, algos
    assert algos.count("direct") == len(algos) - 13, algos


def test_resnet18_at_64_keeps_small_planes_direct(cost_rule):
    """At 64x64 the planes are 16, 8, 4 and 2: the 4x4 ones take Winograd from batch 4 (49 output
    pixels), the 2x2 ones never (a quarter of each tile would be used)."""
    model = tm.build("resnet18")
    fast = pypto.optimize(model, example_inputs=tm.inputs("resnet18", 1), level=3)
    check(model, fast, 64, batches=(1, 4))
    if pypto.device_info()["isa"] == "generic":
        return
    algos = conv_algorithms(fast)
    assert algos.count(WINOGRAD) == 7, algos  # layer1 (16x16) and layer2 (8x8)
    assert algos.count(WINOGRAD + " from batch 4, else direct") == 3, algos  # layer3


def test_profile_tags_the_algorithm_each_call_runs(cost_rule):
    """The profiler's tag is what the call ran, not what the plan prepared: layer3's three 3x3
    convs (4x4 planes, "from batch 4, else direct") are [direct] at batch 1 and [winograd] at
    batch 4; layers 1 and 2 are [winograd] at both."""
    model = tm.build("resnet18")
    fast = pypto.optimize(model, example_inputs=tm.inputs("resnet18", 1), level=3)
    if pypto.device_info()["isa"] == "generic":
        return

    def tags(batch: int) -> list[str]:
        x = torch.randn(batch, 3, 64, 64)
        fast(x)  # the first call at a shape is not the one profiled
        with pypto.profiler.profile() as prof:
            fast(x)
        return [e.key[e.key.index("[") + 1:-1] for e in prof.key_averages()
                if e.kind == "kernel" and e.key.startswith("ConvBlocked")]

    at1, at4 = tags(1), tags(4)
    assert len(at1) == len(at4) == len(conv_algorithms(fast)), (at1, at4)
    assert at1.count("winograd") == 7 and at4.count("winograd") == 10, (at1, at4)
    assert at1.count("direct") == len(at1) - 7, at1
