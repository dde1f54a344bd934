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


class RejectedForms(torch.nn.Module):
    """Ops PyPTO converts, each in a form its converter rejects, between supported ops."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        h = torch.nn.functional.avg_pool2d(h, 2, divisor_override=3)  # rejected form
        idx = (torch.arange(h.shape[3]) % 3).expand(h.shape)
        h = h.scatter_reduce(3, idx, h * 2, "mean")  # reduce='mean': rejected
        h = torch.nn.functional.selu(h * 2 - 1)  # elu with scale and input_scale: rejected
        return torch.tanh(h) + 1


def test_rejected_forms_run_in_pytorch_and_the_rest_on_pypto(caplog):
    torch.manual_seed(0)
    model = RejectedForms().eval()
    fast = torch.compile(model, backend="pypto")
    x = torch.randn(2, 3, 9, 8)
    pieces = dynamo.stats()["pypto_pieces"]
    with caplog.at_level(logging.WARNING, logger="pypto"), torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    fallback = dynamo.stats()["fallback_ops"]
    for op in ("aten.avg_pool2d.default", "aten.scatter_reduce.two", "aten.elu.default"):
        assert op in fallback
    assert "divisor_override" in caplog.text and "reduce='mean'" in caplog.text
    assert dynamo.stats()["pypto_pieces"] - pieces >= 2  # conv+relu before, tanh+add after


def test_options_level_is_honoured():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    x = torch.randn(3, 4)
    for level in (0, 3):
        torch._dynamo.reset()
        dynamo._stats["levels"].clear()
        fast = torch.compile(model, backend="pypto", options={"level": level})
        with torch.no_grad():
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
        assert dynamo.stats()["levels"] == [level]


@pytest.mark.parametrize("options, error", [
    ({"levle": 1}, "unknown option.*'levle'.*known: level"),
    ({"level": 7}, r"options\['level'\].*0..3"),
])
def test_bad_options_are_errors(options, error):
    model = torch.nn.Linear(4, 4).eval()
    fast = torch.compile(model, backend="pypto", options=options)
    with pytest.raises(Exception, match=error), torch.no_grad():
        fast(torch.randn(2, 4))


@pytest.mark.parametrize("dynamic, batches", [
    (True, (1, 2, 3, 5, 2)),  # symbolic from the start (batch 1 may get a graph of its own)
    (None, (2, 3, 4, 6, 7)),  # static at first; Dynamo recompiles symbolic for batch 3
])
def test_a_symbolic_graph_compiles_once_for_every_batch(dynamic, batches):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 2)).eval()
    fast = torch.compile(model, backend="pypto", dynamic=dynamic)
    before = dynamo.stats()
    with torch.no_grad():
        for b in batches:
            x = torch.randn(b, 8)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    after = dynamo.stats()
    graphs = after["graphs"] - before["graphs"]
    assert graphs <= 2
    assert after["pypto_pieces"] - before["pypto_pieces"] == graphs  # not one per batch size
    assert after["pypto_runs"] - before["pypto_runs"] == len(batches)
