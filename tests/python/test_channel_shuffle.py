"""Channel moves as one copy (FuseChannelMoves, level 1 and up): ShuffleNetV2's concat, channel
shuffle and chunk, and GhostNet's concat-then-slice, become GatherChannels nodes, through the ONNX
importer and through `pypto.optimize` (torch.export's permute/view/split forms); at level 3 the
shuffle stays on the blocked layout between the convolutions. Results against PyTorch eager and
onnxruntime, on 1 and 2 threads."""

import pytest
import torch
from onnx_levels import TOLERANCE, export_checked, levels, rel

import pypto


def channel_shuffle(x, groups):
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


class ShuffleUnits(torch.nn.Module):
    """A stem conv and torchvision ShuffleNetV2's units: a stride-2 unit (both branches
    convolved), then stride-1 units (half kept, half convolved), each ending in a shuffle."""

    def __init__(self, channels, units=3):
        super().__init__()
        half = channels // 2
        self.stem = torch.nn.Conv2d(3, channels, 3, padding=1)

        def branch(cin, stride):
            return torch.nn.Sequential(
                torch.nn.Conv2d(cin, half, 1), torch.nn.ReLU(),
                torch.nn.Conv2d(half, half, 3, stride, 1, groups=half),
                torch.nn.Conv2d(half, half, 1), torch.nn.ReLU())

        self.down1 = branch(channels, 2)
        self.down2 = branch(channels, 2)
        self.units = torch.nn.ModuleList(branch(half, 1) for _ in range(units))
        self.head = torch.nn.Conv2d(channels, 8, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = channel_shuffle(torch.cat([self.down1(x), self.down2(x)], 1), 2)
        for unit in self.units:
            a, b = x.chunk(2, dim=1)
            x = channel_shuffle(torch.cat([a, unit(b)], 1), 2)
        return self.head(x)


class GhostModule(torch.nn.Module):
    """GhostNet's module: a primary conv, a cheap depthwise conv on it, both concatenated and
    cut to an odd output channel count."""

    def __init__(self, cin, out):
        super().__init__()
        init = (out + 1) // 2
        self.primary = torch.nn.Conv2d(cin, init, 1)
        self.cheap = torch.nn.Conv2d(init, init, 3, padding=1, groups=init)
        self.out = out
        self.head = torch.nn.Conv2d(out, 4, 1)

    def forward(self, x):
        x1 = torch.relu(self.primary(x))
        x2 = torch.relu(self.cheap(x1))
        return self.head(torch.cat([x1, x2], 1)[:, :self.out])


CASES = [("shuffle_whole_blocks", lambda: ShuffleUnits(64), 3),
         ("shuffle_odd_halves", lambda: ShuffleUnits(48), 3),
         ("ghost", lambda: GhostModule(16, 27), 16)]
MOVES = ("Concat", "Slice", "Split", "Transpose")


@pytest.mark.parametrize("name,make,channels", CASES, ids=[c[0] for c in CASES])
def test_channel_moves_are_one_gather_onnx(tmp_path, name, make, channels):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(2, channels, 14, 12)
    path = str(tmp_path / f"{name}.onnx")
    want = export_checked(model, x, path)
    for level, _, ops in levels(path, x, want, ((0, 1), (1, 1), (2, 2), (3, 1), (3, 2))):
        if level == 0:
            assert "GatherChannels" not in ops, ops
            continue
        assert "GatherChannels" in ops, (level, ops)
        assert not [op for op in ops if op in MOVES], (level, ops)
        if level == 3 and name.startswith("shuffle"):
            # The shuffles read and write blocked values: no reorder between the convolutions
            # (the RGB stem reads the image as it is; one reorder out of the head).
            assert ops.count("ReorderToBlocked") == 0 and ops.count("ReorderFromBlocked") == 1, ops


@pytest.mark.parametrize("channels", [48, 64])
def test_channel_shuffle_through_optimize(channels):
    torch.manual_seed(0)
    model = ShuffleUnits(channels).eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        want = model(x).numpy()
    for level in (1, 3):
        m = pypto.optimize(model, (x,), level=level)
        assert rel(m(x).numpy(), want) < TOLERANCE, level
        ops = [op for op, _ in m._compiled.node_backends]
        assert ops.count("GatherChannels") >= 4, (level, ops)
        assert not [op for op in ops if op in MOVES], (level, ops)
