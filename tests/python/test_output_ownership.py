"""Outputs belong to the caller: writing into one never changes what a later call returns, even
where the output is a constant the compiler folded (zeros a torch.compile piece hands back,
an ONNX initializer returned as it is). Found through torchvision's paste_masks_in_image under
torch.compile(backend="pypto"): it fills the zeros of one piece in place, and the next mask
started from the last one's pixels."""

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import pypto


def test_torch_compile_constant_output_written_by_the_caller():
    def paste(mask, y0: int, y1: int):
        canvas = torch.zeros((6, 5))  # a constant output of the piece before the break
        rows = int(y1) - int(y0)      # .item(): a graph break, the rest runs in PyTorch
        canvas[y0:y1] = mask[:rows]
        return canvas

    compiled = torch.compile(paste, backend="pypto")
    mask = torch.rand(6, 5)
    for y0, y1 in [(1, 3), (4, 6), (0, 2), (2, 5)]:
        bounds = (torch.tensor(y0), torch.tensor(y1))
        torch.testing.assert_close(compiled(mask, *bounds), paste(mask, *bounds))


def test_onnx_constant_output_written_by_the_caller(tmp_path):
    table = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    t = helper.make_tensor_value_info("table", TensorProto.FLOAT, [3, 4])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["table"]),
         helper.make_node("Add", ["x", "table"], ["y"])],
        "g", [x], [y, t], [numpy_helper.from_array(table, "c")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    for level in (0, 2):
        model = pypto.onnx.load(str(path), level=level)
        ones = np.ones((3, 4), np.float32)
        first = model(x=ones)
        np.asarray(first[1])[...] = -7.0  # the caller writes into the constant output
        np.asarray(first[0])[...] = -7.0
        again = model(x=ones)
        np.testing.assert_array_equal(np.asarray(again[1]), table)
        np.testing.assert_array_equal(np.asarray(again[0]), table + 1)
