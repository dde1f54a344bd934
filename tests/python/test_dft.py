"""ONNX DFT and STFT on PyPTO's CPU kernel (a float32 FFT), not the reference interpreter:
against numpy.fft in float64 and onnxruntime, at FNet's and GFNet's shapes and the forms the
exporters write (opset 17's axis attribute, opset 20's axis input, onesided, inverse,
dft_length); and through pypto.optimize (python/pypto/frontend/aten_fft.py), FNet's fftn().real
and GFNet's irfft2(rfft2(x) * w) with every DFT node on the CPU kernel."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper, save

import pypto


def _run(tmp_path, x, attrs, opset, length=None, axis=None, op="DFT", extra=()):
    """(PyPTO's output, onnxruntime's output or None, backend of the node)."""
    path = str(tmp_path / "m.onnx")
    inits, names = [], ["x"]
    if op == "DFT":
        for name, v in (("len", length), ("axis", axis)):
            if v is None or (name == "axis" and opset < 20):
                names.append("")
            else:
                names.append(name)
                inits.append(numpy_helper.from_array(np.array(v, np.int64), name))
    else:
        for name, v in extra:
            names.append(name)
            if name:
                inits.append(numpy_helper.from_array(v, name))
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    exe = pypto.onnx.load(path)
    got = exe(x=x)
    backends = {b for o, b in exe._compiled.node_backends if o == op}
    try:
        want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    except Exception:  # a form onnxruntime does not implement: numpy is the reference
        want = None
    return got, want, backends


def _close(got, want, tol=1e-6):
    """Within tol of the reference's root-mean-square value: 1e-6 against numpy in float64 (a
    float32 FFT: ~log2(n) ulps); onnxruntime's own float32 DFT sums lengths that are not powers of
    two directly, 5e-4 of the value's scale from float64 at 768, so 2e-3 against it."""
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    rms = np.sqrt(np.mean(want ** 2)) if want.size else 0.0
    err = np.max(np.abs(got - want)) if want.size else 0.0
    assert err <= tol * max(rms, 1e-30), (err, rms)


_ORT = 2e-3


def _complex(a):
    return np.stack([a.real, a.imag], -1)


rng = np.random.default_rng(0)


@pytest.mark.parametrize("shape,axis", [((2, 768), 1), ((3, 128), 1), ((2, 1000), 1),
                                        ((4, 17), 1), ((2, 12, 5), 1), ((9, 4), 0)])
@pytest.mark.parametrize("opset", [17, 20])
def test_dft_of_real_and_complex_inputs(tmp_path, shape, axis, opset):
    x = rng.standard_normal(shape)
    z = x + 1j * rng.standard_normal(shape)
    attrs = {"axis": axis} if opset < 20 else {}
    for sig, ref in ((x[..., None], np.fft.fft(x, axis=axis)), (_complex(z), np.fft.fft(z, axis=axis))):
        got, want, backends = _run(tmp_path, sig.astype(np.float32), attrs, opset, axis=axis)
        assert backends == {"cpu"}
        _close(got, _complex(ref))
        if want is not None:
            _close(got, want, _ORT)


@pytest.mark.parametrize("n,length", [(768, None), (128, 100), (65, 200), (12, 13)])
def test_onesided_inverse_and_dft_length(tmp_path, n, length):
    x = rng.standard_normal((3, n))
    z = x + 1j * rng.standard_normal((3, n))
    # rfft (onesided forward of a real signal).
    got, want, backends = _run(tmp_path, x[..., None].astype(np.float32), {"onesided": 1}, 20,
                               length=length, axis=1)
    assert backends == {"cpu"}
    _close(got, _complex(np.fft.rfft(x, n=length, axis=1)))
    # ifft (ONNX's 1/n, as numpy's).
    got, want, _ = _run(tmp_path, _complex(z).astype(np.float32), {"inverse": 1}, 20,
                        length=length, axis=1)
    _close(got, _complex(np.fft.ifft(z, n=length, axis=1)))
    if want is not None:
        _close(got, want, _ORT)
    # irfft: bins of a real signal's spectrum in, the real signal out.
    got, _, _ = _run(tmp_path, _complex(z).astype(np.float32), {"inverse": 1, "onesided": 1}, 20,
                     length=length, axis=1)
    _close(got[..., 0], np.fft.irfft(z, n=length, axis=1))


def test_stft_matches_numpy(tmp_path):
    x = rng.standard_normal((2, 400)).astype(np.float32)
    window = np.hanning(64).astype(np.float32)
    step = 16
    got, want, backends = _run(tmp_path, x[..., None], {}, 17, op="STFT",
                               extra=(("step", np.array(step, np.int64)), ("window", window)))
    assert backends == {"cpu"}
    frames = np.stack([x[:, f * step:f * step + 64] * window for f in range(1 + (400 - 64) // step)],
                      1).astype(np.float64)
    _close(got, _complex(np.fft.rfft(frames, axis=-1)))
    if want is not None:
        _close(got, want, _ORT)


def _optimize_backends(fn, x):
    class M(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    fast = pypto.optimize(M(), (x,), dynamic=False)
    return fast(x), {b for o, b in fast.compiled.node_backends if o == "DFT"}


def test_fnet_and_gfnet_through_optimize():
    torch.manual_seed(0)
    x = torch.randn(2, 9, 768)
    got, backends = _optimize_backends(lambda x: torch.fft.fftn(x, dim=(1, 2)).real, x)
    assert backends == {"cpu"}
    want = np.fft.fftn(x.double().numpy(), axes=(1, 2)).real
    _close(np.asarray(got), want)
    w = torch.randn(14, 8, 2)
    y = torch.randn(3, 14, 14)
    got, backends = _optimize_backends(
        lambda x: torch.fft.irfft2(torch.fft.rfft2(x, norm="ortho") * torch.view_as_complex(w),
                                   s=(14, 14), norm="ortho"), y)
    assert backends == {"cpu"}
    want = np.fft.irfft2(np.fft.rfft2(y.double().numpy(), norm="ortho") *
                         (w[..., 0].double().numpy() + 1j * w[..., 1].double().numpy()),
                         s=(14, 14), norm="ortho")
    _close(np.asarray(got), want)
