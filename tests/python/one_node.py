"""One ONNX node with input x (and constant `inits`) run by onnxruntime and by PyPTO: the shared
harness of the tests of single-node kernels (test_lone_nodes.py, test_tail_ops.py)."""

from __future__ import annotations

import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, save

import pypto


def run_one_node(tmp_path, node, x, inits=(), opset=17, dtype=TensorProto.FLOAT):
    """(PyPTO's output, onnxruntime's output, {op: backend} of the compiled graph)."""
    path = str(tmp_path / "m.onnx")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", dtype, list(x.shape))],
        [helper.make_tensor_value_info("y", dtype, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    exe = pypto.onnx.load(path)
    got = exe(x=x)
    backends = {op: b for op, b in exe._compiled.node_backends}
    return got, want, backends
