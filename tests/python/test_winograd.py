"""Winograd F(4x4, 3x3) at level 3 (docs/backend/conv.md): torchvision ResNet-18 against PyTorch
eager, with the plan showing which blocked convolutions ran Winograd.

The tolerance is the level-3 zoo test's, max|got - want| / max|want| <= 1e-4: Winograd's rounding
(about 1e-5 of max|y| per layer on random data) stays well inside it through the whole network.
"""

import os

import pytest
import torch

import pypto
import torch_models as tm

TOLERANCE = 1e-4


def conv_algorithms(fast) -> list[str]:
    """What each ConvBlocked step ran, in plan order."""
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


def test_resnet18_at_level_3_runs_winograd_and_matches_eager(cost_rule):
    model = tm.build("resnet18")
    fast = pypto.optimize(model, example_inputs=tm.inputs("resnet18", 1), level=3)
    tm.check_at_batch_sizes(model, fast, "resnet18", TOLERANCE)
    if pypto.device_info()["isa"] == "generic":  # no channel block: nothing is blocked
        return
    algos = conv_algorithms(fast)
    # 13 of ResNet-18's convs are 3x3 stride 1 (layer1: 4, layers 2-4: 3 each); the stem, the
    # strided 3x3 and the 1x1 downsampling convs stay direct.
    assert algos.count("winograd F(4x4,3x3)") == 13, algos
    assert all(a in ("direct", "winograd F(4x4,3x3)") for a in algos), algos
