"""onnxruntime's MatMulNBits (the weight-only 2/4/8-bit MatMul of int4 LLM exports) on PyPTO's
own kernel, against onnxruntime running the same node: accuracy_level 0 (float32 products) and 4
(A quantized to int8 per block, as onnxruntime does it), the weight kept in its blocks (released
as float32, held as 4-bit panels), written back as the same contrib op."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto

RNG = np.random.default_rng(7)


def _pack(codes, bits):
    """[rows, n] codes -> [rows, n * bits / 8] bytes, low bits first."""
    per = 8 // bits
    c = codes.reshape(codes.shape[0], -1, per).astype(np.uint16)
    out = np.zeros(c.shape[:2], np.uint16)
    for i in range(per):
        out |= c[..., i] << (bits * i)
    return out.astype(np.uint8)


def _model(k, n, bits=4, block=32, zp="u8", bias=True, acc=0):
    """One MatMulNBits node of random codes; returns the model and the float32 weight [K, N]."""
    blocks = (k + block - 1) // block
    codes = RNG.integers(0, 2 ** bits, (n, blocks * block))
    scales = (RNG.random((n, blocks)) * 0.02 + 0.001).astype(np.float32)
    inits = [numpy_helper.from_array(_pack(codes, bits).reshape(n, blocks, -1), "B"),
             numpy_helper.from_array(scales.reshape(-1), "S")]
    ins = ["a", "B", "S"]
    zeros = np.full((n, blocks), 2 ** (bits - 1), np.float32)
    if zp == "u8":
        z = RNG.integers(0, 2 ** bits, (n, blocks))
        per_row = (blocks * bits + 7) // 8 * 8 // bits
        padded = np.zeros((n, per_row), np.int64)
        padded[:, :blocks] = z
        inits.append(numpy_helper.from_array(_pack(padded, bits).reshape(-1), "Z"))
        zeros = z.astype(np.float32)
        ins.append("Z")
    elif zp == "f32":
        zeros = (RNG.random((n, blocks)) * 2 ** bits).astype(np.float32)
        inits.append(numpy_helper.from_array(zeros.reshape(-1), "Z"))
        ins.append("Z")
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "bias"))
        ins += [""] * (5 - len(ins)) + ["bias"]
    node = helper.make_node("MatMulNBits", ins, ["y"], domain="com.microsoft", K=k, N=n,
                            bits=bits, block_size=block, accuracy_level=acc)
    g = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("a", TensorProto.FLOAT,
                                                                          ["m", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    w = (codes[:, :k] - np.repeat(zeros, block, 1)[:, :k]) * np.repeat(scales, block, 1)[:, :k]
    return m, w.T.astype(np.float32)


def _ort(path, a):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(
        None, {"a": a})[0]


CASES = [  # m, k, n, bits, block, zero points, bias
    (1, 64, 16, 4, 32, "u8", True), (3, 100, 37, 4, 32, "u8", True),
    (1, 256, 64, 4, 128, None, False), (9, 96, 20, 4, 16, "u8", True),
    (70, 300, 70, 4, 64, None, True), (2, 100, 37, 8, 32, "u8", True),
    (5, 100, 37, 2, 32, None, True), (3, 100, 37, 4, 32, "f32", True),
    (40, 96, 20, 8, 16, "u8", False), (1, 256, 40, 8, 64, None, True),
    (3, 64, 24, 2, 16, "u8", False), (3, 200, 33, 8, 32, None, False)]


# accuracy_level 4 (A quantized to int8 where onnxruntime does it too) on every form.
LEVELS = [c + (0,) for c in CASES] + [c + (4,) for c in CASES]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n,bits,block,zp,bias,acc", LEVELS)
def test_matches_onnxruntime(tmp_path, m, k, n, bits, block, zp, bias, acc, threads):
    model, w = _model(k, n, bits, block, zp, bias, acc)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    a = RNG.standard_normal((m, k)).astype(np.float32)
    want = _ort(path, a)
    before = pypto.get_num_threads()
    pypto.set_num_threads(threads)
    try:
        exe = pypto.onnx.load(str(path))
        got = np.asarray(exe(a=a))
    finally:
        pypto.set_num_threads(before)
    assert exe._compiled.node_backends == [("MatMulNBits", "cpu")]
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * scale * np.sqrt(k))
    if acc == 0:  # and the float32 product itself, written out here
        exact = a.astype(np.float64) @ w.astype(np.float64)
        if bias:
            exact += numpy_helper.to_array(model.graph.initializer[-1])
        np.testing.assert_allclose(got, exact, rtol=0, atol=2e-6 * scale * np.sqrt(k))


def test_accuracy_level_4_quantizes_activations(tmp_path):
    """accuracy_level 4 has an effect where the int8 form runs: the result moves away from the
    float32 product by int8's rounding of A (and agrees with onnxruntime's, tested above)."""
    model, _ = _model(512, 48, acc=4)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    a = RNG.standard_normal((4, 512)).astype(np.float32)
    acc4 = np.asarray(pypto.onnx.load(str(path))(a=a))
    next(x for x in model.graph.node[0].attribute if x.name == "accuracy_level").i = 0
    onnx.save(model, path)
    acc0 = np.asarray(pypto.onnx.load(str(path))(a=a))
    info = pypto.device_info()
    if not info["extensions"]["avx512_vnni"] or info["isa"] != "avx512":
        np.testing.assert_array_equal(acc4, acc0)  # the float32 form: no int8 without VNNI
        return
    diff = np.abs(acc4 - acc0).max() / np.abs(acc0).max()
    assert 1e-5 < diff < 2e-2, diff


@pytest.mark.parametrize("bits", [4, 8])
def test_weight_held_in_its_bits(tmp_path, bits):
    """The float32 weight is never made: B is released and held as panels of the same size."""
    model, w = _model(1024, 256, bits=bits)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    exe = pypto.onnx.load(str(path))
    exe(a=np.ones((1, 1024), np.float32))
    stats = exe._compiled.stats()
    codes = 1024 * 256 * bits // 8
    assert stats["released_weight_bytes"] == codes
    # + a float scale and a byte of zero point per block of 32
    assert codes <= stats["packed_weight_bytes"] <= codes + 1024 * 256 // 32 * 5
    assert stats["packed_weight_bytes"] < w.nbytes * bits / 24


def test_written_back_as_the_contrib_op(tmp_path):
    model, _ = _model(100, 37, acc=4)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    exe = pypto.onnx.load(str(path))
    a = RNG.standard_normal((2, 100)).astype(np.float32)
    exe(a=a)
    out = tmp_path / "back.onnx"
    pypto.onnx.export(exe, None, out)
    back = onnx.load(out)
    assert [(nd.domain, nd.op_type) for nd in back.graph.node] == [("com.microsoft",
                                                                     "MatMulNBits")]
    np.testing.assert_allclose(_ort(out, a), _ort(path, a), rtol=0, atol=0)


def test_malformed_weight_is_a_clear_error(tmp_path):
    model, _ = _model(100, 37)
    b = model.graph.initializer[0]
    b.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(b)[:, :, :-1], "B"))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    with pytest.raises(ValueError, match=r"B must be uint8 \[N, blocks, blob\]"):
        pypto.onnx.load(str(path))(a=np.ones((1, 100), np.float32))


@pytest.mark.parametrize("acc", [0, 4])
def test_act_order_g_idx(tmp_path, acc):
    """A g_idx that scatters each block's block_size rows over K (GPTQ's act order) runs on the
    panels with K reordered, as onnxruntime computes it (in float32 at every level)."""
    k, n, block = 96, 20, 16
    codes = RNG.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
    scales = RNG.random(n * k // block).astype(np.float32) * 0.05
    g_idx = (np.argsort(RNG.permutation(k)) // block).astype(np.int32)
    inits = [numpy_helper.from_array(codes, "B"), numpy_helper.from_array(scales, "S"),
             numpy_helper.from_array(g_idx, "G")]
    node = helper.make_node("MatMulNBits", ["a", "B", "S", "", "G"], ["y"],
                            domain="com.microsoft", K=k, N=n, bits=4, block_size=block,
                            accuracy_level=acc)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT,
                                                                      ["m", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
                          inits)
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                  helper.make_opsetid("com.microsoft", 1)]),
              path)
    a = RNG.standard_normal((3, k)).astype(np.float32)
    exe = pypto.onnx.load(str(path))
    got = np.asarray(exe(a=a))
    want = _ort(path, a)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max() * np.sqrt(k))
    assert exe._compiled.stats()["released_weight_bytes"] == codes.nbytes
