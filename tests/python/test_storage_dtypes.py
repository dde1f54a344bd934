"""Storage dtypes from Python: float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0), float4 E2M1 and
4- and 2-bit integers in ONNX models, through Cast, QuantizeLinear and DequantizeLinear.

The references are independent of PyPTO: ml_dtypes' conversions (the ones the onnx package and its
test data use) and onnx.reference.ReferenceEvaluator.
"""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import pypto

FLOAT8 = {
    TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
    TensorProto.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    TensorProto.FLOAT8E5M2: ml_dtypes.float8_e5m2,
    TensorProto.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
    TensorProto.FLOAT4E2M1: ml_dtypes.float4_e2m1fn,
}


def save(path, nodes, inputs, outputs, inits=(), opset=21):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    path.write_bytes(m.SerializeToString())
    return path, m


def vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


def probe_values(np_type):
    """Every value of the format, the midpoints between neighbours (ties), points just off them,
    values past the range, zeros, infinities and NaN, as float32."""
    nbits = 4 if np_type == ml_dtypes.float4_e2m1fn else 8
    vals = np.arange(2 ** nbits, dtype=np.uint8).view(np_type).astype(np.float32)
    fin = np.unique(vals[np.isfinite(vals)])
    mid = (fin[:-1].astype(np.float64) + fin[1:]) / 2
    off = np.concatenate([mid * (1 + 2.0 ** -20), mid * (1 - 2.0 ** -20)])
    big = np.array([fin.max() * k for k in (1.03, 1.1, 1.5, 4, 1e6)])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30])
    return np.concatenate([vals, mid, off, big, -big, special]).astype(np.float32)


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("to", list(FLOAT8), ids=lambda t: TensorProto.DataType.Name(t))
def test_cast_to_small_floats_rounds_like_ml_dtypes(tmp_path, to, saturate):
    np_type = FLOAT8[to]
    x = probe_values(np_type)
    path, _ = save(tmp_path / "cast.onnx",
                   [helper.make_node("Cast", ["x"], ["q"], to=to, saturate=saturate),
                    helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)],
                   [vi("x", TensorProto.FLOAT, [len(x)])], [vi("y", TensorProto.FLOAT, [len(x)])])
    got = pypto.onnx.load(path)(x=x)
    if saturate and to != TensorProto.FLOAT4E2M1:  # onnx.numpy_helper.saturate_cast
        info = ml_dtypes.finfo(np_type)
        src = np.clip(x, float(info.min), float(info.max))
    else:
        src = x
    want = src.astype(np_type).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok])
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))  # -0 where it exists


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_to_e8m0_matches_onnx_reference(tmp_path, round_mode, saturate):
    rng = np.random.default_rng(3)
    x = np.concatenate([np.ldexp(1.0, np.arange(-130, 128)),  # exact powers, down to subnormals
                        rng.uniform(0.5, 2.0, 64) * np.ldexp(1.0, rng.integers(-126, 127, 64)),
                        [1.5, 1.25, 3.0, 0.0, -4.0, np.inf, np.nan, 3.3e38]]).astype(np.float32)
    path, model = save(
        tmp_path / "e8m0.onnx",
        [helper.make_node("Cast", ["x"], ["q"], to=TensorProto.FLOAT8E8M0, saturate=saturate,
                          round_mode=round_mode),
         helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)],
        [vi("x", TensorProto.FLOAT, [len(x)])], [vi("y", TensorProto.FLOAT, [len(x)])],
        opset=24)
    got = pypto.onnx.load(path)(x=x)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)  # NaN compares equal to NaN here


SMALL_INTS = [TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2]


@pytest.mark.parametrize("qtype", SMALL_INTS, ids=lambda t: TensorProto.DataType.Name(t))
def test_blocked_quantize_dequantize_of_small_ints_matches_onnx_reference(tmp_path, qtype):
    rng = np.random.default_rng(5)
    x = rng.uniform(-3, 3, (4, 6)).astype(np.float32)
    scale = rng.uniform(0.2, 0.6, (4, 3)).astype(np.float32)
    lo, hi = {TensorProto.INT4: (-8, 7), TensorProto.UINT4: (0, 15),
              TensorProto.INT2: (-2, 1), TensorProto.UINT2: (0, 3)}[qtype]
    zp_vals = rng.integers(lo, hi + 1, (4, 3))
    zp = helper.make_tensor("zp", qtype, [4, 3], zp_vals.ravel().tolist())
    s = numpy_helper.from_array(scale, "s")
    path, model = save(
        tmp_path / "qdq.onnx",
        [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=1, block_size=2),
         helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], axis=1, block_size=2)],
        [vi("x", TensorProto.FLOAT, [4, 6])], [vi("y", TensorProto.FLOAT, [4, 6])], [s, zp])
    got = pypto.onnx.load(path)(x=x)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)
    # The quantized values themselves, through a Cast to int8.
    path8, model8 = save(
        tmp_path / "q8.onnx",
        [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=1, block_size=2),
         helper.make_node("Cast", ["q"], ["y"], to=TensorProto.INT8)],
        [vi("x", TensorProto.FLOAT, [4, 6])], [vi("y", TensorProto.INT8, [4, 6])], [s, zp])
    got8 = pypto.onnx.load(path8)(x=x)
    (want8,) = ReferenceEvaluator(model8).run(None, {"x": x})
    np.testing.assert_array_equal(got8, want8)
    assert got8.min() >= lo and got8.max() <= hi


