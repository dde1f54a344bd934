"""torch.compile(model, backend="pypto"): the backend runs what it supports and leaves the rest
to PyTorch, never changing results."""

import logging

import pytest
import torch

import pypto
from pypto import dynamo


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_backend_is_registered():
    assert "pypto" in torch._dynamo.list_backends(exclude_tags=())


def test_compiled_model_matches_eager_and_runs_on_pypto():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)).eval()
    fast = torch.compile(model, backend="pypto")
    before = dynamo.stats()["pypto_runs"]
    with torch.no_grad():
        for b in (2, 3, 8):
            x = torch.randn(b, 16)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    assert dynamo.stats()["pypto_runs"] - before == 3


def test_resnet18_through_torch_compile():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    fast = torch.compile(model, backend="pypto")
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        got, want = fast(x), model(x)
    assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-4


class HasUnsupported(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        h = torch.special.i0(h)  # PyPTO has no conversion: stays in PyTorch
        return self.fc(h) * 2


def test_unsupported_ops_stay_with_pytorch_and_are_logged_once(caplog):
    torch.manual_seed(0)
    model = HasUnsupported().eval()
    fast = torch.compile(model, backend="pypto")
    x = torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="pypto"), torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    assert "aten.i0.default" in dynamo.stats()["fallback_ops"]
    assert caplog.text.count("aten.i0.default is not supported yet") <= 1
    assert dynamo.stats()["pypto_pieces"] >= 1  # the supported pieces did run on PyPTO
