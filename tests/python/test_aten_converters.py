"""ATen converters added for real-world models (slice/select/index/scatter writes, var, log2,
atan2, padding modes, batch norm with batch statistics, diagonal), each compared with PyTorch eager
on random inputs: through pypto.optimize with a symbolic batch where the export keeps the op, and
through an FX graph traced with symbolic sizes (make_fx, no decompositions) for ops torch.export
decomposes. Ops PyPTO cannot compile give a NotImplementedError naming the op and why."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import pypto
from pypto.dynamo import PyptoPiece
from pypto.frontend import torch_capture


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _ops(ep) -> set:
    return {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}


def check(fn, make, op, batches=(2, 1, 5), dynamic=True, rtol=1e-5, atol=1e-6):
    """Optimizes Fn(fn) on make(3), checks the exported graph holds `op` (so the converter under
    test ran), that the batch stayed symbolic, and compares with eager for each batch size."""
    torch.manual_seed(0)
    model = Fn(fn).eval()
    ex = make(3)
    assert op in _ops(torch_capture.export(model, ex, dynamic=dynamic))
    fast = pypto.optimize(model, ex, dynamic=dynamic)
    if dynamic:
        assert fast.graph.type(fast.graph.inputs[0])[1][0] == "batch"
    for b in (batches if dynamic else (3,)):
        xs = make(b)
        torch.testing.assert_close(fast(*xs), model(*xs), rtol=rtol, atol=atol)


def check_fx(fn, make, op, sizes=(5, 9), rtol=1e-5, atol=1e-6):
    """The same through an FX graph of `fn` traced with symbolic sizes and no decompositions
    (every size symbolic: `sizes` must not coincide with the other sizes of the inputs)."""
    torch.manual_seed(0)
    gm = make_fx(fn, tracing_mode="symbolic")(*make(sizes[0]))
    assert op in _ops(gm)
    piece = PyptoPiece(gm, None)
    for n in sizes:
        xs = make(n)
        torch.testing.assert_close(piece(*xs), fn(*xs), rtol=rtol, atol=atol)


def randn(*shape):
    return lambda b: (torch.randn(b, *shape),)


# ---- slice_scatter / select_scatter / copy ----


def _ghost_concat(x, y):  # GhostNet-style: write into the first channels of a copy
    x = x.clone()
    x[:, :3] = y * 2
    return x


def _assign_tail(x, y):
    x = x.clone()
    x[:, -3:] = y
    return x


def _assign_middle_steps(x, y):
    x = x.clone()
    x[:, 1:7:2] = y  # step 2: ScatterElements
    x[:, :, 2:4] = 0
    return x


@pytest.mark.parametrize("fn,cols", [(_ghost_concat, 3), (_assign_tail, 3),
                                     (_assign_middle_steps, 3)])
def test_slice_assignment(fn, cols):
    check(fn, lambda b: (torch.randn(b, 8, 5), torch.randn(b, cols, 5)),
          "aten.slice_scatter.default")


def test_slice_scatter_with_a_symbolic_length():
    # The slice ends at a symbolic size: its bounds are computed in the graph.
    check_fx(lambda x, y: torch.slice_scatter(x, y, 0, 1, 1 + y.shape[0]),
             lambda n: (torch.randn(n + 2, 4), torch.randn(n, 4)), "aten.slice_scatter.default")


class SwinShift(torch.nn.Module):
    """Swin's shifted window: roll, add the attention-region mask built by slice assignment,
    roll back."""

    def __init__(self, h=8, w=8, win=4, shift=2):
        super().__init__()
        self.shift = shift
        self.h, self.w, self.win = h, w, win

    def forward(self, x):
        img = torch.zeros(1, self.h, self.w, 1)
        cnt = 0
        cuts = (slice(0, -self.win), slice(-self.win, -self.shift), slice(-self.shift, None))
        for hs in cuts:
            for ws in cuts:
                img[:, hs, ws, :] = cnt
                cnt += 1
        s = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        s = s + img
        return torch.roll(s, shifts=(self.shift, self.shift), dims=(1, 2))


def test_swin_window_shift_optimizes_and_matches_eager():
    model = SwinShift().eval()
    fast = pypto.optimize(model, (torch.randn(2, 8, 8, 3),))
    for b in (1, 2, 4):
        x = torch.randn(b, 8, 8, 3)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("index", [2, -1, 0])
def test_select_scatter(index):
    check_fx(lambda x, y: torch.select_scatter(x, y * 3, 1, index),
             lambda n: (torch.randn(n, 4, 3), torch.randn(n, 3)), "aten.select_scatter.default")


def test_copy_broadcasts_and_casts():
    check_fx(lambda x, y: torch.ops.aten.copy.default(x, y),
             lambda n: (torch.randn(n, 4), torch.randn(4, dtype=torch.float64)),
             "aten.copy.default")


# ---- index_put / scatter family ----


def _index_put(accumulate):
    def fn(x, v):
        return x.index_put((torch.tensor([0, 2, 0]),), v * 3, accumulate=accumulate)

    return fn


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    # Duplicate index 0: accumulate adds both; without, both write the same value.
    def make(b):
        v = torch.randn(3, 4)
        v[2] = v[0]
        return torch.randn(b + 3, 4), v

    check(_index_put(accumulate), make, "aten.index_put.default", batches=(3, 7))


def test_index_put_two_indices():
    def fn(x, v):
        return x.index_put((torch.tensor([0, 1, 1]), torch.tensor([2, 0, 3])), v, accumulate=True)

    check(fn, lambda b: (torch.randn(b + 2, 4, 5), torch.randn(3, 5)), "aten.index_put.default",
          batches=(3, 6))


@pytest.mark.parametrize("where", ["middle", "apart"])
def test_index_put_after_a_colon(where):
    # x[:, i, j] (B replaces dims 1, 2 in place) and x[i, :, j] (B goes first).
    def fn(x, v):
        i, j = torch.tensor([[0, 2], [1, 1]]), torch.tensor([1, 0])
        key = (slice(None), i, j) if where == "middle" else (i, slice(None), j)
        x = x.clone()
        x[key] += v
        return x

    shape_v = (5, 2, 2) if where == "middle" else (2, 2, 4)
    check(fn, lambda b: (torch.randn(b + 2, 4, 3) if where == "apart" else torch.randn(5, 3, 2),
                         torch.randn(*shape_v)), "aten.index_put.default", dynamic=False)


def test_index_put_with_a_boolean_mask():
    check(lambda x: x.index_put((x > 0.5,), torch.tensor(7.0)), randn(4, 5),
          "aten.index_put.default")


def _idx(b):
    return torch.randint(0, 6, (b, 4))


def test_scatter_src_value_add():
    def fn(x, i):
        return x.scatter(1, i, x[:, :4] * 2), x.scatter(1, i, -1.5), x.scatter_add(1, i, x[:, 2:6])

    for op in ("aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default"):
        check(fn, lambda b: (torch.randn(b, 6), torch.stack([torch.randperm(6)[:4]
                                                              for _ in range(b)])), op)


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    def fn(x, i, s):
        return x.scatter_reduce(1, i, s, reduce, include_self=include_self)

    check(fn, lambda b: (torch.randn(b, 6), _idx(b), torch.randn(b, 5)),
          "aten.scatter_reduce.two")


# ---- math ----


def test_var():
    check(lambda x: (x.var(1), torch.var(x, (0, 2), unbiased=False, keepdim=True),
                     torch.var(x, 2, correction=3)), randn(5, 7), "aten.var.correction")


@pytest.mark.parametrize("conv", [
    lambda: torch.nn.Conv2d(3, 5, (3, 2), stride=2, padding="valid"),  # SigLIP's patch embedding
    lambda: torch.nn.Conv2d(3, 4, 3, padding="same", dilation=2),
    lambda: torch.nn.Conv3d(3, 4, 2, padding="valid")])
def test_convolution_with_padding_by_name(conv):
    # F.conv2d(padding="valid") reaches aten.convolution with one padding value for every dim.
    torch.manual_seed(0)
    layer = conv().eval()
    shape = (3, 9, 8, 7)[:len(layer.kernel_size) + 1]
    check(lambda x: layer(x), randn(*shape), "aten.convolution.default", rtol=1e-5, atol=1e-5)


def test_max_min_of_a_whole_tensor():
    # torch.max(x) without a dim (torchvision's batched NMS offsets boxes by boxes.max()).
    check_fx(lambda x, i: (torch.max(x) * 2, torch.min(x), torch.max(i) + 1),
             lambda n: (torch.randn(n, 7), torch.randint(-50, 50, (3, n))), "aten.max.default")


def test_prims_convert_element_type():
    # What torch.compile hands over for casts in some decompositions (a detector's box head).
    cast = torch.ops.prims.convert_element_type.default
    check_fx(lambda x, i: (cast(i, torch.float32) * x, cast(x * 3, torch.int32)),
             lambda n: (torch.randn(n, 4), torch.randint(-9, 9, (n, 4))),
             "prims.convert_element_type.default")


def test_log2_log10():
    check(lambda x: (torch.log2(x.abs() + 0.1), torch.log10(x.abs() + 0.1)), randn(9),
          "aten.log2.default")


def test_atan2_in_every_quadrant():
    def make(b):
        y, x = torch.randn(b, 12), torch.randn(b, 12)
        y[:, :4], x[:, 4:8] = 0.0, 0.0  # on the axes, and at the origin where both are 0
        x[:, 2] = -1.0
        return y, x

    check(torch.atan2, make, "aten.atan2.default")


def test_diagonal():
    check(lambda x: (torch.diagonal(x, 1, 1, 2), torch.diagonal(x, -2, 2, 1)), randn(4, 6),
          "aten.diagonal.default")


# ---- padding modes and batch norm ----


@pytest.mark.parametrize("mode,shape,pad", [("reflect", (2, 9), (2, 3)),
                                            ("reflect", (2, 7, 6), (1, 2, 3, 0)),
                                            ("replicate", (2, 7, 6), (1, 2, 3, 0))])
def test_padding_modes(mode, shape, pad):
    op = f"aten.{'reflection' if mode == 'reflect' else 'replication'}_pad{len(pad) // 2}d.default"
    check_fx(lambda x: F.pad(x, pad, mode=mode), lambda n: (torch.randn(n, *shape),), op)


def test_batch_norm_with_batch_statistics():
    w, b = torch.randn(4), torch.randn(4)
    check(lambda x: F.batch_norm(x, None, None, w, b, training=True, eps=1e-3), randn(4, 3, 5),
          "aten._native_batch_norm_legit.no_stats", batches=(2, 5), rtol=1e-4, atol=1e-5)


def test_batch_norm_legit_outputs():
    # The saved mean and 1/std outputs too (what torch.compile's graphs read).
    check_fx(lambda x: torch.ops.aten._native_batch_norm_legit.no_stats(x, None, None, True, 0.1,
                                                                         1e-5),
             lambda n: (torch.randn(n, 4, 6),), "aten._native_batch_norm_legit.no_stats",
             rtol=1e-4, atol=1e-5)


def test_batch_norm_functional_updates_running_stats():
    def fn(x, rm, rv):
        return torch.ops.aten._native_batch_norm_legit_functional.default(
            x, None, None, rm, rv, True, 0.1, 1e-5)

    check_fx(fn, lambda n: (torch.randn(n, 4, 6), torch.randn(4), torch.rand(4) + 0.5),
             "aten._native_batch_norm_legit_functional.default", rtol=1e-4, atol=1e-5)


def test_train_mode_batch_norm_module_matches_eager():
    # The running-stat updates torch.export returns as extra outputs are dropped.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))  # training
    fast = pypto.optimize(model, (torch.randn(2, 3, 8, 8),))
    for b in (2, 5):
        x = torch.randn(b, 3, 8, 8)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)


# ---- ops PyPTO cannot compile: a clear error naming the op and why ----


@pytest.mark.parametrize("fn,op,why", [
    (lambda x: x * x.sum().item(), "_local_scalar_dense", r"\.item\(\)"),
    (lambda x: x + torch.randn(x.shape), "randn", "deterministic; pass the noise in"),
    (lambda x: F.dropout(x, 0.5, training=True), "native_dropout", r"model\.eval\(\)"),
])
def test_ops_that_cannot_be_compiled_are_named(fn, op, why):
    with pytest.raises(NotImplementedError, match=rf"aten\.{op}\.default\] node .*{why}"):
        pypto.optimize(Fn(fn), (torch.randn(3, 8),))


# ---- FFTs (FNet's fftn(x).real, GFNet's global filter): DFT nodes on [..., 2] tensors ----

_FILTER = torch.randn(8, 5, 2)


@pytest.mark.parametrize("fn,op", [
    (lambda x: torch.fft.fftn(x, dim=(1, 2)).real, "aten._fft_c2c.default"),  # FNet
    (lambda x: torch.fft.rfft(x).abs(), "aten._fft_r2c.default"),
    (lambda x: torch.view_as_real(torch.fft.rfft(x, norm="ortho")), "aten._fft_r2c.default"),
    (lambda x: torch.view_as_real(torch.fft.fft(x, dim=1, norm="forward")),
     "aten._fft_r2c.default"),  # a real input's full transform: r2c, onesided=False
    (lambda x: torch.view_as_real(torch.fft.ifft(torch.fft.fft(x) * 2)), "aten._fft_c2c.default"),
    (lambda x: torch.fft.irfft2(torch.fft.rfft2(x, norm="ortho") * torch.view_as_complex(_FILTER),
                                s=(8, 8), norm="ortho"), "aten._fft_c2r.default"),  # GFNet
    (lambda x: torch.fft.irfft(torch.fft.rfft(x) + torch.fft.rfft(x * 2), n=8),
     "aten._fft_c2r.default"),
    (lambda x: torch.view_as_real(torch.fft.fft(x) * torch.fft.fft(x.flip(-1))),
     "aten.mul.Tensor"),
    (lambda x: torch.fft.fft(x).imag - torch.fft.fft2(x).real, "aten._fft_c2c.default"),
])
def test_fft(fn, op):
    check(fn, randn(8, 8), op, rtol=1e-5, atol=1e-5)


# Complex values moved, selected, multiplied and summed as the real [..., 2] tensors they are
# held as (aten_fft.py): torch.stft's permute, a Fourier neural operator's modes (slices, bmm by a
# complex weight, zeros and slice_scatter), the Llama reference's rotary embedding.
_MODES = torch.randn(4, 4, 3, 2, dtype=torch.cfloat) * 0.3  # [in, out, modes x, modes y]
_FREQS = torch.polar(torch.ones(8, 4), torch.randn(8, 4))    # [positions, pairs]


class _SpectralConv(torch.nn.Module):
    """A Fourier neural operator's layer: the low modes of rfft2 mixed across channels."""

    def forward(self, x):
        f = torch.fft.rfft2(x)
        mixed = torch.einsum("bixy,ioxy->boxy", f[:, :, :3, :2], _MODES)
        spectrum = torch.zeros(x.shape[0], 4, x.shape[-2], x.shape[-1] // 2 + 1,
                               dtype=torch.cfloat)
        spectrum[:, :, :3, :2] = mixed
        return torch.fft.irfft2(spectrum, s=x.shape[-2:])


