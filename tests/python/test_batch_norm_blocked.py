"""A BatchNorm that cannot fold into the conv before it (it follows an activation: ConvMixer's
Conv -> GELU -> BN, Keras-style Conv -> ReLU -> BN; it starts a pre-activation block: DenseNet's
BN -> ReLU -> Conv on a Concat; or it is a branch of its own: MobileOne's identity BN summed with
the conv branches). At level 3 it runs on the blocked layout as a depthwise 1x1 ConvBlocked (which
takes the residual sum and the activation after it), so the convolutions around it stay blocked;
at levels 1 and 2 it keeps its own kernel. Results against PyTorch eager and onnxruntime, on 1 and
2 threads."""

import pytest
import torch
from onnx_levels import export_checked, levels


class MixerBlock(torch.nn.Module):
    """ConvMixer's block: x + BN(act(depthwise(x))), then BN(act(pointwise(.)))."""

    def __init__(self, channels, kernel, act):
        super().__init__()
        self.dw = torch.nn.Conv2d(channels, channels, kernel, groups=channels, padding="same")
        self.pw = torch.nn.Conv2d(channels, channels, 1)
        self.act = act
        self.n1 = torch.nn.BatchNorm2d(channels)
        self.n2 = torch.nn.BatchNorm2d(channels)
        torch.manual_seed(1)
        for n in (self.n1, self.n2):  # statistics far from the identity
            n.weight.data.uniform_(0.5, 1.5)
            n.bias.data.uniform_(-0.5, 0.5)
            n.running_mean.uniform_(-1, 1)
            n.running_var.uniform_(0.5, 2)

    def forward(self, x):
        x = x + self.n1(self.act(self.dw(x)))
        return self.n2(self.act(self.pw(x)))


class DenseLayer(torch.nn.Module):
    """DenseNet's layer: concat(x, conv(relu(bn(x)))) -> BN -> ReLU -> conv."""

    def __init__(self, channels, growth):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.n1 = torch.nn.BatchNorm2d(channels)
        self.c1 = torch.nn.Conv2d(channels, growth, 3, padding=1)
        self.n2 = torch.nn.BatchNorm2d(channels + growth)
        self.c2 = torch.nn.Conv2d(channels + growth, growth, 1)
        torch.manual_seed(2)
        for n in (self.n1, self.n2):
            n.running_mean.uniform_(-1, 1)
            n.running_var.uniform_(0.5, 2)

    def forward(self, x):
        x = self.stem(x)
        x = torch.cat([x, self.c1(torch.relu(self.n1(x)))], 1)
        return self.c2(torch.relu(self.n2(x)))


class MobileOneBlock(torch.nn.Module):
    """relu(conv3x3(x) + conv1x1(x) + BN(x)): the identity branch a BatchNorm of the input."""

    def __init__(self, channels):
        super().__init__()
        self.k3 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.k1 = torch.nn.Conv2d(channels, channels, 1)
        self.stem = torch.nn.Conv2d(channels, channels, 1)
        self.bn = torch.nn.BatchNorm2d(channels)
        torch.manual_seed(3)
        self.bn.weight.data.uniform_(0.5, 1.5)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        x = self.stem(x)
        return torch.relu(self.k3(x) + self.k1(x) + self.bn(x))


CASES = [("mixer_gelu", lambda: MixerBlock(48, 9, torch.nn.GELU()), 48),
         ("mixer_relu_padded", lambda: MixerBlock(60, 3, torch.nn.ReLU()), 60),
         ("dense", lambda: DenseLayer(32, 16), 3),
         ("mobileone", lambda: MobileOneBlock(32), 32)]


@pytest.mark.parametrize("name,make,channels", CASES, ids=[c[0] for c in CASES])
def test_unfolded_batch_norm_runs_blocked_at_level_3(tmp_path, name, make, channels):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(2, channels, 11, 9)
    path = str(tmp_path / f"{name}.onnx")
    want = export_checked(model, x, path)
    for level, _, ops in levels(path, x, want, ((1, 1), (2, 1), (3, 1), (3, 2))):
        if level < 3:
            assert "BatchNormalization" in ops, (level, ops)
        else:
            # No BatchNormalization left and no reorder between the convolutions: one into the
            # first blocked conv (none for the RGB stem), one out of the last.
            assert "BatchNormalization" not in ops, ops
            assert ops.count("ReorderToBlocked") <= 1 and ops.count("ReorderFromBlocked") == 1, ops
            assert ops.count("ConvBlocked") >= 2, ops
