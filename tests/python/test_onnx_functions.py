"""Model-local functions (ModelProto.functions): calls are inlined as the model loads
(src/frontend/onnx/functions.cpp), as onnxruntime does; outputs are compared with onnxruntime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import pypto

F = TensorProto.FLOAT
DOMAIN = "local"


def _vi(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


def _leaky_scale():
    """local.LeakyScale(x, s) -> (y, t): t = LeakyRelu(x){alpha = @alpha}, y = t * s + 1; alpha
    defaults to 0.25."""
    one = helper.make_node("Constant", [], ["one"], value_float=1.0)
    leaky = helper.make_node("LeakyRelu", ["x"], ["t"])
    leaky.attribute.append(helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))
    mul = helper.make_node("Mul", ["t", "s"], ["u"])
    add = helper.make_node("Add", ["u", "one"], ["y"])
    f = helper.make_function(DOMAIN, "LeakyScale", ["x", "s"], ["y", "t"], [one, leaky, mul, add],
                             [helper.make_opsetid("", 17)], attributes=[])
    f.attribute_proto.append(helper.make_attribute("alpha", 0.25))
    return f


def _twice():
    """local.Twice(x) -> y: LeakyScale(LeakyScale(x, x), x), calling the other function."""
    a = helper.make_node("LeakyScale", ["x", "x"], ["a", "a_t"], domain=DOMAIN, alpha=0.5)
    b = helper.make_node("LeakyScale", ["a", "x"], ["y", "b_t"], domain=DOMAIN)
    return helper.make_function(DOMAIN, "Twice", ["x"], ["y"], [a, b],
                                [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


def _run(tmp_path, model, feeds):
    path = tmp_path / "f.onnx"
    onnx.save(model, path)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for level in (0, 2):
        got = pypto.onnx.load(str(path), level=level)(**feeds)
        got = got if isinstance(got, (list, tuple)) else [got]
        assert len(got) == len(want)
        for w, g in zip(want, got):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-6)


def _model(nodes, inputs, outputs, functions):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, functions=functions,
                             opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(DOMAIN, 1)])


def test_function_called_twice_with_attribute_and_default(tmp_path):
    nodes = [helper.make_node("LeakyScale", ["x", "s"], ["y1", "t1"], domain=DOMAIN, alpha=0.1,
                              name="first"),
             helper.make_node("LeakyScale", ["y1", "s"], ["y2", "t2"], domain=DOMAIN)]  # default
    m = _model(nodes, [_vi("x", [2, 8]), _vi("s", [8])], [_vi("y2", [2, 8]), _vi("t1", [2, 8])],
               [_leaky_scale()])
    rng = np.random.default_rng(0)
    _run(tmp_path, m, {"x": rng.standard_normal((2, 8), dtype=np.float32),
                       "s": rng.standard_normal(8, dtype=np.float32)})


def test_nested_function_calls(tmp_path):
    m = _model([helper.make_node("Twice", ["x"], ["y"], domain=DOMAIN)], [_vi("x", [3, 5])],
               [_vi("y", [3, 5])], [_leaky_scale(), _twice()])
    _run(tmp_path, m, {"x": np.random.default_rng(1).standard_normal((3, 5), dtype=np.float32)})


def test_function_inside_an_if_branch(tmp_path):
    then_g = helper.make_graph([helper.make_node("LeakyScale", ["x", "x"], ["a", "a_t"], domain=DOMAIN)],
                               "then", [], [_vi("a", [4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "else", [], [_vi("b", [4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Constant", [], ["zero"], value_float=0.0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = _model(nodes, [_vi("x", [4])], [_vi("y", [4])], [_leaky_scale()])
    for x in ([1.0, -2.0, 3.0, 0.5], [-1.0, -2.0, 3.0, -0.5]):
        _run(tmp_path, m, {"x": np.array(x, np.float32)})


def test_recursive_function_is_an_error(tmp_path):
    loop = helper.make_function(DOMAIN, "Loop1", ["x"], ["y"],
                                [helper.make_node("Loop1", ["x"], ["y"], domain=DOMAIN)],
                                [helper.make_opsetid(DOMAIN, 1)])
    m = _model([helper.make_node("Loop1", ["x"], ["y"], domain=DOMAIN)], [_vi("x", [2])],
               [_vi("y", [2])], [loop])
    path = tmp_path / "r.onnx"
    onnx.save(m, path)
    with pytest.raises(ValueError, match="deeper than 64"):
        pypto.onnx.load(str(path))


def test_torch_export_modules_as_functions(tmp_path):
    """torch.onnx.export(..., export_modules_as_functions=...) writes each module as a function
    (a function calling another: Block calls LayerNorm); the model matches eager PyTorch."""
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)

        def forward(self, x):
            return self.norm(torch.nn.functional.gelu(self.lin(x)) + x)

    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block()).eval()
    x = torch.randn(2, 5, 16)
    path = tmp_path / "blocks.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17,
                      export_modules_as_functions={Block, torch.nn.LayerNorm})
    assert {f.name for f in onnx.load(path).functions} == {"Block", "LayerNorm"}
    with torch.no_grad():
        want = model(x).numpy()
    for level in (0, 2):
        got = np.asarray(pypto.onnx.load(str(path), level=level)(x.numpy()))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
