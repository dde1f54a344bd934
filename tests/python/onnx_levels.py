"""A small model through ONNX at several optimization levels and thread counts: exported once,
onnxruntime checked against eager PyTorch, then each PyPTO level checked against eager too. For
the tests of one layout or fusion feature across levels (test_batch_norm_blocked.py,
test_channel_shuffle.py)."""

import numpy as np
import onnxruntime as ort
import torch

import pypto

TOLERANCE = 1e-4


def rel(got, want) -> float:
    return float(np.abs(np.asarray(got) - np.asarray(want)).max() / np.abs(want).max())


def export_checked(model, x, path) -> np.ndarray:
    """Exports `model` on `x` to `path` (opset 17, TorchScript exporter) and returns eager's
    output, after checking that onnxruntime's is within TOLERANCE of it."""
    torch.onnx.export(model, (x,), path, opset_version=17, dynamo=False)
    with torch.no_grad():
        want = model(x).numpy()
    peer = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert rel(peer.run(None, {peer.get_inputs()[0].name: x.numpy()})[0], want) < TOLERANCE
    return want


def levels(path, x, want, runs):
    """For each (level, threads) in `runs`: the file compiled at that level, run on that many
    threads within TOLERANCE of `want`; yields (level, threads, the ops of its plan)."""
    saved = pypto.get_num_threads()
    for level, threads in runs:
        pypto.set_num_threads(threads)
        try:
            m = pypto.onnx.load(path, level=level)
            assert rel(m(x.numpy()), want) < TOLERANCE, (level, threads)
        finally:
            pypto.set_num_threads(saved)
        yield level, threads, [op for op, _ in m._compiled.node_backends]
