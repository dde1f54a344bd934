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


# ---- frozen weights (inference): parameters and buffers become initializers ----

def _delta(before: dict) -> dict:
    after = dynamo.stats()
    return {k: after[k] - before[k] for k in after if isinstance(after[k], int)}


def _new_pieces(before: list) -> list:
    """The compiled graphs of the pieces compiled since `before` (a dynamo.pieces() list)."""
    seen = {id(g) for g in before}
    return [g for g in dynamo.pieces() if id(g) not in seen]


def _check_gradients(model, got, want):
    """The parameters' gradients of sum(got) (the compiled model's output) equal eager's."""
    got.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want.sum().backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "bert", "llama"])
def test_frozen_weights_match_eager_on_zoo_models(name):
    import torch_models

    model = torch_models.build(name)
    fast = torch.compile(model, backend="pypto")
    before, old = dynamo.stats(), dynamo.pieces()
    with torch.no_grad():
        for batch in (1, 2):
            x = torch_models.inputs(name, batch)
            got, want = fast(*x), model(*x)
            torch_models.check_nontrivial(torch_models.first_tensor(want), name)
            err = torch_models.relative_error(torch_models.first_tensor(got),
                                              torch_models.first_tensor(want))
            assert err <= 1e-4, f"batch {batch}: relative error {err:.2e}"
    d = _delta(before)
    assert d["fallback_nodes"] == 0 and d["weight_inputs"] == 0
    assert d["pypto_pieces"] == d["graphs"] >= 1
    # Every parameter and float buffer (a tied one counts once; the graph of an eval-mode
    # BatchNorm does not read num_batches_tracked)
    weights = len(list(model.parameters())) + sum(b.is_floating_point() for b in model.buffers())
    assert d["frozen_weights"] >= 0.9 * weights * d["graphs"]
    # The pieces take the model's inputs (and sizes), never a weight: those are initializers.
    graphs = _new_pieces(old)
    assert len(graphs) == d["pypto_pieces"]
    for g in graphs:
        assert all(not n.startswith("_frozen_") for n in g.input_names), g.input_names
        assert len(g.input_names) <= 3, g.input_names  # input_ids / the image, symbolic sizes
        assert any(n.startswith("_frozen_") for n in g.graph.initializer_names)
    if name == "bert":  # attention whole: one Attention kernel per layer, as in optimize
        # Both pieces: the static batch-1 one and the symbolic-batch one Dynamo recompiles for
        # batch 2 (its sizes read off the input's shape, so the head splits keep their dims).
        counts = [[op for op, _ in g.node_backends].count("Attention") for g in graphs]
        assert counts == [model.config.num_hidden_layers] * len(graphs), counts


