"""The model zoo of the PyTorch-frontend tests: torchvision and transformers models built in code
with random weights (seed 0, never downloaded), and inputs for a given batch size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.utils._pytree as pytree

SEED = 0
IMAGE = 64  # CNNs run at 64x64: the reference kernels that back level 0 today are slow
SEQ = 16


@dataclass
class ZooModel:
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int], tuple]


def _vision(name: str, image: int = IMAGE, **kwargs):
    def build():
        import torchvision

        m = getattr(torchvision.models, name)(**kwargs)
        if name.startswith("vit"):
            # torchvision initializes ViT's classifier to zeros: the logits would be all zero
            # and compare equal whatever the encoder computed.
            torch.nn.init.normal_(m.heads.head.weight, std=0.02)
        return m

    return ZooModel(build, lambda b: (torch.randn(b, 3, image, image),))


def _text(config_name: str, model_name: str, **config):
    def build():
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        return getattr(transformers, model_name)(cfg)

    return ZooModel(build, lambda b: (torch.randint(0, 1000, (b, SEQ)),))


ZOO: dict[str, ZooModel] = {
    "resnet18": _vision("resnet18"),
    "resnet50": _vision("resnet50"),
    "mobilenet_v2": _vision("mobilenet_v2"),
    "mobilenet_v3_small": _vision("mobilenet_v3_small"),
    "efficientnet_b0": _vision("efficientnet_b0"),
    "vit_b_16": _vision("vit_b_16", image=224),  # its position embedding fixes 224x224
    "convnext_tiny": _vision("convnext_tiny"),
    "bert": _text("BertConfig", "BertModel"),
    "gpt2": _text("GPT2Config", "GPT2Model", use_cache=False),
    "t5_encoder": _text("T5Config", "T5EncoderModel"),
}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(SEED)
    return ZOO[name].build().eval()


def inputs(name: str, batch: int) -> tuple:
    torch.manual_seed(SEED + batch)
    return ZOO[name].inputs(batch)


def first_tensor(out):
    """The main output: a tensor, or the first field of a tuple / ModelOutput."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0]


def check_at_batch_sizes(model, fast, name: str, tolerance: float, batches=(1, 2)) -> None:
    """Runs `fast` and eager `model` on the zoo inputs of each batch size: the output structures
    must be the same and every output tensor within `tolerance` (relative_error)."""
    for batch in batches:
        args = inputs(name, batch)
        with torch.inference_mode():
            want = model(*args)
        got = fast(*args)
        assert type(got) is type(want)
        got_leaves, got_spec = pytree.tree_flatten(got)
        want_leaves, want_spec = pytree.tree_flatten(want)
        assert got_spec == want_spec
        for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
            err = relative_error(g, w)
            assert err <= tolerance, f"batch {batch}, output {i}: relative error {err:.3e}"


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|: the error on the output's scale."""
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}"
    scale = want.abs().max().item()
    assert scale > 0, "the reference output is all zeros: the comparison would prove nothing"
    err = (got.double() - want.double()).abs().max().item()
    return float("inf") if err != err else err / scale