@pytest.mark.parametrize("fn,make,op", [
    (lambda x: torch.stft(x, n_fft=16, hop_length=4, window=torch.hann_window(16),
                          return_complex=True).abs().pow(2), randn(64), "aten.permute.default"),
    (_SpectralConv(), randn(4, 8, 8), "aten.slice_scatter.default"),
    (lambda x: torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], 4, 2)) * _FREQS)
     .flatten(-2), randn(8, 8), "aten.view_as_complex.default"),  # rotary embedding
    (lambda x: torch.view_as_real(torch.cat([torch.fft.fft(x), torch.fft.fft(x).conj()], dim=-1)),
     randn(8, 8), "aten.cat.default"),
    (lambda x: torch.view_as_real(torch.stack([torch.fft.fft(x)[:, 1], -torch.fft.fft(x)[:, 2]],
                                              dim=1)), randn(8, 8), "aten.select.int"),
    (lambda x: torch.view_as_real(torch.fft.rfft(x).unsqueeze(1).expand(-1, 3, -1, -1)
                                  .sum(dim=-1) / 4), randn(8, 8), "aten.expand.default"),
    (lambda x: torch.view_as_real(torch.fft.fft(x).mean(dim=1, keepdim=True).squeeze(1)),
     randn(8, 8), "aten.mean.dim"),
    (lambda x: torch.view_as_real(torch.fft.fft(x) @ torch.fft.fft(x).transpose(-2, -1)),
     randn(8, 8), "aten.bmm.default"),
])
def test_complex_values_move_multiply_and_sum(fn, make, op):
    check(fn, make, op, rtol=1e-4, atol=1e-4)


