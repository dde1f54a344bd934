"""torchvision's own ops through the PyTorch frontend (python/pypto/frontend/torchvision_ops.py)
against eager torchvision: roi_align as ONNX RoiAlign, in both of torchvision's alignments, and
under torch.compile. Found by bench/unseen_models.py: torch.compile(fasterrcnn, backend="pypto")
ran roi_align in PyTorch."""

import logging

import pytest
import torch

import pypto

torchvision = pytest.importorskip("torchvision")


class RoiHead(torch.nn.Module):
    """A conv, then roi_align of given boxes (rows of batch index, x1, y1, x2, y2) and a sum of
    the pooled features: the shape of a two-stage detector's box head."""

    def __init__(self, aligned: bool, sampling_ratio: int, scale: float):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 5, 3, padding=1)
        self.aligned, self.sampling_ratio, self.scale = aligned, sampling_ratio, scale

    def forward(self, x, rois):
        y = torchvision.ops.roi_align(self.conv(x), rois, (3, 4), spatial_scale=self.scale,
                                      sampling_ratio=self.sampling_ratio, aligned=self.aligned)
        return y * 2 + 1


def _rois(k: int, size: float, batch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(k)
    xy = torch.rand(k, 2, generator=g) * size * 0.7
    wh = torch.rand(k, 2, generator=g) * size * 0.5 + 0.2  # some boxes under a pixel
    index = torch.randint(0, batch, (k, 1), generator=g).float()
    return torch.cat([index, xy, xy + wh], dim=1)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_roi_align_matches_torchvision(aligned, sampling_ratio):
    torch.manual_seed(0)
    model = RoiHead(aligned, sampling_ratio, 0.5).eval()
    x, rois = torch.randn(2, 3, 13, 17), _rois(7, 30.0, 2)
    fast = pypto.optimize(model, example_inputs=(x, rois), dynamic=False)
    assert "RoiAlign" in [op for op, _ in fast.compiled.node_backends]
    with torch.no_grad():
        want = model(x, rois)
    torch.testing.assert_close(fast(x, rois), want, rtol=1e-5, atol=1e-5)


def test_torch_compile_runs_roi_align(caplog):
    """A box head with its rois assembled from an integer index, under torch.compile: the whole
    graph runs in PyPTO (no op left to PyTorch)."""
    torch.manual_seed(0)
    model = RoiHead(False, 2, 0.25).eval()

    def head(x, rois, index):
        rois = torch.cat([index.to(torch.float32)[:, None], rois], dim=1)
        return model(x, rois)

    x, rois = torch.randn(1, 3, 16, 16), _rois(5, 60.0, 1)
    index = rois[:, 0].to(torch.int64)
    with torch.no_grad():
        want = head(x, rois[:, 1:], index)
        with caplog.at_level(logging.WARNING, logger="pypto"):
            got = torch.compile(head, backend="pypto")(x, rois[:, 1:], index)
    assert "not supported yet" not in caplog.text, caplog.text
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
