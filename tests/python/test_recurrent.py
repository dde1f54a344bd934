"""torch nn.LSTM, nn.GRU and nn.RNN run on the CPU recurrent kernels, not the reference
interpreter, and match torch (and onnxruntime): exported to ONNX by torch's TorchScript exporter
(dynamo=False, which writes the LSTM, GRU and RNN ops) and loaded, or through pypto.optimize
(frontend/aten_rnn.py: one ONNX node per layer); several layers, bidirectional, batch_first,
initial states given or not, and a streaming GRU whose state is fed back call after call."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch

import pypto


class _Wrap(torch.nn.Module):
    """The RNN module with its state as an input and every output returned."""

    def __init__(self, rnn: torch.nn.Module):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, *state):
        if not state:
            y, h = self.rnn(x)
        else:  # LSTM: (h0, c0) as a pair; GRU and RNN: h0
            y, h = self.rnn(x, state if len(state) == 2 else state[0])
        return (y, *h) if isinstance(h, tuple) else (y, h)


def _module(kind: str, batch_first: bool, bidirectional: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}[kind]
    return cls(12, 24, num_layers=2, batch_first=batch_first,
               bidirectional=bidirectional).eval()


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("batch_first,bidirectional,with_state",
                         [(False, False, False), (True, True, True), (True, False, True),
                          (False, True, False)])
def test_torch_rnn_exported_runs_on_cpu_and_matches(tmp_path, kind, batch_first, bidirectional,
                                                     with_state):
    rnn = _module(kind, batch_first, bidirectional)
    model = _Wrap(rnn).eval()
    batch, seq = 3, 9
    x = torch.randn((batch, seq, 12) if batch_first else (seq, batch, 12))
    layers = 2 * (2 if bidirectional else 1)
    state = ()
    if with_state:
        h0 = torch.randn(layers, batch, 24)
        state = (h0, torch.randn(layers, batch, 24)) if kind == "lstm" else (h0,)
    path = tmp_path / f"{kind}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x, *state), path, dynamo=False, opset_version=17)
    with torch.no_grad():
        want = model(x, *state)
    loaded = pypto.onnx.load(path)
    got = loaded(x, *state)
    ops = [(op, b) for op, b in loaded._compiled.node_backends if op in ("LSTM", "GRU", "RNN")]
    assert len(ops) == 2 and all(b == "cpu" for _, b in ops), ops
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ort_out = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), (x, *state))})
    assert len(got) == len(want) == len(ort_out)
    for g, w, o in zip(got, want, ort_out):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=2e-5)
        np.testing.assert_allclose(g.numpy(), o, rtol=1e-4, atol=2e-5)


def test_streaming_gru_state_carried_across_calls(tmp_path):
    """Batch 1, one chunk per call, the state fed back: the same as one call on the whole
    sequence in torch."""
    torch.manual_seed(1)
    gru = torch.nn.GRU(16, 64, batch_first=True).eval()
    chunks = torch.randn(1, 4 * 32, 16).split(32, dim=1)
    path = tmp_path / "gru_stream.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(gru, (chunks[0], torch.zeros(1, 1, 64)), path, dynamo=False,
                          opset_version=17)
    loaded = pypto.onnx.load(path)
    h = torch.zeros(1, 1, 64)
    ys = []
    for c in chunks:
        y, h = loaded(c, h)
        ys.append(y)
    with torch.no_grad():
        want, want_h = gru(torch.cat(chunks, dim=1))
    np.testing.assert_allclose(torch.cat(ys, dim=1).numpy(), want.numpy(), rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(h.numpy(), want_h.numpy(), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("batch_first,bidirectional,with_state",
                         [(True, True, True), (False, False, False), (True, False, False)])
def test_optimize_maps_torch_rnn_to_one_node_per_layer(kind, batch_first, bidirectional,
                                                       with_state):
    """pypto.optimize converts aten.lstm/gru/rnn_tanh into ONNX LSTM/GRU/RNN nodes (one per
    layer, weights reordered and folded at compile time) that run on the CPU kernels."""
    model = _Wrap(_module(kind, batch_first, bidirectional))
    batch, seq = 2, 7
    x = torch.randn((batch, seq, 12) if batch_first else (seq, batch, 12))
    layers = 2 * (2 if bidirectional else 1)
    state = ()
    if with_state:
        state = tuple(torch.randn(layers, batch, 24) for _ in range(2 if kind == "lstm" else 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = pypto.optimize(model, (x, *state))
        got = fast(x, *state)
    with torch.no_grad():
        want = model(x, *state)
    op = kind.upper()
    backends = fast._compiled.node_backends
    assert [b for o, b in backends if o == op] == ["cpu", "cpu"], backends
    assert all(b == "cpu" for _, b in backends), backends
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("make", [
    lambda: torch.nn.LSTM(12, 24, proj_size=8, batch_first=True),  # no ONNX form: unrolled
    lambda: torch.nn.RNN(12, 24, nonlinearity="relu", batch_first=True),  # the reference's
])
def test_optimize_rnn_forms_without_a_kernel_still_match(make):
    torch.manual_seed(2)
    model = _Wrap(make().eval())
    x = torch.randn(2, 6, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = pypto.optimize(model, (x,))
        got = fast(x)
    with torch.no_grad():
        want = model(x)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=2e-5)


def test_lstm_with_unread_outputs_behind_a_view(tmp_path):
    """Silero VAD's form: an LSTM reading an Unsqueeze (a view that joins the LSTM's step) with
    Y and Y_c read by nothing. The step must hand over only the outputs that are read."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    hidden, feat, steps = 8, 5, 7
    w = numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, feat)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32) * 0.3,
                                "R")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["x3"]),
             helper.make_node("LSTM", ["x3", "W", "R"], ["y", "y_h", "y_c"], hidden_size=hidden),
             helper.make_node("Tanh", ["y_h"], ["out"])]
    graph = helper.make_graph(nodes, "lstm_views",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, feat])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              [w, r, axes])
    path = tmp_path / "lstm_views.onnx"
    path.write_bytes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    x = rng.standard_normal((steps, feat)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    exe = pypto.onnx.load(path)
    assert dict(exe._compiled.node_backends)["LSTM"] == "cpu"
    np.testing.assert_allclose(exe(x), want, rtol=1e-5, atol=1e-6)