# Complex arithmetic and math (aten_complex.py): operands complex, real or Python scalars.
def _z(x):  # [..., 2k] -> k complex values
    return torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))


def _r(z):
    return torch.view_as_real(z).flatten(-2)


@pytest.mark.parametrize("fn,op", [
    (lambda x: _r(torch.exp(1j * x)), "aten.exp.default"),  # real * complex scalar
    (lambda x: _r(torch.exp(_z(x))), "aten.exp.default"),
    (lambda x: _r(torch.log(_z(x))), "aten.log.default"),
    (lambda x: _r(torch.sqrt(_z(x))), "aten.sqrt.default"),
    (lambda x: torch.angle(_z(x)) + torch.angle(x[..., :4]), "aten.angle.default"),
    (lambda x: _r(_z(x) / (_z(x).flip(-1) + 3)), "aten.div.Tensor"),  # complex + real scalar
    (lambda x: _r(_z(x) / (2 - 3j) - x[..., :4] * (1 + 1j)), "aten.div.Tensor"),
    (lambda x: _r((x[..., :4] + 1) / _z(x)), "aten.div.Tensor"),  # real / complex
    (lambda x: _r(torch.reciprocal(_z(x) * 1j + 0.5)), "aten.reciprocal.default"),
    (lambda x: _r(_z(x) ** 2 + _z(x) ** -3 + _z(x) ** 0.3), "aten.pow.Tensor_Scalar"),
    (lambda x: _r(torch.sgn(_z(x))), "aten.scalar_tensor.default"),  # sgn, decomposed
    (lambda x: _r(torch.fft.fftshift(torch.fft.fft(x), dim=-1).flip(1)[:, [2, 0]]),
     "aten.index_select.default"),
    (lambda x: _r(torch.complex(x[..., :4], x[:, :1, 4:])), "aten.complex.default"),
    (lambda x: _r(torch.polar(x[..., :4].abs(), x[..., 4:]) * _z(x)), "aten.polar.default"),
    (lambda x: _r(torch.where(x[..., :4] > 0, _z(x), 1j)), "aten.where.self"),
    (lambda x: _r(x[..., :4] - _z(x) + 2), "aten.sub.Tensor"),
    (lambda x: _r(torch.fft.rfft(x).to(torch.complex128)).float(), "aten._to_copy.default"),
])
def test_complex_math(fn, op):
    check(fn, randn(3, 8), op, rtol=1e-4, atol=1e-5)


