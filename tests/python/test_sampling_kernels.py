"""ConvTranspose, ScatterElements/ScatterND, TopK and GridSample run on CPU kernels, not the
reference interpreter, through pypto.optimize, and match PyTorch eager: a DBNet/UNet-style decoder
(2x2 stride 2 and 4x4 stride 2 pad 1 transposed convolutions, grouped and 1-D ones), index_put /
scatter / scatter_reduce, topk (largest and smallest, ties), and grid_sample (every mode, padding
mode and align_corners)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pypto


def _backends(module) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for op, backend in module.compiled.node_backends:
        out.setdefault(op, set()).add(backend)
    return out


def _check(model, inputs, ops, rtol=1e-5, atol=1e-5):
    model.eval()
    with torch.no_grad():
        want = model(*inputs)
        fast = pypto.optimize(model, inputs, dynamic=False)
        got = fast(*inputs)
    backends = _backends(fast)
    for op in ops:
        assert backends.get(op) == {"cpu"}, f"{op}: {backends.get(op)} ({backends})"
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        g = torch.as_tensor(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
        else:
            assert torch.equal(g, w)


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up2 = torch.nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.up4 = torch.nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1, bias=False)
        self.grouped = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1,
                                                groups=2, dilation=1)
        self.one_d = torch.nn.ConvTranspose1d(6, 3, 3, stride=2, dilation=2)

    def forward(self, x):
        y = torch.relu(self.up2(x))
        y = self.grouped(self.up4(y))
        return self.one_d(y.flatten(2)[:, :, :50])


def test_conv_transpose_decoder():
    torch.manual_seed(0)
    _check(Decoder(), (torch.randn(2, 16, 7, 9),), ["ConvTranspose"], rtol=1e-4, atol=1e-4)


def test_conv_transpose_symbolic_batch():
    """One compiled module (W packed once) serves batches 1, 3 and 2."""
    torch.manual_seed(5)
    model = Decoder().eval()
    with torch.no_grad():
        fast = pypto.optimize(model, (torch.randn(2, 16, 7, 9),))
        for batch in (1, 3, 2):
            x = torch.randn(batch, 16, 7, 9)
            torch.testing.assert_close(torch.as_tensor(fast(x)), model(x), rtol=1e-4, atol=1e-4)
    assert {b for op, b in fast.compiled.node_backends if op == "ConvTranspose"} == {"cpu"}


class DecoderBlock(torch.nn.Module):
    """A DBNet-style FPN decoder step: ConvTranspose2d + BatchNorm2d + ReLU, twice."""

    def __init__(self, k, s, p, op=0, groups=1):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(8, 6, k, stride=s, padding=p, output_padding=op,
                                           groups=groups, bias=False)
        self.bn = torch.nn.BatchNorm2d(6)
        self.up2 = torch.nn.ConvTranspose2d(6, 4, 2, stride=2)
        self.bn2 = torch.nn.BatchNorm2d(4)
        for bn in (self.bn, self.bn2):  # running statistics that are not the identity
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        return torch.relu(self.bn2(self.up2(torch.relu(self.bn(self.up(x))))))


@pytest.mark.parametrize("k,s,p,op,groups", [
    (4, 2, 1, 0, 1), (2, 2, 0, 0, 1), (4, 2, 1, 1, 2), (3, 1, 1, 0, 1), (3, 2, 1, 1, 1),
    (6, 3, 2, 0, 1)])
def test_conv_transpose_batch_norm_relu_is_one_kernel(k, s, p, op, groups):
    """Each ConvTranspose + BN + ReLU becomes one kernel (BN folded into the weights, ReLU in the
    epilogue) on the sub-pixel (k a multiple of s), exact-tiling (k == s) and col2im forms."""
    torch.manual_seed(5)
    model = DecoderBlock(k, s, p, op, groups).eval()
    x = torch.randn(2, 8, 7, 9)
    _check(model, (x,), ["ConvTranspose"], rtol=1e-4, atol=1e-4)
    fast = pypto.optimize(model, (x,), dynamic=False)
    rules = [step["rule"] or step["op"] for step in fast.compiled.steps]
    assert rules == ["ConvTranspose+Relu", "ConvTranspose+Relu"], rules


def test_scatter_elements_and_scatter_nd():
    torch.manual_seed(1)
    x = torch.randn(6, 10)
    idx = torch.randint(0, 10, (6, 4))
    src = torch.randn(6, 4 + 6)[:, :4].contiguous()
    rows = torch.tensor([4, 0, 2])
    src_rows = torch.randn(6, 10)

    class M(torch.nn.Module):
        def forward(self, x, idx, rows, src, src_rows):
            a = x.scatter(1, idx, src)
            b = x.scatter_add(1, idx, src)
            c = x.scatter_reduce(1, idx, src, reduce="amax")
            d = x.clone()
            d[rows] = src_rows[: rows.shape[0]]
            return a, b, c, d

    # scatter with duplicate indices keeps an unspecified write in torch: use unique ones there.
    idx = torch.stack([torch.randperm(10)[:4] for _ in range(6)])
    _check(M(), (x, idx, rows, src, src_rows), ["ScatterElements", "ScatterND"])


class TopK(torch.nn.Module):
    def forward(self, x):
        v1, i1 = torch.topk(x, 3, dim=-1)
        v2, i2 = torch.topk(x, 2, dim=0, largest=False)
        return v1, i1, v2, i2


def test_topk():
    torch.manual_seed(2)
    x = torch.randn(5, 40)
    _check(TopK(), (x,), ["TopK"], rtol=0, atol=0)


@pytest.mark.parametrize("mode,padding_mode", [
    (m, p) for m in ("bilinear", "nearest", "bicubic") for p in ("zeros", "border", "reflection")])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample(mode, padding_mode, align_corners):
    torch.manual_seed(3)

    class M(torch.nn.Module):
        def forward(self, x, grid):
            return F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode,
                                 align_corners=align_corners)

    x = torch.randn(2, 3, 9, 11)
    grid = torch.rand(2, 5, 7, 2) * 2.4 - 1.2
    _check(M(), (x, grid), ["GridSample"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,padding_mode", [
    (m, p) for m in ("bilinear", "nearest") for p in ("zeros", "border")])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_fast_path(mode, padding_mode, align_corners):
    """The vectorized 2-D path: output widths that are not a multiple of the vector width, more
    points than one block, grid points far outside and exactly on the edges, and infinite input
    values (zero-padding taps must not turn them into NaN). Non-finite coordinates and infinite
    inputs with border padding, where torch and ONNX differ, are checked against the reference
    in tests/cpp/cpu_topk_grid_sample_test.cpp."""
    torch.manual_seed(6)

    class M(torch.nn.Module):
        def forward(self, x, grid):
            return F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode,
                                 align_corners=align_corners)

    x = torch.randn(2, 5, 13, 17)
    if padding_mode == "zeros":  # border reads an edge pixel with weight 0 (ONNX: NaN, torch: not)
        x[0, 1, 0, 0] = float("inf")
        x[1, 2, 12, 16] = float("-inf")
    grid = torch.rand(2, 19, 23, 2) * 3.0 - 1.5
    grid[0, 0, :4] = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [1e30, 0.5], [-1.0, 1.0]])
    model = M().eval()
    with torch.no_grad():
        want = model(x, grid)
        fast = pypto.optimize(model, (x, grid), dynamic=False)
        got = torch.as_tensor(fast(x, grid))
    assert {b for op, b in fast.compiled.node_backends if op == "GridSample"} == {"cpu"}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_fold_runs_on_the_scatter_kernels():
    """torch.export decomposes F.fold into index_put with accumulate (ScatterND, reduction add)."""
    torch.manual_seed(4)

    class M(torch.nn.Module):
        def forward(self, x):
            return F.fold(x, (7, 8), (3, 2), dilation=(1, 2), padding=(1, 0), stride=(2, 1))

    _check(M(), (torch.randn(2, 3 * 6, 24),), ["ScatterND"])
