"""A YOLOv8-style CNN exported to ONNX with dynamic batch, height and width (as detection models
are shipped): its stride-2 convs' output sizes are unknown ("?") to the compiler. Level 3 must
still run it on blocked kernels (AssignLayouts proves the sizes equal from the graph's
structure, docs/passes.md), level 2 picks the small-plane blocked kernel per run
(docs/backend/conv.md), and both must equal onnxruntime on the same file at several input
sizes, one compiled model for all of them, on 1 and 2 threads.
"""

import numpy as np
import pytest
import torch

import pypto

ort = pytest.importorskip("onnxruntime")


class ConvSilu(torch.nn.Module):
    def __init__(self, c1, c2, k=1, s=1):
        super().__init__()
        self.conv = torch.nn.Conv2d(c1, c2, k, s, k // 2)

    def forward(self, x):
        return torch.nn.functional.silu(self.conv(x))


class C2f(torch.nn.Module):
    """YOLOv8's C2f: 1x1 conv, split in two on channels, a residual bottleneck on the second
    half, concat of all three, 1x1 conv."""

    def __init__(self, c):
        super().__init__()
        self.cv1 = ConvSilu(c, c)
        self.m1 = ConvSilu(c // 2, c // 2, 3)
        self.m2 = ConvSilu(c // 2, c // 2, 3)
        self.cv2 = ConvSilu(3 * c // 2, c)

    def forward(self, x):
        # As ultralytics writes it: a Split with constant sizes (chunk() exports as Slices whose
        # ends are computed from the shape at run time).
        a, b = self.cv1(x).split((self.cv2.conv.in_channels // 3,) * 2, 1)
        return self.cv2(torch.cat([a, b, b + self.m2(self.m1(b))], 1))


class TinyYolo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = ConvSilu(3, 16, 3, 2)
        self.down1 = ConvSilu(16, 32, 3, 2)
        self.c2f1 = C2f(32)
        self.down2 = ConvSilu(32, 64, 3, 2)
        self.c2f2 = C2f(64)
        self.sppf_in = ConvSilu(64, 32)
        self.sppf_out = ConvSilu(128, 64)
        self.head = ConvSilu(96, 48, 3)
        self.pred = torch.nn.Conv2d(48, 20, 1)  # 20 outputs: not whole blocks

    def forward(self, x):
        p3 = self.c2f1(self.down1(self.stem(x)))
        y = self.c2f2(self.down2(p3))
        s = self.sppf_in(y)  # SPPF: three 5x5 stride-1 max pools
        m1 = torch.nn.functional.max_pool2d(s, 5, 1, 2)
        m2 = torch.nn.functional.max_pool2d(m1, 5, 1, 2)
        m3 = torch.nn.functional.max_pool2d(m2, 5, 1, 2)
        y = self.sppf_out(torch.cat([s, m1, m2, m3], 1))
        up = torch.nn.functional.interpolate(y, scale_factor=2.0, mode="nearest")
        return self.pred(self.head(torch.cat([up, p3], 1)))


SIZES = [(1, 64, 64), (2, 96, 80), (1, 40, 56)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = TinyYolo().eval()
    path = tmp_path_factory.mktemp("yolo") / "tiny_yolo.onnx"
    axes = {0: "batch", 2: "height", 3: "width"}
    torch.onnx.export(model, (torch.randn(1, 3, 64, 64),), str(path), input_names=["images"],
                      output_names=["y"], dynamic_axes={"images": axes, "y": axes}, dynamo=False)
    return str(path)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("level", [2, 3])
def test_dynamic_plane_cnn_matches_onnxruntime(exported, level, threads):
    saved = pypto.get_num_threads()
    pypto.set_num_threads(threads)
    try:
        exe = pypto.onnx.load(exported, level=level)
        sess = ort.InferenceSession(exported, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(1)
        for n, h, w in SIZES:
            x = rng.standard_normal((n, 3, h, w)).astype(np.float32)
            want = sess.run(None, {"images": x})[0]
            got = exe(images=x)
            err = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
            # Level 3 runs the stride-1 3x3 convs as Winograd F(4x4, 3x3): within 1e-4.
            assert err <= (1e-4 if level == 3 else 1e-5), (level, threads, (n, h, w), err)
    finally:
        pypto.set_num_threads(saved)
    assert all(b == "cpu" for _, b in exe._compiled.node_backends
               if _ not in ("Shape", "Gather", "Concat", "Cast", "Slice"))
    if level == 3 and pypto.device_info()["isa"] != "generic":
        ops = [op for op, _ in exe._compiled.node_backends]
        fired = {k: v for r in exe._compiled.pass_report if r["name"] == "AssignLayouts"
                 for k, v in r["fired"].items()}
        # Every conv blocked (the last one has 20 outputs, but its input is blocked already),
        # both Splits and the upsample kept blocked: reorders only at the end.
        assert ops.count("Conv") == 0, ops
        assert fired.get("AssignLayouts/Propagate/Split") == 2, fired
        assert fired.get("AssignLayouts/Propagate/Mul", 0) >= 13, fired
        assert fired.get("AssignLayouts/Propagate/Resize") == 1, fired  # the 2x upsample
        assert ops.count("ReorderToBlocked") == 0, ops  # the stem reads the image itself