def test_complex_math_at_special_points():
    """Zeros of both signs, tiny and huge parts (|z|^2 would underflow / overflow float32), the
    negative real axis, infinities: as torch's C99 complex functions, except where both parts
    are infinite."""
    vals = [0.0, -0.0, 1.0, -4.0, 1e-30, -1e-30, 3e30, float("inf"), float("-inf")]
    pairs = [(a, b) for a in vals for b in vals if not (math.isinf(a) and math.isinf(b))]
    x = torch.tensor(pairs).reshape(1, -1)
    fns = [lambda x: _r(torch.sqrt(_z(x))), lambda x: _r(torch.log(_z(x))),
           lambda x: _r(torch.exp(_z(x))), lambda x: _r(torch.reciprocal(_z(x))),
           lambda x: _r(_z(x) / _z(x).flip(-1)), lambda x: torch.angle(_z(x)),
           lambda x: _z(x).abs(), lambda x: torch.atan2(x[..., 1::2], x[..., ::2])]
    for fn in fns:
        got = pypto.optimize(Fn(fn).eval(), (x,), dynamic=False)(x)
        torch.testing.assert_close(got, fn(x), rtol=1e-5, atol=0, equal_nan=True)


@pytest.mark.parametrize("fn,why", [
    (lambda x: torch.view_as_real(torch.fft.fft(x).tanh()), r"aten\.tanh\.default\] node .*"
     r"complex tensors .* view_as_real"),
    (lambda x: torch.fft.fft(x), r"output 0 is a complex tensor.*view_as_real"),
])
def test_fft_forms_not_supported_are_named(fn, why):
    with pytest.raises(NotImplementedError, match=why):
        pypto.optimize(Fn(fn), (torch.randn(3, 8),))


