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