def test_weights_are_frozen_at_compile_time():
    """As with pypto.optimize, the compiled module keeps the weights it was compiled with in
    packed form; compiling again (torch._dynamo.reset()) takes the new ones."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(4, 8)
    fast = torch.compile(model, backend="pypto")
    with torch.no_grad():
        first = fast(x)
        model[0].weight.mul_(2)  # PyPTO packed the old weight: not seen
        torch.testing.assert_close(fast(x), first)
        assert not torch.allclose(model(x), first)
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(model, backend="pypto")(x), model(x),
                                   rtol=1e-5, atol=1e-6)


def test_dynamic_bert_compiles_once_for_two_sequence_lengths():
    import torch_models

    model = torch_models.build("roberta")
    fast = torch.compile(model, backend="pypto", dynamic=True)
    before = dynamo.stats()
    with torch.no_grad():
        for batch, seq in ((2, 16), (3, 24), (2, 16)):
            torch.manual_seed(seq)
            ids = torch.randint(0, 1000, (batch, seq))
            want = model(ids).last_hidden_state
            err = torch_models.relative_error(fast(ids).last_hidden_state, want)
            assert err <= 1e-4, f"batch {batch}, sequence {seq}: relative error {err:.2e}"
    d = _delta(before)
    assert d["graphs"] == 1 and d["pypto_pieces"] == 1  # one symbolic graph for both lengths
    assert d["fallback_nodes"] == 0 and d["weight_inputs"] == 0 and d["frozen_weights"] > 0


class SelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_attention_under_autograd_keeps_its_backward_in_pytorch():
    """In training the attention's logsumexp output feeds the backward: that node stays in
    PyTorch, the rest runs on PyPTO, and the gradients are eager's."""
    torch.manual_seed(0)
    model = SelfAttention()
    fast = torch.compile(model, backend="pypto")
    x = torch.randn(2, 5, 16)
    mask = torch.rand(5, 5) > 0.3
    mask.fill_diagonal_(True)
    before = dynamo.stats()
    got = fast(x, mask)
    want = model(x, mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    _check_gradients(model, got, want)
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in \
        dynamo.stats()["fallback_ops"]
    assert _delta(before)["pypto_pieces"] >= 1


def test_attention_is_one_kernel_as_in_optimize():
    """scaled_dot_product_attention reaches PyPTO whole (not torch's decomposition of it): one
    Attention kernel, as pypto.optimize makes of the same module."""
    torch.manual_seed(0)
    model = SelfAttention().eval()
    x = torch.randn(2, 5, 16)
    mask = torch.rand(5, 5) > 0.3
    mask.fill_diagonal_(True)
    fast = torch.compile(model, backend="pypto")
    before, old = dynamo.stats(), dynamo.pieces()
    with torch.no_grad():
        torch.testing.assert_close(fast(x, mask), model(x, mask), rtol=1e-5, atol=1e-6)
    assert _delta(before)["fallback_nodes"] == 0
    ops = [op for g in _new_pieces(old) for op, _ in g.node_backends]
    optimized = pypto.optimize(model, (x, mask))
    assert ops.count("Attention") == 1
    assert [op for op, _ in optimized.compiled.node_backends].count("Attention") == 1


def test_a_graph_break_keeps_the_weights_frozen_in_each_piece():
    torch.manual_seed(0)
    model = HasUnsupported().eval()
    fast = torch.compile(model, backend="pypto")
    x = torch.randn(4, 8)
    before, old = dynamo.stats(), dynamo.pieces()
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    d = _delta(before)
    assert d["pypto_pieces"] == 2 and d["fallback_nodes"] == 1
    # fc's weight and bias, in both pieces: each piece takes one activation, nothing else
    assert d["frozen_weights"] == 4 and d["weight_inputs"] == 0
    graphs = _new_pieces(old)
    assert len(graphs) == 2
    for g in graphs:
        assert len(g.input_names) == 1


class BreakingLayer(torch.nn.Module):
    """A layer whose forward branches on data (Dynamo breaks the graph there and compiles the
    frame once for every layer of this class, passing each layer's parameters as inputs), as
    Hugging Face's BART does in fp16."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        if not torch.isfinite(y).all():
            y = y.clamp(-1e4, 1e4)
        return torch.relu(y) + x


def test_layers_sharing_one_compiled_frame_keep_their_own_weights():
    """Every layer runs with its own weights: the compiled graph froze the first layer's, and a
    call with another layer's is compiled (once) with those (it ran with the first's before:
    BART in fp16 0.56 off). One graph per layer, then no more compiling."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(BreakingLayer() for _ in range(3))).eval()
    fast = torch.compile(model, backend="pypto")
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
        graphs = dynamo.stats()["graphs"]
        torch.testing.assert_close(fast(2 * x), model(2 * x), rtol=1e-5, atol=1e-6)
        assert dynamo.stats()["graphs"] == graphs  # the variants are kept