# ---- sort, grid_sample, fold, masked_scatter ----


def test_sort():
    check(lambda x: (torch.sort(x, 1), torch.sort(x, dim=-1, descending=True, stable=True)),
          randn(6, 7), "aten.sort.default")


@pytest.mark.parametrize("mode,padding", [("bilinear", "zeros"), ("nearest", "border"),
                                          ("bilinear", "reflection"), ("bicubic", "border"),
                                          ("bicubic", "reflection")])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample(mode, padding, align_corners):
    def fn(x, grid):
        return F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align_corners)

    check(fn, lambda b: (torch.randn(b, 3, 5, 6), torch.rand(b, 4, 7, 2) * 6 - 3),
          "aten.grid_sampler_2d.default", rtol=1e-4, atol=1e-5)


def _fold(x):
    return F.fold(x, (7, 8), (3, 2), dilation=(1, 2), padding=(1, 0), stride=(2, 1))


def test_fold():
    check_fx(_fold, lambda n: (torch.randn(n, 3 * 6, 24),), "aten.col2im.default")


def test_fold_as_torch_export_decomposes_it():
    check(_fold, randn(3 * 6, 24), "aten.index_put.default")  # index_put with ':' dims first


def test_masked_scatter():
    def fn(x, mask, src):
        return x.masked_scatter(mask, src)

    check(fn, lambda b: (torch.randn(b, 4, 5), torch.rand(4, 5) > 0.4, torch.randn(b * 20 + 3)),
          "aten.masked_scatter.default", batches=(3,), dynamic=False)


