#!/usr/bin/env python3
"""The DFT kernel alone (docs/backend/signal.md) against numpy.fft, torch.fft and onnxruntime at
FNet's and GFNet's shapes: one-node ONNX DFT graphs (opset 20), 1 thread each, timed interleaved
(pypto, onnxruntime, numpy, torch, pypto, ...), medians of the rounds.

    python bench/dft.py [--cases fnet_hidden,...] [--rounds 7]

Prints per case the median time of a call (ms) of each engine and pypto / each peer. numpy's and
torch's transforms are the same complex transform on the same float32 data (numpy computes in
float64, torch in float32); the load average is printed with the results.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, save

os.environ.setdefault("PTO_NUM_THREADS", "1")
import pypto  # noqa: E402
import torch  # noqa: E402
from timing import per_call  # noqa: E402

torch.set_num_threads(1)

# name: (input shape [..., 1 | 2], axis, inverse, onesided, what it is)
CASES = {
    "fnet_hidden": ((1, 512, 768, 1), 2, 0, 0, "FNet-base, fft over the hidden axis (real in)"),
    "fnet_seq": ((1, 512, 768, 2), 1, 0, 0, "FNet-base, fft over the sequence axis (strided)"),
    "fnet_seq_odd": ((1, 509, 768, 2), 1, 0, 0, "a prime sequence length (Bluestein)"),
    "fnet_tiny_hidden": ((2, 16, 64, 1), 2, 0, 0, "the sweep's tiny FNet, hidden axis"),
    "fnet_tiny_seq": ((2, 16, 64, 2), 1, 0, 0, "the sweep's tiny FNet, sequence axis"),
    "gfnet_rfft": ((8, 384, 14, 14, 1), 3, 0, 1, "GFNet-S, rfft over the width"),
    "gfnet_irfft": ((8, 384, 14, 8, 2), 3, 1, 1, "GFNet-S, irfft back to 14 points"),
}


def model(tmp, name, shape, axis, inverse, onesided):
    inputs = ["x", "", "axis"]
    inits = [numpy_helper.from_array(np.array(axis, np.int64), "axis")]
    if inverse and onesided:
        inputs[1] = "len"
        inits.append(numpy_helper.from_array(np.array(14, np.int64), "len"))
    node = helper.make_node("DFT", inputs, ["y"], inverse=inverse, onesided=onesided)
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                           list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    path = os.path.join(tmp, name + ".onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    return path


def numpy_fn(x, axis, inverse, onesided):
    z = x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]
    if inverse and onesided:
        return lambda: np.fft.irfft(z, n=14, axis=axis)
    if onesided:
        return lambda: np.fft.rfft(z, axis=axis)
    return lambda: (np.fft.ifft if inverse else np.fft.fft)(z, axis=axis)


def torch_fn(x, axis, inverse, onesided):
    t = torch.from_numpy(x)
    z = t[..., 0] if x.shape[-1] == 1 else torch.view_as_complex(t)
    if inverse and onesided:
        return lambda: torch.fft.irfft(z, n=14, dim=axis)
    if onesided:
        return lambda: torch.fft.rfft(z, dim=axis)
    return lambda: (torch.fft.ifft if inverse else torch.fft.fft)(z, dim=axis)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            shape, axis, inverse, onesided, what = CASES[name]
            x = rng.standard_normal(shape).astype(np.float32)
            path = model(tmp, name, shape, axis, inverse, onesided)
            exe = pypto.onnx.load(path)
            backends = {b for o, b in exe._compiled.node_backends if o == "DFT"}
            sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            engines = {"pypto": lambda: exe(x=x), "ort": lambda: sess.run(None, {"x": x}),
                       "numpy": numpy_fn(x, axis, inverse, onesided),
                       "torch": torch_fn(x, axis, inverse, onesided)}
            times = {k: [] for k in engines}
            for _ in range(args.rounds):
                for k, f in engines.items():
                    times[k].append(per_call(f) * 1e3)
            med = {k: statistics.median(v) for k, v in times.items()}
            ratios = ", ".join(f"{med['pypto'] / med[k]:.2f}x {k}" for k in engines if k != "pypto")
            print(f"{name:18s} {str(shape):22s} pypto {med['pypto']:.3f} ms ({'/'.join(backends)}), "
                  f"ort {med['ort']:.3f}, numpy {med['numpy']:.3f}, torch {med['torch']:.3f} ms; "
                  f"pypto is {ratios}   [{what}]", flush=True)
    print("load average:", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()
