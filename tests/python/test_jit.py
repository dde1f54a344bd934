"""@pypto.jit: functions over tensors compiled once per input signature."""

import numpy as np
import pytest
import torch

import pypto


@pypto.jit
def lj_potential(r):  # exactly as API.md spells it
    s6 = (3.4 / r) ** 6
    return 4 * 0.1 * (s6 * s6 - s6)


def lj_eager(r):
    s6 = (3.4 / r) ** 6
    return 4 * 0.1 * (s6 * s6 - s6)


def test_lennard_jones_example_from_api_md():
    torch.manual_seed(0)
    r = torch.rand(1 << 20) + 1.0
    e = lj_potential(r)
    want = lj_eager(r)
    assert e.shape == r.shape and e.dtype == torch.float32
    assert ((e - want).abs().max() / want.abs().max()).item() <= 1e-6


def test_compiled_once_per_shape_and_dtype():
    @pypto.jit
    def f(x, y):
        return torch.tanh(x) * y + 1

    x, y = torch.randn(4, 5), torch.randn(4, 5)
    torch.testing.assert_close(f(x, y), torch.tanh(x) * y + 1)
    f(torch.randn(4, 5), torch.randn(4, 5))
    assert f.cache_size == 1
    f(torch.randn(7), torch.randn(7))
    assert f.cache_size == 2
    xd = torch.randn(4, 5, dtype=torch.float64)
    torch.testing.assert_close(f(xd, xd), torch.tanh(xd) * xd + 1)
    assert f.cache_size == 3


def test_numpy_in_numpy_out_and_non_contiguous_views():
    @pypto.jit
    def g(x):
        return x.exp() - x

    a = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    got = g(a)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, np.exp(a) - a, rtol=1e-6)
    t = torch.from_numpy(a).t()  # a transposed view: read through its strides
    torch.testing.assert_close(g(t), t.exp() - t)


def test_structured_outputs_and_options():
    @pypto.jit(level=0)
    def stats(x):
        return {"mean": x.mean(dim=-1), "max": x.amax(dim=-1)}

    x = torch.randn(3, 10)
    out = stats(x)
    torch.testing.assert_close(out["mean"], x.mean(dim=-1))
    torch.testing.assert_close(out["max"], x.amax(dim=-1))


def test_bad_uses():
    with pytest.raises(TypeError, match="decorates a function"):
        pypto.jit(42)

    @pypto.jit
    def h(x):
        return x + 1

    with pytest.raises(TypeError, match="arguments must be tensors, numpy arrays or Python "
                                        "scalars, got object"):
        h(object())
    with pytest.raises(ValueError, match=r"could not capture @pypto.jit function h"):
        h([1.0, 2.0])  # a list is not a tensor: list + 1 fails while capturing

    @pypto.jit
    def uses_i0(x):
        return torch.special.i0(x)

    with pytest.raises(NotImplementedError, match=r"@pypto.jit function uses_i0 uses op\(s\) PyPTO "
                                                  r"cannot run yet: "
                                                  r"aten\.i0\.default"):
        uses_i0(torch.randn(3))


def gelu_bias(x, b):
    return 0.5 * (x + b) * (1 + torch.erf((x + b) * 0.70710678))


def test_pinned_tile_gives_eager_results_with_tails():
    torch.manual_seed(1)
    x, b = torch.randn(37, 1000), torch.randn(1000)
    want = gelu_bias(x, b)
    auto = pypto.jit(gelu_bias)
    torch.testing.assert_close(auto(x, b), want, rtol=1e-5, atol=1e-6)
    assert "plan: tiles" in auto.describe_tiles() and "(pinned)" not in auto.describe_tiles()
    for tile in [(5, 96), (1, 33), (3, 7), 100, (40, 16)]:
        f = pypto.jit(gelu_bias, tile=tile)
        torch.testing.assert_close(f(x, b), want, rtol=1e-5, atol=1e-6)
        shape = tile if isinstance(tile, tuple) else (1, tile)
        assert f"of {shape[0]}x{shape[1]} (pinned)" in f.describe_tiles(), f.describe_tiles()
    # By kernel name: the group's output (its name is in the dump).
    f = pypto.jit(gelu_bias, tile={"*": (2, 64)})
    torch.testing.assert_close(f(x, b), want, rtol=1e-5, atol=1e-6)


def test_bad_tile_is_a_clear_error():
    with pytest.raises(ValueError, match=r"positive sizes, got \(0, 16\)"):
        pypto.jit(gelu_bias, tile=(0, 16))
    with pytest.raises(ValueError, match=r"\(rows, cols\) or \(cols,\)"):
        pypto.jit(gelu_bias, tile=(1, 2, 3))
    with pytest.raises(TypeError, match=r"must be \(rows, cols\)"):
        pypto.jit(gelu_bias, tile="8x8")
    f = pypto.jit(gelu_bias, tile=(256, 256))  # fits no L1: said at the first call
    with pytest.raises(ValueError, match=r"pinned tile 256x256 does not fit L1: register r0 "
                                         r"\(262144 bytes\) .* bytes available"):
        f(torch.randn(4, 8), torch.randn(8))
    g = pypto.jit(gelu_bias, tile={"no_such_kernel": (1, 64)})
    with pytest.raises(ValueError, match=r"'no_such_kernel': no tile kernel"):
        g(torch.randn(4, 8), torch.randn(8))

    @pypto.jit(tile=(2, 16))
    def softmax(x):
        return torch.softmax(x * 2.0, -1)

    with pytest.raises(ValueError, match=r"whole rows \(cols >= 50\)"):
        softmax(torch.randn(4, 50))
