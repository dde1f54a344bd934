"""Tensors crossing the Python/C++ boundary: DLPack both ways, no copies, strides respected."""

import numpy as np
import pytest
import torch

from pypto import _C
from pypto.runtime import to_boundary

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_round_trip_shares_memory(dtype):
    x = (torch.arange(24) % 7).to(dtype).reshape(2, 3, 4)
    y = torch.from_dlpack(_C.roundtrip(x))
    assert y.data_ptr() == x.data_ptr()
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y, x)


def test_numpy_round_trip_shares_memory_even_read_only():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    a.flags.writeable = False
    b = np.from_dlpack(_C.roundtrip(a))
    assert b.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(a, b)


def test_non_contiguous_views_keep_their_strides():
    x = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    for view in (x.transpose(0, 2), x[:, ::2, 1:], x.expand(2, 3, 4, 5), x[1]):
        dtype, shape, strides, ptr = _C.tensor_info(view)
        assert (dtype, shape, strides) == ("f32", list(view.shape), list(view.stride()))
        assert ptr == view.data_ptr()
        assert torch.equal(torch.from_dlpack(_C.roundtrip(view)), view)


def test_executable_reads_non_contiguous_inputs_correctly():
    g = _C.Graph()
    x = g.add_input("x", "f32", [4, 3])
    w = g.add_initializer("w", torch.arange(6, dtype=torch.float32).reshape(3, 2))
    g.add_output(g.add_node("MatMul", [x, w], 1, {}, "mm", 21)[0])
    exe = _C.compile(g)
    base = torch.randn(3, 4)
    got = torch.from_dlpack(exe.run([base.t()])[0])  # a transposed view, not a copy
    torch.testing.assert_close(got, base.t() @ torch.arange(6.0).reshape(3, 2))


def test_outputs_are_not_copied_on_the_way_out():
    # Reshape of a contiguous input is a view in the executable: if neither direction copies,
    # the output torch sees is the caller's own memory.
    g = _C.Graph()
    x = g.add_input("x", "f32", [2, 6])
    shape = g.add_initializer("shape", torch.tensor([3, 4]))
    g.add_output(g.add_node("Reshape", [x, shape], 1, {}, "r", 21)[0])
    exe = _C.compile(g)
    xin = torch.randn(2, 6)
    out = torch.from_dlpack(exe.run([xin])[0])
    assert out.shape == (3, 4)
    assert out.data_ptr() == xin.data_ptr()


def test_initializers_share_memory_with_the_tensor_given():
    w = torch.randn(8, 8)
    g = _C.Graph()
    g.add_initializer("w", w)
    assert torch.from_dlpack(g.initializer("w")).data_ptr() == w.data_ptr()


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="expected a tensor or array"):
        _C.roundtrip([1, 2, 3])
    with pytest.raises(TypeError, match="unsupported element type"):
        _C.roundtrip(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"input 'x' is on meta"):
        to_boundary(torch.empty(2, device="meta"), "input 'x'")
    with pytest.raises(TypeError, match=r"input 'x' must be a torch.Tensor or numpy.ndarray"):
        to_boundary("not a tensor", "input 'x'")


def test_requires_grad_tensors_are_detached_not_copied():
    p = torch.nn.Parameter(torch.randn(4))
    b = to_boundary(p, "p")
    assert not b.requires_grad and b.data_ptr() == p.data_ptr()


def test_memory_is_kept_alive_by_the_other_side():
    x = torch.randn(1000)
    arr = _C.roundtrip(x)
    expect = x.clone()
    del x  # the capsule still holds the storage
    torch.testing.assert_close(torch.from_dlpack(arr), expect)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_graph_outputs_share_memory_in_every_dtype(dtype):
    # Outputs come back as numpy arrays (torch.from_numpy on the torch side) or, for bf16, through
    # DLPack; either way a view of the input stays the caller's memory, with the input's dtype.
    from pypto import dtypes
    from pypto.runtime import CompiledGraph

    g = _C.Graph()
    x = g.add_input("x", dtypes.name(dtype), [2, 6])
    shape = g.add_initializer("shape", torch.tensor([3, 4]))
    g.add_output(g.add_node("Reshape", [x, shape], 1, {}, "r", 21)[0])
    cg = CompiledGraph(g)
    xin = (torch.arange(12) % 5).to(dtype).reshape(2, 6)
    out = cg.run([xin])[0]
    assert type(out) is torch.Tensor and out.dtype == dtype
    assert out.data_ptr() == xin.data_ptr()
    assert torch.equal(out, xin.reshape(3, 4))
    if dtype != torch.bfloat16:
        arr = cg.run([xin.numpy()], like="numpy")[0]
        assert type(arr) is np.ndarray
        np.testing.assert_array_equal(arr, xin.numpy().reshape(3, 4))
