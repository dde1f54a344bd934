"""Int8 convolution (QLinearConv on the int8 kernel, src/backend/cpu/quant_conv.cpp) against fp32
Conv in PyPTO on ResNet-50 layer shapes, and a statically quantized ResNet (ONNX Runtime's
quantize_static, QOperator format) in PyPTO against ONNX Runtime.

    python bench/int8_conv.py [--threads 1,2] [--model resnet18] [--reps 7]

Each layer is one ONNX node (batch 1, random weights, fp32 Conv or uint8 x int8 QLinearConv with
per-channel weight scales and an int32 bias) loaded with pypto.onnx.load; per thread count, the
two are timed in interleaved repetitions (one untimed call, then calls for about 20 ms; the median
repetition of --reps). GOP/s = 2 x OC x OH x OW x C/groups x KH x KW / time. The whole model is
timed the same way, PyPTO and ONNX Runtime (ORT_ENABLE_ALL, intra_op_num_threads = T) interleaved;
its weights are torchvision's architecture with seed-0 random weights, pre-processed by
quant_pre_process, its convs quantized (QLinearConv, uint8 activations, int8 weights per channel; the residual Adds and the pooling stay
float: QOperator writes them as com.microsoft ops) and calibrated on 4 random images. Run in one process per thread count (PTO_NUM_THREADS is read at start).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# (C, H, W, OC, k, stride, pad): the distinct 3x3 / 1x1 / 7x7 shapes of ResNet-50 at 224.
LAYERS = [
    (3, 224, 224, 64, 7, 2, 3),
    (64, 56, 56, 64, 3, 1, 1),
    (64, 56, 56, 256, 1, 1, 0),
    (256, 56, 56, 64, 1, 1, 0),
    (128, 28, 28, 128, 3, 1, 1),
    (512, 28, 28, 128, 1, 1, 0),
    (256, 14, 14, 256, 3, 1, 1),
    (1024, 14, 14, 256, 1, 1, 0),
    (512, 7, 7, 512, 3, 1, 1),
    (2048, 7, 7, 512, 1, 1, 0),
]


def timed(fns: dict, reps: int) -> dict:
    """Median seconds per call of each fn, interleaved repetitions."""
    per_call = {}
    for name, fn in fns.items():
        fn()
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < 0.02:
            fn()
            n += 1
        per_call[name] = max(1, n)
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            fn()
            t0 = time.perf_counter()
            for _ in range(per_call[name]):
                fn()
            times[name].append((time.perf_counter() - t0) / per_call[name])
    return {name: statistics.median(t) for name, t in times.items()}


def layer_models(c, h, w, oc, k, s, p, tmp: Path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)
    oh = (h + 2 * p - k) // s + 1
    ow = (w + 2 * p - k) // s + 1
    wf = rng.standard_normal((oc, c, k, k)).astype(np.float32) * 0.05
    f = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], "f",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, oc, oh, ow])],
        [numpy_helper.from_array(wf, "w")])
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
        numpy_helper.from_array(np.array(128, np.uint8), "xz"),
        numpy_helper.from_array(rng.integers(-127, 128, (oc, c, k, k)).astype(np.int8), "w"),
        numpy_helper.from_array((rng.random(oc) * 0.01 + 0.001).astype(np.float32), "ws"),
        numpy_helper.from_array(np.zeros(oc, np.int8), "wz"),
        numpy_helper.from_array(np.array(0.5, np.float32), "ys"),
        numpy_helper.from_array(np.array(100, np.uint8), "yz"),
        numpy_helper.from_array(rng.integers(-1000, 1000, oc).astype(np.int32), "b"),
    ]
    q = helper.make_graph(
        [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                          ["y"], **attrs)], "q",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, oc, oh, ow])], inits)
    paths = {}
    for name, g in (("fp32", f), ("int8", q)):
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        paths[name] = tmp / f"{name}.onnx"
        onnx.save(m, str(paths[name]))
    xf = rng.standard_normal((1, c, h, w)).astype(np.float32)
    xq = rng.integers(0, 256, (1, c, h, w)).astype(np.uint8)
    return paths, {"fp32": xf, "int8": xq}, 2.0 * oc * oh * ow * c * k * k


def bench_layers(reps: int) -> list[str]:
    import pypto.onnx

    lines = []
    for layer in LAYERS:
        with tempfile.TemporaryDirectory() as d:
            paths, xs, ops = layer_models(*layer, Path(d))
            models = {n: pypto.onnx.load(p) for n, p in paths.items()}
            t = timed({n: (lambda n=n: models[n](xs[n])) for n in models}, reps)
        c, h, w, oc, k, s, _ = layer
        g8, g32 = ops / t["int8"] / 1e9, ops / t["fp32"] / 1e9
        lines.append(f"| {c}x{h}x{w} -> {oc}, {k}x{k}/{s} | {g32:.0f} | {g8:.0f} | "
                     f"{g8 / g32:.2f}x |")
    return lines


def bench_model(model: str, threads: int, reps: int) -> str:
    import onnxruntime as ort
    import torch
    import torchvision
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    import pypto.onnx

    torch.manual_seed(0)
    net = getattr(torchvision.models, model)(weights=None).eval()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    with tempfile.TemporaryDirectory() as d:
        fp32, q = Path(d) / "m.onnx", Path(d) / "m.int8.onnx"
        torch.onnx.export(net, (torch.from_numpy(x),), str(fp32), input_names=["x"],
                          dynamo=False, opset_version=17)

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter([{"x": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
                                for _ in range(4)])

            def get_next(self):
                return next(self.it, None)

        # ORT's pre-processing: the exporter's Constant nodes become initializers (a conv's
        # bias must be one), shapes inferred.
        pre = Path(d) / "m.pre.onnx"
        quant_pre_process(str(fp32), str(pre))
        # Convs only: QOperator's residual Add and pooling are com.microsoft ops (QLinearAdd,
        # QLinearGlobalAveragePool), which PyPTO's importer rejects; they stay float here.
        quantize_static(str(pre), str(q), Reader(), quant_format=QuantFormat.QOperator,
                        per_channel=True, op_types_to_quantize=["Conv"],
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(q), opts, providers=["CPUExecutionProvider"])
        sess32 = ort.InferenceSession(str(fp32), opts, providers=["CPUExecutionProvider"])
        m, m32 = pypto.onnx.load(q), pypto.onnx.load(fp32)
        off = [op for op, b in m._compiled.node_backends if b != "cpu"]
        got, want = np.asarray(m(x)), sess.run(None, {"x": x})[0]
        rel = float(np.abs(got - want).max() / np.abs(want).max())
        t = timed({"pypto": lambda: m(x), "ort": lambda: sess.run(None, {"x": x}),
                   "pypto32": lambda: m32(x), "ort32": lambda: sess32.run(None, {"x": x})}, reps)
    ms = {k: v * 1e3 for k, v in t.items()}
    return (f"| {model} int8, {threads} thread(s) | {ms['pypto']:.2f} | {ms['ort']:.2f} | "
            f"{ms['ort'] / ms['pypto']:.2f}x | {ms['pypto32']:.2f} | {ms['ort32']:.2f} | "
            f"{rel:.1e} | {','.join(sorted(set(off))) or '-'} |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--child", type=int, default=0)
    args = ap.parse_args()
    if args.child:
        print(f"## {args.child} thread(s)")
        print("| layer (C x H x W -> OC, k/stride) | fp32 GOP/s | int8 GOP/s | int8 / fp32 |")
        print("|---|---|---|---|")
        print("\n".join(bench_layers(args.reps)), flush=True)
        print("| model | PyPTO int8 ms | ORT int8 ms | ORT / PyPTO | PyPTO fp32 ms | ORT fp32 ms "
              "| max diff / max ORT | not on CPU kernels |")
        print("|---|---|---|---|---|---|---|---|")
        print(bench_model(args.model, args.child, args.reps), flush=True)
        return 0
    for t in [int(v) for v in args.threads.split(",")]:
        env = dict(os.environ, PTO_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t))
        rc = subprocess.call([sys.executable, __file__, "--child", str(t), "--model", args.model,
                              "--reps", str(args.reps)], env=env)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
