"""pypto.custom_op: a user op that torch sees as one op and PyPTO compiles from its body."""

import pytest
import torch

import pypto
from pypto.frontend import torch_capture


@pypto.custom_op("pypto_test::swish")
def swish(x):
    return x * torch.sigmoid(x)


@pypto.custom_op("pypto_test::scaled_sum")
def scaled_sum(x, y, alpha: float = 0.5):
    return x + alpha * y.tanh()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = swish(self.fc(x))
        return scaled_sum(h, x, 0.25)


def test_eager_calls_run_the_body():
    x = torch.randn(5)
    torch.testing.assert_close(swish(x), x * torch.sigmoid(x))
    assert swish.op is torch.ops.pypto_test.swish


def test_captured_graphs_show_one_op():
    torch.manual_seed(0)
    ep = torch_capture.export(Block().eval(), (torch.randn(2, 8),))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count("pypto_test.swish.default") == 1
    assert targets.count("pypto_test.scaled_sum.default") == 1
    assert not any("sigmoid" in t for t in targets)  # not decomposed by torch


def test_optimized_model_with_custom_ops_matches_eager():
    torch.manual_seed(0)
    model = Block().eval()
    fast = pypto.optimize(model, (torch.randn(2, 8),))
    assert "Sigmoid" in fast.graph.ops and "Tanh" in fast.graph.ops  # the bodies, compiled
    for b in (1, 3):
        x = torch.randn(b, 8)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)


def test_custom_op_inside_jit_and_torch_compile():
    @pypto.jit
    def f(x):
        return swish(x) + 1

    x = torch.randn(10)
    torch.testing.assert_close(f(x), x * torch.sigmoid(x) + 1)
    torch._dynamo.reset()
    compiled = torch.compile(Block().eval(), backend="pypto")
    with torch.no_grad():
        model = compiled._orig_mod
        torch.testing.assert_close(compiled(x.reshape(1, 10)[:, :8]), model(x.reshape(1, 10)[:, :8]))


def test_bad_registrations():
    with pytest.raises(ValueError, match="must look like 'namespace::op'"):
        pypto.custom_op("no_namespace")
    with pytest.raises(ValueError, match="already registered"):
        pypto.custom_op("pypto_test::swish")(lambda x: x)
    with pytest.raises(TypeError, match="has a default but no int/float/bool annotation"):
        pypto.custom_op("pypto_test::bad_default")(lambda x, y=None: x)
