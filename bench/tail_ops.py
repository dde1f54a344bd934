#!/usr/bin/env python3
"""The long tail of ONNX ops (docs/backend/tail.md) against ONNX Runtime: one-node ONNX graphs
at sizes real models use, 1 thread each, timed interleaved (pypto, onnxruntime, pypto, ...).

    python bench/tail_ops.py [--ops mvn_frames,hardmax,...] [--rounds 7] [--json FILE]

Prints per op the median time of a call (ms) of each engine and pypto / onnxruntime. Run it
against another build's module (PYTHONPATH=/path/to/python) for a before/after: onnxruntime's
time in the same run is the yardstick that absorbs the shared machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, save

os.environ.setdefault("PTO_NUM_THREADS", "1")
import pypto  # noqa: E402
from timing import per_call  # noqa: E402

F = TensorProto.FLOAT
# name: (op, input shape, attributes, opset, extra initializers, input dtype)
CASES = {
    "mvn_frames": ("MeanVarianceNormalization", (1, 80, 3000), {"axes": [2]}, 13, [], F),
    "mvn_time": ("MeanVarianceNormalization", (1, 3000, 80), {"axes": [1]}, 13, [], F),
    "mvn_nchw": ("MeanVarianceNormalization", (8, 64, 56, 56), {}, 13, [], F),
    "lppool": ("LpPool", (1, 64, 56, 56), {"kernel_shape": [3, 3], "strides": [2, 2],
                                           "pads": [1, 1, 1, 1], "p": 2}, 18, [], F),
    "hardmax": ("Hardmax", (256, 1000), {"axis": -1}, 13, [], F),
    "shrink": ("Shrink", (4, 1 << 18), {"lambd": 0.5, "bias": 0.1}, 18, [], F),
    "lpnorm": ("LpNormalization", (512, 768), {"axis": -1, "p": 2}, 13, [], F),
    "lrn": ("LRN", (1, 96, 55, 55), {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}, 13, [],
            F),
    "einsum_diag": ("Einsum", (64, 128, 128), {"equation": "bii->bi"}, 12, [], F),
    "trilu": ("Trilu", (12, 512, 512), {"upper": 1}, 14, [("k", np.array(1, np.int64))], F),
    "atan": ("Atan", (1 << 20,), {}, 18, [], F),
    "nms": ("NonMaxSuppression", None, None, 13, None, F),  # nms_model
    "rotary": ("RotaryEmbedding", None, None, 23, None, F),  # rotary_model
    "roi_align": ("RoiAlign", None, None, 16, None, F),  # roi_model
    "deform_conv": ("DeformConv", None, None, 19, None, F),  # deform_model
}


def nms_model(tmp):
    """YOLOv8-sized NonMaxSuppression: 8400 boxes, 80 classes, 100 per class, IoU 0.5, score
    0.25 (scores u^4: ~30% above it)."""
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 600, (1, 8400, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + rng.uniform(10, 100, (1, 8400, 2))], -1).astype(np.float32)
    scores = (rng.uniform(0, 1, (1, 80, 8400)) ** 4).astype(np.float32)
    inits = [numpy_helper.from_array(np.array([100], np.int64), "m"),
             numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.25], np.float32), "th")]
    graph = helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["x", "s", "m", "iou", "th"], ["y"])], "nms",
        [helper.make_tensor_value_info("x", F, [1, 8400, 4]),
         helper.make_tensor_value_info("s", F, [1, 80, 8400])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)], initializer=inits)
    path = os.path.join(tmp, "nms.onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path, {"x": boxes, "s": scores}


def rotary_model(tmp):
    """A LLaMA-7B prefill of 512 tokens: [1, 32, 512, 128], caches [4096, 64], position_ids."""
    rng = np.random.default_rng(0)
    angle = rng.uniform(0, 6.3, (4096, 64))
    feeds = {"x": rng.standard_normal((1, 32, 512, 128)).astype(np.float32),
             "c": np.cos(angle).astype(np.float32), "s": np.sin(angle).astype(np.float32),
             "p": np.arange(512, dtype=np.int64)[None]}
    info = [helper.make_tensor_value_info(k, TensorProto.INT64 if k == "p" else F, list(v.shape))
            for k, v in feeds.items()]
    graph = helper.make_graph([helper.make_node("RotaryEmbedding", list(feeds), ["y"])], "rope",
                              info, [helper.make_tensor_value_info("y", F, None)])
    path = os.path.join(tmp, "rope.onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), path)
    return path, feeds


def roi_model(tmp):
    """Faster R-CNN's box head input: 1000 regions on a [1, 256, 50, 68] stride-16 map, 7x7 bins,
    sampling_ratio 2."""
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 700, (1000, 2))
    feeds = {"x": rng.standard_normal((1, 256, 50, 68)).astype(np.float32),
             "r": np.concatenate([xy, xy + rng.uniform(16, 200, (1000, 2))], 1).astype(np.float32),
             "b": np.zeros(1000, np.int64)}
    info = [helper.make_tensor_value_info(k, TensorProto.INT64 if k == "b" else F, list(v.shape))
            for k, v in feeds.items()]
    node = helper.make_node("RoiAlign", ["x", "r", "b"], ["y"], output_height=7, output_width=7,
                            sampling_ratio=2, spatial_scale=1 / 16)
    graph = helper.make_graph([node], "roi", info, [helper.make_tensor_value_info("y", F, None)])
    path = os.path.join(tmp, "roi.onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]), path)
    return path, feeds


def deform_model(tmp):
    """A DCNv2 layer of a detection backbone (ResNet stage 3 with DCN): 256 channels 3x3 on a
    [1, 256, 50, 68] map, offsets of a few pixels, a mask, bias."""
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 256, 50, 68)).astype(np.float32),
             "off": (rng.standard_normal((1, 18, 50, 68)) * 2).astype(np.float32),
             "mask": rng.random((1, 9, 50, 68)).astype(np.float32)}
    inits = [numpy_helper.from_array((rng.standard_normal((256, 256, 3, 3)) * 0.02)
                                     .astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(256).astype(np.float32), "b")]
    info = [helper.make_tensor_value_info(k, F, list(v.shape)) for k, v in feeds.items()]
    node = helper.make_node("DeformConv", ["x", "w", "off", "b", "mask"], ["y"], pads=[1] * 4)
    graph = helper.make_graph([node], "dcn", info, [helper.make_tensor_value_info("y", F, None)],
                              initializer=inits)
    path = os.path.join(tmp, "dcn.onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), path)
    return path, feeds


def model(tmp, name):
    if name == "deform_conv":
        return deform_model(tmp)
    if name == "nms":
        return nms_model(tmp)
    if name == "roi_align":
        return roi_model(tmp)
    if name == "rotary":
        return rotary_model(tmp)
    op, shape, attrs, opset, inits, dtype = CASES[name]
    ins = ["x"] + [k for k, _ in inits]
    graph = helper.make_graph(
        [helper.make_node(op, ins, ["y"], **attrs)], name,
        [helper.make_tensor_value_info("x", dtype, list(shape))],
        [helper.make_tensor_value_info("y", dtype, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits])
    path = os.path.join(tmp, name + ".onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path, {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default=",".join(CASES))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json")
    a = p.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    results = {}
    print(f"load {open('/proc/loadavg').read().split()[:3]}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.ops.split(","):
            path, feeds = model(tmp, name)
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            exe = pypto.onnx.load(path)
            # An op a pass rewrote (Einsum) is no node of its own: "lowered".
            backend = dict(exe._compiled.node_backends).get(CASES[name][0], "lowered")
            pt, ot = [], []
            for _ in range(a.rounds):
                pt.append(per_call(lambda: exe(**feeds)))
                ot.append(per_call(lambda: sess.run(None, feeds)))
            mp, mo = statistics.median(pt) * 1e3, statistics.median(ot) * 1e3
            results[name] = {"pypto_ms": mp, "ort_ms": mo, "ratio": mp / mo, "backend": backend}
            print(f"{name:12s} {backend:9s} pypto {mp:9.3f} ms  onnxruntime {mo:8.3f} ms  "
                  f"ratio {mp / mo:6.2f}", flush=True)
    print(f"load {open('/proc/loadavg').read().split()[:3]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