def test_autograd_runs_the_forward_on_pypto_and_says_so(caplog):
    """Grad mode with parameters that require grad: the weights stay inputs (their gradients
    come from PyTorch's backward), with one warning that inference wants torch.no_grad()."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1)).eval()
    fast = torch.compile(model, backend="pypto")
    x = torch.randn(4, 8)
    before = dynamo.stats()
    dynamo._logged_messages.clear()  # (an earlier test may have had the warning)
    with caplog.at_level(logging.WARNING, logger="pypto"):
        for _ in range(2):
            got = fast(x)
    want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    _check_gradients(model, got, want)
    d = _delta(before)
    assert d["pypto_runs"] == 2 and d["frozen_weights"] == 0 and d["weight_inputs"] == 4
    assert caplog.text.count("runs under autograd") == 1


def test_train_mode_batch_norm_updates_its_running_stats_like_eager():
    """A BatchNorm in training mode mutates its buffers: those stay inputs (not frozen) and get
    the same updates as in eager; the conv weight is frozen."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    twin = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    twin.load_state_dict(model.state_dict())
    fast = torch.compile(model, backend="pypto")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), twin(x), rtol=1e-4, atol=1e-5)
    bn, bn_twin = model[1], twin[1]
    torch.testing.assert_close(bn.running_mean, bn_twin.running_mean, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(bn.running_var, bn_twin.running_var, rtol=1e-4, atol=1e-6)
    assert int(bn.num_batches_tracked) == 1


def test_without_a_tracing_context_the_weights_stay_inputs(monkeypatch, caplog):
    """Where AOT autograd gives no TracingContext to tell the weights by, the graph keeps them
    as inputs (correct, slower) and one warning says so."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model.eval()
    monkeypatch.setattr(dynamo, "_tracing_context", lambda: None)
    dynamo._logged_messages.clear()
    fast = torch.compile(model, backend="pypto")
    before, old = dynamo.stats(), dynamo.pieces()
    with caplog.at_level(logging.WARNING, logger="pypto"), torch.no_grad():
        for b in (3, 3):
            x = torch.randn(b, 8)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    d = _delta(before)
    assert d["frozen_weights"] == 0 and d["weight_inputs"] == 4 and d["pypto_runs"] == 2
    assert caplog.text.count("could not tell the weights") == 1
    (graph,) = _new_pieces(old)
    assert len(graph.input_names) == 5  # the four weights and x


# ---- the per-call path ----

class TwoOutputs(torch.nn.Module):
    """Two pieces (around i0, which PyPTO leaves to PyTorch), the second one fed a size when
    the batch is symbolic, and two outputs."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 6)

    def forward(self, x):
        h = torch.special.i0(self.fc(x)).transpose(0, 1)  # [6, batch]
        return torch.relu(h) * 2, h.reshape(-1, x.shape[0] * 2).sum(1)


@pytest.mark.parametrize("dynamic", [None, True])
def test_pieces_take_strided_views_and_sizes_and_return_every_output(dynamic):
    torch.manual_seed(0)
    model = TwoOutputs().eval()
    fast = torch.compile(model, backend="pypto", dynamic=dynamic)
    before = dynamo.stats()
    with torch.no_grad():
        for b in (3, 5, 3):
            x = torch.randn(8, b).t()  # a strided view goes to the first piece as it is
            for got, want in zip(fast(x), model(x), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    d = _delta(before)
    assert d["pypto_pieces"] >= 2 and d["pypto_runs"] >= 2 * 3  # both sides of i0, every call


def test_pieces_under_autograd_still_detach_their_inputs():
    """A training forward piece takes tensors that require grad: it runs on PyPTO and the
    gradients are PyTorch's (the per-call path that skips run()'s checks is for inference)."""
    torch.manual_seed(0)
    model = TwoOutputs()
    fast = torch.compile(model, backend="pypto")
    x = torch.randn(4, 8)
    got, want = fast(x), model(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    _check_gradients(model, got[0], want[0])


class MutatesItsInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        x.mul_(2)  # AOT autograd's wrapper writes this back into the caller's tensor
        return self.fc(x)


class ReturnsAView(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x), x[:, :2]  # the second output is a view of the input, as in eager


def test_inference_graphs_skip_aot_autograds_wrapper_and_match_eager():
    """An inference graph that mutates no input and returns no alias is called directly, with
    the results of eager: a graph of one piece, one of two pieces around an op left to PyTorch,
    and the symbolic graphs Dynamo compiles when the batch size changes (sizes as inputs)."""
    torch.manual_seed(0)
    before = dynamo.stats()
    for model in (torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                      torch.nn.Linear(16, 4)).eval(), HasUnsupported().eval()):
        fast = torch.compile(model, backend="pypto")
        with torch.no_grad():
            for b in (3, 3, 5):
                x = torch.randn(b, 8)
                torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    d = _delta(before)
    assert d["graphs"] == 4 and d["direct_graphs"] == 4 and d["weight_inputs"] == 0


@pytest.mark.parametrize("model_type", [MutatesItsInput, ReturnsAView])
def test_a_mutated_or_aliased_input_keeps_aot_autograds_wrapper(model_type):
    torch.manual_seed(0)
    model = model_type().eval()
    fast = torch.compile(model, backend="pypto")
    before = dynamo.stats()
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 8)
            x_eager = x.clone()
            got, want = fast(x), model(x_eager)
            torch.testing.assert_close(x, x_eager)  # mutated in place as in eager (or not at all)
            if model_type is ReturnsAView:
                assert got[1].data_ptr() == x.data_ptr() and got[1]._base is x
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    d = _delta(before)
    assert d["graphs"] == 1 and d["direct_graphs"] == 0 and d["pypto_runs"] == 2


def _inference_settings():
    """The settings docs/python.md suggests for inference: Inductor's freezing switch (read by
    Dynamo: parameters become graph attributes guarded by identity) and nn.Module guards checked
    by dict tags."""
    import contextlib

    import torch._inductor.config

    stack = contextlib.ExitStack()
    stack.enter_context(torch._inductor.config.patch(freezing=True))
    stack.enter_context(torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True))
    return stack