def test_negative_padding_crops():
    check(lambda x: F.pad(x, (-1, 2, 0, -2)), randn(5, 6), "aten.constant_pad_nd.default")


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, float("inf")])
def test_cdist(p):
    check(lambda a, b: torch.cdist(a, b, p=p),
          lambda n: (torch.randn(n, 7, 5), torch.randn(n, 4, 5)), "aten._cdist_forward.default",
          rtol=1e-4, atol=1e-5)


class Bag(torch.nn.Module):
    def __init__(self, mode, last):
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(10, 4, mode=mode, include_last_offset=last)

    def forward(self, i, o, w=None):
        return self.bag(i, o, per_sample_weights=w)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("last", [False, True])
def test_embedding_bag(mode, last):
    torch.manual_seed(0)
    model = Bag(mode, last).eval()
    i, o = torch.randint(0, 10, (9,)), torch.tensor([0, 2, 2, 5] + ([9] if last else []))
    fast = pypto.optimize(model, (i, o), dynamic=False)
    for i, o in ((i, o), (torch.randint(0, 10, (9,)), torch.tensor([0, 0, 4, 9] + ([9] if last
                                                                                     else [])))):
        torch.testing.assert_close(fast(i, o), model(i, o))  # an empty bag in each
    if mode == "sum":
        w = torch.rand(9)
        fast = pypto.optimize(model, (i, o, w), dynamic=False)
        torch.testing.assert_close(fast(i, o, w), model(i, o, w), rtol=1e-5, atol=1e-6)


# ---- adaptive average pooling on sizes the output does not divide ----


@pytest.mark.parametrize("shape,size", [
    ((4, 2, 2), (7, 7)),      # VGG's pool on a small image: overlapping windows, output larger
    ((3, 10, 9), (4, 7)),     # windows of two lengths on both axes
    ((3, 12, 10), (4, 3)),    # one axis divides (AveragePool), the other does not
    ((3, 5, 7), (5, 2)),      # one axis unchanged
])
def test_adaptive_avg_pool2d_uneven(shape, size):
    check(lambda x: F.adaptive_avg_pool2d(x, size), randn(*shape), "aten._adaptive_avg_pool2d.default")


