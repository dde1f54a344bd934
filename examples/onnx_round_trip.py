"""ONNX in and out: optimize a small model, export it to ONNX, run the file two ways.

A small convolutional classifier (random weights) is compiled with pypto.optimize, written to an
ONNX file in a temporary folder with pypto.onnx.export, then loaded back with pypto.onnx.load
(numpy in, numpy out) and with ONNX Runtime. The batch stays symbolic in the file, so both run
it at batch sizes other than the example's. All results are compared with PyTorch eager.

Run from the root of a clone, after building the extension (see docs/python.md):

    PYTHONPATH=python python examples/onnx_round_trip.py

Exits non-zero if any result differs from eager by more than 1e-5 (relative).
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import pypto


def rel_err(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def main() -> int:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10),
        torch.nn.Softmax(dim=-1)).eval()
    fast = pypto.optimize(model, example_inputs=(torch.randn(2, 3, 16, 16),))
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "small_net.onnx"
        pypto.onnx.export(fast, (torch.randn(2, 3, 16, 16),), path)
        exe = pypto.onnx.load(path)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        print(f"wrote {path.name} ({path.stat().st_size} bytes): input {name} "
              f"{sess.get_inputs()[0].shape}, pypto.onnx.load inputs {exe.input_names}")
        for batch in (1, 3, 8):
            x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16), np.float32)
            with torch.no_grad():
                want = model(torch.from_numpy(x)).numpy()
            got_pypto = exe(x)  # numpy in, numpy out
            (got_ort,) = sess.run(None, {name: x})
            e1, e2 = rel_err(got_pypto, want), rel_err(got_ort, want)
            ok &= isinstance(got_pypto, np.ndarray) and e1 <= 1e-5 and e2 <= 1e-5
            print(f"batch {batch}: max relative error vs eager: pypto.onnx.load {e1:.1e}, "
                  f"onnxruntime {e2:.1e}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