def test_inference_settings_keep_weights_frozen_and_see_replaced_weights():
    """Under the suggested settings the weights are still frozen (each piece takes only the
    input), and a replaced submodule or parameter makes Dynamo compile again with it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 4)).eval()
    fast = torch.compile(model, backend="pypto")
    x = torch.randn(3, 8)
    before, old = dynamo.stats(), dynamo.pieces()
    with torch.no_grad(), _inference_settings():
        for _ in range(3):
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
        d = _delta(before)
        assert d["graphs"] == 1 and d["frozen_weights"] == 4 and d["weight_inputs"] == 0
        (graph,) = _new_pieces(old)
        assert len(graph.input_names) == 1
        model[2] = torch.nn.Linear(16, 4)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
        model[0].weight = torch.nn.Parameter(torch.randn(16, 8))
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    assert _delta(before)["graphs"] == 3


def test_profiler_with_stack_records_each_call_of_a_piece():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    fast = torch.compile(model, backend="pypto")
    x = torch.randn(2, 8)
    with torch.no_grad():
        fast(x)
        with pypto.profiler.profile(with_stack=True) as prof:
            fast(x)
            fast(x)
    calls = [r for r in prof.key_averages() if r.kind == "call"]
    assert sum(r.count for r in calls) == 2 and all(" @ " in r.key for r in calls)


def test_a_size_returned_before_a_graph_break_is_a_python_int():
    # The code after a graph break computes with the sizes the graph before it returned
    # (transformers' sliding-window masks call torch.arange(kv_length)): a SymInt output must come
    # back as an int, not as a one-element tensor.
    def f(x, n):
        k = x.shape[1] + n.shape[0]
        y = x * 2
        torch._dynamo.graph_break()
        return y, torch.arange(k), k

    fast = torch.compile(f, backend="pypto", dynamic=True)
    for s in (3, 5, 7):
        x, n = torch.randn(2, s), torch.randn(s + 1)
        y, a, k = fast(x, n)
        assert type(k) is int and k == 2 * s + 1
        assert torch.equal(a, torch.arange(2 * s + 1)) and torch.equal(y, x * 2)


def _tiny_generator(name: str):
    import transformers

    torch.manual_seed(0)
    if name == "t5":  # encoder-decoder: the encoder once, the decoder with its two caches
        cfg = transformers.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
                                    vocab_size=500, decoder_start_token_id=0)
        return transformers.T5ForConditionalGeneration(cfg).eval()
    config, model = {"llama": ("LlamaConfig", "LlamaForCausalLM"),  # grouped K/V heads
                     "mistral": ("MistralConfig", "MistralForCausalLM"),  # sliding-window masks
                     # local layers' cache lengths through torch.sym_max, soft-capped scores
                     "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
                     "gpt2": ("GPT2Config", "GPT2LMHeadModel")}[name]
    kw = (dict(n_embd=64, n_layer=2, n_head=4) if name == "gpt2" else
          dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2))
    if name == "gemma2":
        kw.update(head_dim=16, sliding_window=8)  # shorter than prompt + new tokens
    return getattr(transformers, model)(getattr(transformers, config)(vocab_size=500, **kw)).eval()


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "gpt2", "t5"])
def test_generate_with_a_kv_cache_matches_eager(name):
    # model.generate() with transformers' DynamicCache: a prefill graph, then decode steps whose
    # cache grows by one position a call. Before, the backend failed on the first graph
    # (deep-copying it cloned a real constant's storage under AOT's fake mode) and, for Mistral,
    # returned its mask's sizes as tensors.
    model = _tiny_generator(name)
    ids = torch.randint(3, 500, (1, 12))

    def generate():
        with torch.inference_mode():
            return model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                                  output_scores=True, return_dict_in_generate=True)

    old = {id(g) for g in dynamo.pieces()}
    _generates_as_eager_on_pypto(model, generate, 8)
    # Prefill and decode graphs alike run each attention as one Attention kernel (a decode
    # step's K and V are Concat(cache, new), of a length no shape names; Llama's and Mistral's
    # grouped heads read without their repeat_kv copies) and each rotary embedding as one
    # RotaryEmbedding; a mask or position bias sliced to the key length (T5's decoder
    # self-attention) broadcasts as the Add did (Attention's mask_broadcast). Gemma-2's
    # soft-capped eager attention is one op too, its global layer in the steps with a symbolic
    # cache length included: torch writes those products as 3-D bmm over reshaped operands,
    # which UnflattenMatMul lifts back to the 4-D MatMul now that shape inference names the
    # cache's length (the sum of its parts) and so proves the reshapes.
    graphs = [g for g in dynamo.pieces() if id(g) not in old]
    assert len(graphs) >= 2  # the prompt's and the decode steps'
    for g in graphs:
        ops = [step["rule"] or step["op"] for step in g.steps]
        assert ops.count("Attention") >= 2 and "Softmax" not in ops, ops
        assert "Expand" not in ops, ops
        if name in ("llama", "mistral", "gemma2"):
            assert ops.count("RotaryEmbedding") == 4 and "Neg" not in ops, ops


def _generates_as_eager_on_pypto(model, generate, new_tokens: int):
    """generate() before and after model.forward goes through the backend: the same tokens,
    every step's scores within 1e-5, every step on PyPTO with frozen weights."""
    want = generate()
    model.forward = torch.compile(model.forward, backend="pypto")
    before = dynamo.stats()
    got = generate()
    d = _delta(before)
    assert torch.equal(got.sequences, want.sequences)
    for step, (g, w) in enumerate(zip(got.scores, want.scores)):
        finite = torch.isfinite(w)  # min_new_tokens masks the end token with -inf
        assert torch.equal(finite, torch.isfinite(g)), f"step {step}"
        err = (g - w)[finite].abs().max().item() / w[finite].abs().max().item()
        assert err <= 1e-5, f"step {step}: relative error {err:.2e}"
    assert d["pypto_runs"] >= new_tokens and d["fallback_nodes"] == 0
    assert d["weight_inputs"] == 0