def test_int4_weight_dequantize_matmul(tmp_path):
    """What 4-bit weight-only quantizers write: a packed INT4 initializer with blocked scales,
    DequantizeLinear, MatMul."""
    rng = np.random.default_rng(7)
    w4 = rng.integers(-8, 8, (64, 24))
    scale = rng.uniform(0.01, 0.05, (2, 24)).astype(np.float32)  # blocks of 32 rows
    w = helper.make_tensor("w4", TensorProto.INT4, [64, 24], w4.ravel().tolist())
    assert len(w.raw_data or w.int32_data) == 64 * 24 // 2  # two per byte in the file
    path, model = save(
        tmp_path / "int4_mm.onnx",
        [helper.make_node("DequantizeLinear", ["w4", "s"], ["w"], axis=0, block_size=32),
         helper.make_node("MatMul", ["x", "w"], ["y"])],
        [vi("x", TensorProto.FLOAT, [3, 64])], [vi("y", TensorProto.FLOAT, [3, 24])],
        [w, numpy_helper.from_array(scale, "s")])
    x = rng.standard_normal((3, 64)).astype(np.float32)
    got = pypto.onnx.load(path)(x=x)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # And independently of onnx: the weight unpacked by hand.
    ref = x.astype(np.float64) @ (w4 * np.repeat(scale, 32, axis=0)).astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_float8_output_is_not_exported_to_python(tmp_path):
    path, _ = save(tmp_path / "f8_out.onnx",
                   [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN)],
                   [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT8E4M3FN, [4])])
    exe = pypto.onnx.load(path)
    with pytest.raises(TypeError, match="f8e4m3fn"):
        exe(x=np.ones(4, np.float32))


@pytest.mark.parametrize("qtype", [TensorProto.FLOAT8E5M2, TensorProto.INT4],
                         ids=lambda t: TensorProto.DataType.Name(t))
def test_movement_ops_carry_storage_dtypes(tmp_path, qtype):
    """Transpose, Reshape, Slice, Concat and Gather move the bytes of storage dtypes (on the CPU
    kernels that copy by element size) between Casts."""
    rng = np.random.default_rng(11)
    x = rng.uniform(-7, 7, (2, 3, 4)).astype(np.float32)
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [4, 6])
    starts = helper.make_tensor("starts", TensorProto.INT64, [1], [1])
    ends = helper.make_tensor("ends", TensorProto.INT64, [1], [5])
    idx = helper.make_tensor("idx", TensorProto.INT64, [3], [2, 0, 2])
    path, _ = save(
        tmp_path / "move.onnx",
        [helper.make_node("Cast", ["x"], ["q"], to=qtype),
         helper.make_node("Transpose", ["q"], ["t"], perm=[2, 0, 1]),
         helper.make_node("Reshape", ["t", "shape"], ["r"]),
         helper.make_node("Slice", ["r", "starts", "ends"], ["s"]),
         helper.make_node("Concat", ["s", "r"], ["c"], axis=0),
         helper.make_node("Gather", ["c", "idx"], ["g"], axis=1),
         helper.make_node("Cast", ["g"], ["y"], to=TensorProto.FLOAT)],
        [vi("x", TensorProto.FLOAT, [2, 3, 4])], [vi("y", TensorProto.FLOAT, [7, 3])],
        [shape, starts, ends, idx])
    np_type = ml_dtypes.float8_e5m2 if qtype == TensorProto.FLOAT8E5M2 else ml_dtypes.int4
    q = np.clip(x, -57344, 57344).astype(np_type) if qtype == TensorProto.FLOAT8E5M2 \
        else np.trunc(x).astype(np.int8)  # |x| < 7: in range, truncated toward zero
    r = q.transpose(2, 0, 1).reshape(4, 6)
    want = np.concatenate([r[1:5], r])[:, [2, 0, 2]].astype(np.float32)
    for level in (0, 2, 3):
        got = pypto.onnx.load(path, level=level)(x=x)
        np.testing.assert_array_equal(got, want)
