"""The model zoo of the PyTorch-frontend tests: torchvision, timm and transformers models built in
code with random weights (seed 0, never downloaded), and inputs for a given batch size.

ZOO's first ten entries are the benchmark models (bench/run.py and others build them by name, at
these sizes); the rest widen the architecture coverage of tests/python/test_torch_models.py at
small sizes (images of 64 where the model allows, transformers of a tiny config). ALWAYS_ON is the
subset that test runs by default; PTO_ZOO=full runs them all."""

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


def _video(name: str):
    def build():
        import torchvision

        return getattr(torchvision.models.video, name)()

    return build


def _text(config_name: str, model_name: str, **config):
    def build():
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        return getattr(transformers, model_name)(cfg)

    return ZooModel(build, lambda b: (torch.randint(0, 1000, (b, SEQ)),))


def _timm(name: str, image: int = IMAGE, **kwargs):
    def build():
        import timm

        return timm.create_model(name, pretrained=False, **kwargs)

    return ZooModel(build, lambda b: (torch.randn(b, 3, image, image),))


# A transformer small enough to build in a fraction of a second: 2 layers of 64 wide, 4 heads.
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            vocab_size=1000)


class _Keywords(torch.nn.Module):
    """Calls `model` with its positional arguments as the keywords `names` (encoder-decoders,
    audio and image models whose first argument is not the one given)."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args)), return_dict=True)


def _hf(config_name: str, model_name: str, make_inputs: Callable[[int], tuple] | None = None,
        keywords: tuple[str, ...] = (), **config):
    def build():
        import transformers

        m = getattr(transformers, model_name)(getattr(transformers, config_name)(**config))
        return _Keywords(m, keywords) if keywords else m

    return ZooModel(build, make_inputs or (lambda b: (torch.randint(0, 1000, (b, SEQ)),)))


def _tokens_pair(b: int) -> tuple:
    return torch.randint(0, 1000, (b, SEQ)), torch.randint(0, 1000, (b, SEQ // 2))


def _image(size: int) -> Callable[[int], tuple]:
    return lambda b: (torch.randn(b, 3, size, size),)


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
    # torchvision
    "resnext50_32x4d": _vision("resnext50_32x4d"),
    "efficientnet_v2_s": _vision("efficientnet_v2_s"),
    "shufflenet_v2_x0_5": _vision("shufflenet_v2_x0_5"),
    "squeezenet1_1": _vision("squeezenet1_1"),
    "densenet121": _vision("densenet121"),
    "googlenet": _vision("googlenet", aux_logits=False, init_weights=True),
    "regnet_y_400mf": _vision("regnet_y_400mf"),
    "swin_t": _vision("swin_t"),
    "maxvit_t": _vision("maxvit_t", image=224),
    "mnasnet0_5": _vision("mnasnet0_5"),
    # timm
    "ghostnet_100": _timm("ghostnet_100"),
    "levit_128s": _timm("levit_128s", image=224),
    "convnextv2_atto": _timm("convnextv2_atto"),
    "resnetv2_50x1_bit": _timm("resnetv2_50x1_bit"),
    "efficientvit_b0": _timm("efficientvit_b0"),
    "tiny_vit_5m_224": _timm("tiny_vit_5m_224", image=224),
    "eva02_tiny": _timm("eva02_tiny_patch14_224", image=56, img_size=56),
    "deit_tiny": _timm("deit_tiny_patch16_224", image=64, img_size=64),
    "poolformer_s12": _timm("poolformer_s12"),
    "fastvit_t8": _timm("fastvit_t8"),
    "hrnet_w18_small": _timm("hrnet_w18_small"),
    "dla34": _timm("dla34"),
    "mixnet_s": _timm("mixnet_s"),
    "mobilevitv2_050": _timm("mobilevitv2_050"),
    # transformers, tiny configs
    "distilbert": _hf("DistilBertConfig", "DistilBertModel", dim=64, n_layers=2, n_heads=4,
                      hidden_dim=128, vocab_size=1000),
    "roberta": _hf("RobertaConfig", "RobertaModel", **TINY),
    "deberta_v2": _hf("DebertaV2Config", "DebertaV2Model", **TINY),
    "albert": _hf("AlbertConfig", "AlbertModel", embedding_size=32, **TINY),
    "electra": _hf("ElectraConfig", "ElectraModel", embedding_size=32, **TINY),
    "llama": _hf("LlamaConfig", "LlamaModel", num_key_value_heads=2, use_cache=False, **TINY),
    "qwen2": _hf("Qwen2Config", "Qwen2Model", num_key_value_heads=2, use_cache=False, **TINY),
    "mistral": _hf("MistralConfig", "MistralModel", num_key_value_heads=2, use_cache=False,
                   **TINY),
    "bloom": _hf("BloomConfig", "BloomModel", hidden_size=64, n_layer=2, n_head=4,
                 vocab_size=1000, use_cache=False),
    "opt": _hf("OPTConfig", "OPTModel", hidden_size=64, num_hidden_layers=2,
               num_attention_heads=4, ffn_dim=128, word_embed_proj_dim=64, vocab_size=1000,
               use_cache=False),
    "bart": _hf("BartConfig", "BartModel", _tokens_pair, ("input_ids", "decoder_input_ids"),
                d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                vocab_size=1000, use_cache=False),
    "whisper": _hf("WhisperConfig", "WhisperModel",
                   lambda b: (torch.randn(b, 80, 16), torch.randint(0, 1000, (b, 4))),
                   ("input_features", "decoder_input_ids"), d_model=64, encoder_layers=2,
                   decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                   encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000,
                   max_source_positions=8, max_target_positions=32, pad_token_id=0,
                   bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, use_cache=False),
    "wav2vec2": _hf("Wav2Vec2Config", "Wav2Vec2Model", lambda b: (torch.randn(b, 800),),
                    ("input_values",), conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                    num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **TINY),
    "vit_hf": _hf("ViTConfig", "ViTModel", _image(32), ("pixel_values",), image_size=32,
                  patch_size=8, **{k: v for k, v in TINY.items() if k != "vocab_size"}),
    "dinov2": _hf("Dinov2Config", "Dinov2Model", _image(56), ("pixel_values",), image_size=56,
                  patch_size=14, **{k: v for k, v in TINY.items() if k != "vocab_size"}),
    "segformer": _hf("SegformerConfig", "SegformerForSemanticSegmentation", _image(64),
                     ("pixel_values",), num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                     hidden_sizes=[16, 32], num_attention_heads=[1, 2], patch_sizes=[7, 3],
                     strides=[4, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=4),
    # Added after a sweep of architectures outside the zoo: a 3-D conv net (LowerConv3D), XCiT
    # (repeat with new leading dims), HaloNet (Tensor.unfold), CLIP's text tower (ArgMax of ids).
    "r3d_18": ZooModel(_video("r3d_18"), lambda b: (torch.randn(b, 3, 4, 32, 32),)),
    "xcit_nano": _timm("xcit_nano_12_p16_224", image=64, img_size=64),
    "halonet26t": _timm("halonet26t", image=256),
    "clip_text": _hf("CLIPTextConfig", "CLIPTextModel", **TINY),
    # A second sweep: mixture-of-experts decoders (captured with experts_implementation
    # "batched_mm"), MViT (3-D pooling).
    "mixtral": _hf("MixtralConfig", "MixtralModel", num_local_experts=4, num_experts_per_tok=2,
                   num_key_value_heads=2, use_cache=False, **TINY),
    "deepseek_v3": _hf("DeepseekV3Config", "DeepseekV3Model", n_routed_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                       first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32,
                       qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=8, n_group=2,
                       topk_group=1, num_key_value_heads=4, use_cache=False, **TINY),
    "mvit_v2_s": ZooModel(_video("mvit_v2_s"), lambda b: (torch.randn(b, 3, 16, 224, 224),)),
    # Hybrid linear-attention decoders: Gated DeltaNet layers (transformers' chunked PyTorch form,
    # a uint8 arange among its masks) and a full-attention layer, MoE in Qwen3-Next. Their
    # capture takes about a minute (torch.export's decompositions of the unrolled chunk loops).
    "qwen3_5": _hf("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", num_key_value_heads=2, head_dim=16,
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                   linear_value_head_dim=16, use_cache=False, **{**TINY, "num_hidden_layers": 4}),
}

# The first ten: what the benchmarks, the layout and save/load tests and bench/accuracy.py run.
CORE = list(ZOO)[:10]

# What tests/python/test_torch_models.py runs unless PTO_ZOO says otherwise: an architecture of
# each kind, within about two minutes on two cores.
ALWAYS_ON = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "bert", "gpt2",
             "t5_encoder", "shufflenet_v2_x0_5", "regnet_y_400mf", "swin_t", "ghostnet_100",
             "levit_128s", "eva02_tiny", "roberta", "deberta_v2", "llama", "bloom", "bart",
             "whisper", "dinov2", "segformer", "mixtral"]


def randomize_(model: torch.nn.Module, example: tuple | None = None,
               seed: int = SEED) -> torch.nn.Module:
    """Redraws what a model's own initialization leaves constant, so no output is trivially zero
    or a bias: a matrix or kernel that is constant (a zero-initialized head, timm's zero_init_last)
    N(0, 1/fan_in); a constant vector of scales (norm gammas, layer scales) U(0.5, 1.5); every
    bias N(0, 0.02); running means N(0, 0.1) and variances U(0.8, 1.2). Weights the model drew at
    random keep their distribution (the library's init is what keeps a deep net's signal alive).
    Integer buffers (position ids) are kept.

    With `example` (inputs of some 16 images), batch norms then take their running statistics
    from the model's own activations on it (a forward pass in training mode, cumulative
    averages): with the default statistics a deep mobile network's activations shrink layer by
    layer until every input gives the same output. Variances are kept above a tenth of their
    layer's mean, so no channel amplifies float32 rounding. (From 4 images, LeViT's eager float32
    output was 6% off its float64 one; from 16, 5e-6.) The model is left in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or p.numel() == 0:
                continue
            leaf = name.rsplit(".", 1)[-1]
            constant = p.numel() == 1 or bool((p == p.reshape(-1)[0]).all())
            if leaf == "running_var":
                p.copy_(torch.rand(p.shape, generator=g) * 0.4 + 0.8)
            elif leaf == "running_mean":
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif "bias" in leaf:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif constant and p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
            elif constant and "num_batches" not in leaf:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
        norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        if example is not None and norms:
            for m in norms:
                m.reset_running_stats()
                m.momentum = None  # a cumulative average over the calibration pass
            model.train()
            model(*example)
            for m in norms:  # a channel of almost no variance would amplify rounding 1000-fold
                m.running_var.clamp_(min=0.1 * m.running_var.mean().item())
    return model.eval()


def check_nontrivial(out: torch.Tensor, what: str) -> None:
    """The output a comparison can trust: finite, not all zero, different between the two batch
    elements and along its last axis (not a broadcast constant such as a bias)."""
    assert torch.isfinite(out).all(), f"{what}: the eager output is not finite"
    scale = out.abs().max().item()
    assert scale > 0, f"{what}: the eager output is all zeros"
    if out.shape[0] >= 2:
        diff = (out[0] - out[1]).abs().max().item()
        assert diff > 1e-3 * scale, f"{what}: both batch elements give the same output"
    if out.shape[-1] >= 2:
        spread = (out - out[..., :1]).abs().max().item()
        assert spread > 1e-3 * scale, f"{what}: the output is constant along its last axis"


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


class FirstOutput(torch.nn.Module):
    """A zoo model returning its main output only (first_tensor), as the benchmarks export it."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.m = model

    def forward(self, *xs):
        return first_tensor(self.m(*xs))


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