@pytest.mark.parametrize("how", ["left-padded batch", "beam search", "sampling"])
def test_generate_batched_beams_and_sampling_match_eager(how):
    # A batch of two prompts, one left-padded (its mask and positions differ), beam search
    # (the cache reordered between steps) and top-k sampling. Their graphs sum cache lengths with
    # torch.sym_sum, which was left to PyTorch before.
    model = _tiny_generator("llama")
    model.generation_config.pad_token_id = 0
    ids = torch.randint(3, 500, (2, 10))
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 0, 0
    kw = {"left-padded batch": dict(do_sample=False), "beam search": dict(num_beams=3),
          "sampling": dict(do_sample=True, top_k=20)}[how]

    def generate():
        torch.manual_seed(5)
        with torch.inference_mode():
            return model.generate(ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6,
                                  output_scores=True, return_dict_in_generate=True, **kw)

    old = {id(g) for g in dynamo.pieces()}
    _generates_as_eager_on_pypto(model, generate, 6)
    # The padding mask, sliced to the cache's length in each decode step, goes into one Attention
    # (mask_broadcast): no graph of these runs keeps a Softmax.
    for g in (g for g in dynamo.pieces() if id(g) not in old):
        ops = [step["rule"] or step["op"] for step in g.steps]
        assert "Softmax" not in ops and ops.count("Attention") == 2, ops