def test_adaptive_avg_pool2d_to_its_own_size():
    """A pool to the input's own size is the input (UperNet's pyramid pooling on a small image),
    read by the next op or returned."""
    check(lambda x: F.adaptive_avg_pool2d(x, (2, 3)) * 2, randn(4, 2, 3),
          "aten._adaptive_avg_pool2d.default")
    check(lambda x: F.adaptive_avg_pool2d(x, 3), randn(4, 3, 3), "aten._adaptive_avg_pool2d.default")


def test_adaptive_avg_pool1d_and_3d_uneven():
    check(lambda x: F.adaptive_avg_pool1d(x, 4), randn(3, 10),
          "aten._adaptive_avg_pool2d.default")  # export makes it 2-d
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)), randn(2, 4, 7, 9),
          "aten._adaptive_avg_pool3d.default")
    with pytest.raises(NotImplementedError, match="uneven window on a spatial axis before"):
        pypto.optimize(Fn(lambda x: F.adaptive_avg_pool3d(x, (3, 3, 4))), (torch.randn(1, 2, 4, 7, 8),))


@pytest.mark.parametrize("dim,size,step", [(1, 3, 2), (-1, 4, 4), (2, 2, 1), (3, 5, 3), (1, 4, 5)])
def test_unfold_windows(dim, size, step):
    check(lambda x: x.unfold(dim, size, step) * 2, randn(6, 7, 9), "aten.unfold.default")


# ---- repeat with more repeats than dims (new leading dims), XCiT's position encoding ----


@pytest.mark.parametrize("shape,repeats", [((4, 1), (1, 1, 3)), ((2, 3), (2, 1, 1, 2)),
                                           ((5,), (3, 2)), ((2, 3), (1, 2))])
def test_repeat_adds_leading_dims(shape, repeats):
    check(lambda x: x.repeat(*repeats) + 1, lambda b: (torch.randn(*shape),), "aten.repeat.default",
          dynamic=False)
    check(lambda x: x[0].repeat(*repeats), lambda b: (torch.randn(b, *shape),),
          "aten.repeat.default")


# ---- as_strided of a permuted tensor (Longformer's chunked attention under torch.compile) ----


@pytest.mark.parametrize("fn", [
    # Longformer's _chunk: overlapping windows of a transposed [batch*heads, seq, dim] tensor
    lambda x: x.transpose(1, 2).reshape(6, 16, 4).as_strided((6, 3, 8, 4), (64, 16, 4, 1)) * 2,
    lambda x: x.permute(2, 0, 1).as_strided((2, 4), (3, 7), 5) + 1,  # offset, odd strides
    lambda x: x.as_strided((3, 4), (1, 3)) - 1,  # a contiguous x, as before
])
def test_as_strided_of_a_permuted_view(fn):
    torch.manual_seed(0)
    x = torch.randn(6, 4, 16)
    gm = make_fx(fn)(x)
    assert "aten.as_strided.default" in _ops(gm)
    torch.testing.assert_close(PyptoPiece(gm, None)(x), fn(x), rtol=0, atol=0)


def test_as_strided_of_a_slice_is_named():
    def fn(x):
        return x[:, 1:].as_strided((2, 3), (3, 1), 0)  # a strided slice: not dense

    gm = make_fx(fn)(torch.randn(2, 4))
    with pytest.raises(NotImplementedError, match=r"strides \[4, 1\] over sizes \[2, 3\] \(not a permutation of a dense layout\)"):
        PyptoPiece(gm, None)(torch.randn(2, 4))


@pytest.mark.parametrize("fn,op", [
    (lambda a, b: a * b, "aten.mul.Tensor"),          # masks combined: a logical and
    (lambda a, b: a + b, "aten.add.Tensor"),          # a logical or
    (lambda a, b: torch.maximum(a, b), "aten.maximum.default"),
    (lambda a, b: torch.minimum(a, b), "aten.minimum.default")])
def test_arithmetic_on_bools_is_logic(fn, op):
    """torch's mul/add/maximum/minimum of two bool tensors (ONNX's Mul, Add, Max and Min take no
    bools: it was a NotImplementedError at run time, in BART's fp16 piece under torch.compile)."""
    check(lambda x, y: fn(x > 0, y < 0.5).float() + x,
          lambda b: (torch.randn(b, 6), torch.rand(b, 6)), op)
