"""torch nn.LSTM, nn.GRU and nn.RNN exported to ONNX (the LSTM, GRU and RNN ops) run on the CPU
kernels, not the reference interpreter, and match torch and onnxruntime: several layers,
bidirectional, batch_first, initial states given or not. The exporter is torch's TorchScript one
(dynamo=False), which writes the recurrent ops; the dynamo exporter and pypto.optimize unroll the
steps into MatMuls and gates instead."""

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
