"""The models PyPTO is tested and demonstrated on, built in code and exported to ONNX once.

Every model is built with random weights from seed 0 (never downloaded), exported with
torch.onnx's default (torch.export-based) exporter, checked against PyTorch with onnxruntime, and
cached outside the clone:

    ${PTO_CACHE:-~/.cache/pypto}/models/<recipe>-torch-<torch version>/<name>.onnx

A cache hit imports neither torch nor transformers. A new torch version, or a change to a recipe
below (bump RECIPE), exports again.

    python tests/python/export_models.py [NAME ...]        # export (or find) and print the paths

Why this exporter: the legacy TorchScript exporter (dynamo=False) cannot export GPT-2 with
transformers 5 (aten::diff in the mask code, DynamicCache outputs); the default exporter handles
all four models and gives cleaner graphs (BatchNorm folded, Gelu kept as one op). It needs the
onnxscript package, which scripts/setup.sh installs.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

import numpy as np

# Bump when a recipe changes (model, inputs, wrapper, export options): old caches are then ignored.
RECIPE = "v1"
SEED = 0
SEQ = 128  # sequence length of the language models


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name
    high: int = 0  # integer inputs: values in [0, high)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    about: str
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...]
    build: Callable[[], object]  # returns a torch.nn.Module in eval mode


def _torchvision(name: str):
    def build():
        import torch
        import torchvision

        torch.manual_seed(SEED)
        return getattr(torchvision.models, name)(weights=None).eval()

    return build


def _bert():
    import torch
    import transformers

    class Bert(torch.nn.Module):  # tensors in, tensors out, named like BertModel's outputs
        def __init__(self):
            super().__init__()
            self.m = transformers.BertModel(transformers.BertConfig())

        def forward(self, input_ids, attention_mask):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask)
            return o.last_hidden_state, o.pooler_output

    torch.manual_seed(SEED)
    return Bert().eval()


def _gpt2():
    import torch
    import transformers

    class GPT2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = transformers.GPT2LMHeadModel(transformers.GPT2Config())

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False).logits

    torch.manual_seed(SEED)
    return GPT2().eval()


_IMAGE = (InputSpec("input", (1, 3, 224, 224), "float32"),)
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("resnet18", "torchvision ResNet-18, 1x3x224x224", _IMAGE, ("logits",),
                  _torchvision("resnet18")),
        ModelSpec("mobilenet_v2", "torchvision MobileNetV2, 1x3x224x224", _IMAGE, ("logits",),
                  _torchvision("mobilenet_v2")),
        ModelSpec("bert", f"transformers BERT-base (BertModel), batch 1, sequence {SEQ}",
                  (InputSpec("input_ids", (1, SEQ), "int64", high=30522),
                   InputSpec("attention_mask", (1, SEQ), "int64")),
                  ("last_hidden_state", "pooler_output"), _bert),
        ModelSpec("gpt2", f"transformers GPT-2 small (GPT2LMHeadModel), batch 1, sequence {SEQ}",
                  (InputSpec("input_ids", (1, SEQ), "int64", high=50257),), ("logits",), _gpt2),
    )
}


def cache_root() -> Path:
    root = os.environ.get("PTO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "pypto")
    return Path(root) / "models"


def model_path(name: str) -> Path:
    return cache_root() / f"{RECIPE}-torch-{metadata.version('torch')}" / f"{name}.onnx"


def make_inputs(name: str) -> dict[str, np.ndarray]:
    """The inputs every engine gets for `name`: fixed by the seed, the same on every call."""
    rng = np.random.default_rng(SEED)
    out = {}
    for spec in MODELS[name].inputs:
        if spec.name == "attention_mask":  # a padded batch: the last quarter is masked out
            a = np.ones(spec.shape, dtype=spec.dtype)
            a[..., spec.shape[-1] * 3 // 4:] = 0
        elif spec.high:
            a = rng.integers(0, spec.high, size=spec.shape, dtype=spec.dtype)
        else:
            a = rng.standard_normal(spec.shape).astype(spec.dtype)
        out[spec.name] = a
    return out


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|: the one accuracy measure of the model tests."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if want.size == 0:
        return 0.0
    scale = float(np.max(np.abs(want)))
    diff = float(np.max(np.abs(got - want)))
    return diff / scale if scale > 0 else diff


def run_onnxruntime(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = min(2, os.cpu_count() or 1)
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def export(name: str, force: bool = False) -> Path:
    """Returns the cached ONNX file for `name`, exporting it first if it is not there."""
    path = model_path(name)
    if path.exists() and not force:
        return path
    import torch

    spec = MODELS[name]
    inputs = make_inputs(name)
    model = spec.build()
    args = tuple(torch.from_numpy(inputs[i.name]) for i in spec.inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write under a temporary name and rename: an interrupted export never looks like a cache hit.
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
    os.close(fd)
    # The exporter's constant folder logs harmless "Evaluation failed" warnings for shape ops.
    logging.getLogger("onnxscript.optimizer").setLevel(logging.ERROR)
    try:
        torch.onnx.export(model, args, tmp, dynamo=True, external_data=False,
                          input_names=[i.name for i in spec.inputs],
                          output_names=list(spec.outputs), verbose=False)
        with torch.no_grad():
            want = model(*args)
        want = (want,) if isinstance(want, torch.Tensor) else tuple(want)
        got = run_onnxruntime(Path(tmp), inputs)
        for out_name, w in zip(spec.outputs, want):
            err = relative_error(got[out_name], w.numpy())
            if not err <= 1e-4:
                raise RuntimeError(f"export of {name}: onnxruntime differs from PyTorch on "
                                   f"'{out_name}' (relative error {err:.2e}); not cached")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def output_file(output_dir: Path, output_name: str) -> Path:
    """Where `pto run --output-dir` writes an output: unsafe characters become '_'."""
    return Path(output_dir) / (re.sub(r"[^A-Za-z0-9_.-]", "_", output_name) + ".npy")


def main(argv: list[str]) -> int:
    names = argv or list(MODELS)
    for n in names:
        if n not in MODELS:
            print(f"unknown model '{n}'; known: {', '.join(MODELS)}", file=sys.stderr)
            return 2
    for n in names:
        print(export(n))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
