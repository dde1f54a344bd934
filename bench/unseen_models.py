#!/usr/bin/env python3
"""Models outside the test zoo (tests/python/torch_models.py), each tried the ways a user would:

  optimize  pypto.optimize(model) against eager PyTorch (max |got-want| / max |want| <= 1e-4);
  compile   torch.compile(model, backend="pypto") against eager (--ways compile; the ops it left
            to PyTorch are listed), the way for models pypto.optimize cannot capture;
  onnx      torch.onnx.export (dynamo=False, opset 17; dynamo=True where that fails), then
            pypto.onnx.load(file, level=2 and 3) against onnxruntime on the same file.

Random weights (seed 0, never downloaded), heads redrawn so no output is trivially constant
(torch_models.randomize_). One child process per model and way, with a time limit.

    python bench/unseen_models.py                          # everything, a table at the end
    python bench/unseen_models.py --models alexnet,phi --ways onnx --json out.json
    python bench/unseen_models.py --set third --time       # the third sweep's 35, timed

--set first / third / fourth / fifth / sixth: one sweep's list (docs/unseen_models.md); a model
whose package (timm, transformers, torchvision) is not installed is skipped with a line naming it.
--time: one thread in PyTorch, PyPTO and onnxruntime, and the median ms at batch 2 of PyPTO (levels
2 / 3) and its peer, measured in the same child process. The third to sixth sets also check batch 1
(the compiled batch is symbolic) and CNNs at level 3 in the optimize way, and try dynamo=True first
for ONNX.

A row per model and way: works / rounding (outside 1e-4, but within 10x the peer's own error
against eager float64) / wrong / empty (no output to compare) / error (the error's first line) /
timeout; for onnx, where onnxruntime is itself off eager PyTorch by more than 1e-4 (a detector's
near ties), eager decides: works, or undecided; for onnx also the exporter used and the worst
error over levels 2 and 3. docs/unseen_models.md has the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MARK = "@@unseen@@"
TOLERANCE = 1e-4
# "rounding", not "wrong": outside TOLERANCE of the float32 peer, but within ROUNDING times the
# peer's own error against eager float64 (a model whose float32 output is that far from float64
# amplifies rounding; level 3's Winograd convolutions round differently again).
ROUNDING = 10


# --- the models ---------------------------------------------------------------------------------

def _tv(name: str, image: int = 64, **kwargs):
    def build():
        import torchvision

        kwargs.setdefault("weights", None)
        return getattr(torchvision.models, name)(**kwargs)

    return build, lambda: (__import__("torch").randn(2, 3, image, image),)


class _Detector:
    """A torchvision detector (a list of images in, a list of dicts out) as tensors in and out:
    the boxes, scores and labels of the first image (masks / keypoints where there are)."""

    @staticmethod
    def wrap(model):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                d = self.m(list(x))[0]
                return tuple(d[k] for k in sorted(d))

        return Wrapped(model)


DETECTORS = set()  # outputs sorted by score: no float64 verdict (near ties reorder them)


def _det(name: str, image: int = 128, module: str = "detection", **kwargs):
    """Thresholds at 0 so random weights still give detections (an empty output proves nothing),
    and class logits scaled 30-fold: with their initial weights SSDlite's 91 class scores were
    all within 1.5% of 1/91, and near ties put eager's and onnxruntime's boxes in different
    orders."""
    DETECTORS.add(name)

    def build():
        import torch
        import torchvision

        m = getattr(getattr(torchvision.models, module), name)(
            weights=None, weights_backbone=None, **kwargs)
        with torch.no_grad():
            for pname, p in m.named_parameters():
                if any(k in pname for k in ("cls_logits", "cls_score", "classification_head")):
                    p.mul_(30)
        return _Detector.wrap(m)

    return build, lambda: (__import__("torch").rand(1, 3, image, image),)


def _seg(name: str, image: int = 64):
    def build():
        import torch
        import torchvision

        m = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None,
                                                           aux_loss=False)

        class Out(torch.nn.Module):  # the dict's "out"
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(x)["out"]

        return Out(m)

    return build, lambda: (__import__("torch").randn(2, 3, image, image),)


def _raft():
    def build():
        import torch
        import torchvision

        m = torchvision.models.optical_flow.raft_small(weights=None)

        class Last(torch.nn.Module):  # the final flow estimate
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, a, b):
                return self.m(a, b, num_flow_updates=3)[-1]

        return Last(m)

    import torch
    return build, lambda: (torch.randn(1, 3, 128, 128), torch.randn(1, 3, 128, 128))


TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            vocab_size=1000)


def _hf(config: str, model: str, inputs: str = "tokens", keywords: tuple[str, ...] = (),
        output: str = "", **cfg):
    def build():
        import torch
        import transformers

        m = getattr(transformers, model)(getattr(transformers, config)(**cfg))
        names = keywords or (("pixel_values",) if inputs.startswith("image") else ("input_ids",))

        class Keywords(torch.nn.Module):  # positional tensors in, the first output out
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, *args):
                out = self.m(**dict(zip(names, args)), return_dict=True)
                if output:
                    return getattr(out, output)
                return out[0] if not hasattr(out, "last_hidden_state") else out.last_hidden_state

        return Keywords(m)

    def make():
        import torch

        if inputs == "tokens":
            return (torch.randint(0, 1000, (2, 16)),)
        if inputs == "pair":
            return torch.randint(0, 1000, (2, 16)), torch.randint(0, 1000, (2, 8))
        if inputs.startswith("image"):
            size = int(inputs[5:] or 64)
            return (torch.randn(2, 3, size, size),)
        if inputs == "speech":  # Speech2Text: 80 filter-bank features, then decoder tokens
            return torch.randn(2, 32, 80), torch.randint(0, 1000, (2, 8))
        raise ValueError(inputs)

    return build, make


MODELS = {
    # torchvision classifiers not in the zoo
    "alexnet": _tv("alexnet", image=64),
    "vgg11_bn": _tv("vgg11_bn", image=64),
    "inception_v3": _tv("inception_v3", image=96, aux_logits=False, init_weights=True),
    "wide_resnet50_2": _tv("wide_resnet50_2"),
    "regnet_x_400mf": _tv("regnet_x_400mf"),
    "mobilenet_v3_large": _tv("mobilenet_v3_large"),
    "efficientnet_b3": _tv("efficientnet_b3"),
    "swin_v2_t": _tv("swin_v2_t"),
    "convnext_small": _tv("convnext_small"),
    "shufflenet_v2_x1_0": _tv("shufflenet_v2_x1_0"),
    "squeezenet1_0": _tv("squeezenet1_0"),
    "densenet161": _tv("densenet161"),
    "vit_b_32": _tv("vit_b_32", image=224),
    # Hugging Face classes with tiny configs
    "gpt_neox": _hf("GPTNeoXConfig", "GPTNeoXModel", use_cache=False, **TINY),
    "falcon": _hf("FalconConfig", "FalconModel", use_cache=False, **TINY),
    "phi": _hf("PhiConfig", "PhiModel", use_cache=False, **TINY),
    "gemma": _hf("GemmaConfig", "GemmaModel", num_key_value_heads=2, head_dim=16,
                 use_cache=False, **TINY),
    "gemma2": _hf("Gemma2Config", "Gemma2Model", num_key_value_heads=2, head_dim=16,
                  use_cache=False, **TINY),
    "stablelm": _hf("StableLmConfig", "StableLmModel", num_key_value_heads=2, use_cache=False,
                    **TINY),
    "mobilevit_hf": _hf("MobileViTConfig", "MobileViTModel", "image64", image_size=64),
    "convnext_hf": _hf("ConvNextConfig", "ConvNextModel", "image64", hidden_sizes=[16, 32, 64, 128],
                       depths=[1, 1, 2, 1]),
    "swin_hf": _hf("SwinConfig", "SwinModel", "image64", image_size=64, embed_dim=16,
                   depths=[1, 1], num_heads=[2, 4], window_size=4),
    "deit_hf": _hf("DeiTConfig", "DeiTModel", "image32", image_size=32, patch_size=8, **{
        k: v for k, v in TINY.items() if k != "vocab_size"}),
    "beit": _hf("BeitConfig", "BeitModel", "image32", image_size=32, patch_size=8,
                use_relative_position_bias=True, **TINY),
    "yolos": _hf("YolosConfig", "YolosModel", "image32", image_size=[32, 32], patch_size=8,
                 num_detection_tokens=4, **{k: v for k, v in TINY.items() if k != "vocab_size"}),
    "detr": _hf("DetrConfig", "DetrModel", "image64", use_timm_backbone=False,
                backbone_config={"model_type": "resnet", "depths": [1, 1, 1, 1],
                                 "hidden_sizes": [16, 32, 64, 128], "embedding_size": 16,
                                 "out_features": ["stage4"]},
                d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                num_queries=8),
    "marian": _hf("MarianConfig", "MarianMTModel", "pair", ("input_ids", "decoder_input_ids"),
                  d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                  vocab_size=1000, decoder_start_token_id=0, pad_token_id=1),
    "t5": _hf("T5Config", "T5ForConditionalGeneration", "pair", ("input_ids", "decoder_input_ids"),
              d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=1000),
    "speech2text": _hf("Speech2TextConfig", "Speech2TextModel", "speech",
                       ("input_features", "decoder_input_ids"), d_model=64, encoder_layers=2,
                       decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                       encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000,
                       input_feat_per_channel=80, conv_channels=64, max_source_positions=64),
    "clip_vision": _hf("CLIPVisionConfig", "CLIPVisionModel", "image32", image_size=32,
                       patch_size=8, **{k: v for k, v in TINY.items() if k != "vocab_size"}),
    "siglip_vision": _hf("SiglipVisionConfig", "SiglipVisionModel", "image32", image_size=32,
                         patch_size=8, **{k: v for k, v in TINY.items() if k != "vocab_size"}),
    # segmentation, optical flow
    "deeplabv3_mobilenet_v3_large": _seg("deeplabv3_mobilenet_v3_large"),
    "lraspp_mobilenet_v3_large": _seg("lraspp_mobilenet_v3_large"),
    "fcn_resnet50": _seg("fcn_resnet50"),
    "raft_small": _raft(),
    # detection (data-dependent shapes: NMS, RoiAlign, TopK)
    "fasterrcnn_mobilenet_v3_large_320_fpn": _det(
        "fasterrcnn_mobilenet_v3_large_320_fpn", box_score_thresh=0.0, min_size=128, max_size=128),
    "retinanet_resnet50_fpn": _det(
        "retinanet_resnet50_fpn", score_thresh=0.0, min_size=128, max_size=128),
    "ssdlite320_mobilenet_v3_large": _det("ssdlite320_mobilenet_v3_large", score_thresh=0.0),
    "fcos_resnet50_fpn": _det(
        "fcos_resnet50_fpn", score_thresh=0.0, min_size=128, max_size=128),
    "keypointrcnn_resnet50_fpn": _det(
        "keypointrcnn_resnet50_fpn", box_score_thresh=0.0, min_size=128, max_size=128),
    "maskrcnn_resnet50_fpn": _det(
        "maskrcnn_resnet50_fpn", box_score_thresh=0.0, min_size=128, max_size=128),
}


FIRST = list(MODELS)  # the first sweep (2026-12-05 morning)

# The third sweep (2026-12-05 afternoon): timm architectures and Hugging Face classes outside the
# zoo and the lists above. CNNs also run at level 3 (channel-blocked layout, Winograd).
CNNS = set()


def _timm(name: str, image: int = 64, cnn: bool = False, **kwargs):
    if cnn:
        CNNS.add(name)

    def build():
        import timm

        if name not in timm.list_models():
            raise ModuleNotFoundError(f"timm {timm.__version__} has no model {name!r}")
        return timm.create_model(name, pretrained=False, **kwargs)

    return build, lambda: (__import__("torch").randn(2, 3, image, image),)


def _audio(config: str, model: str, **cfg):  # wav2vec2-like: 800 samples of raw audio
    build, _ = _hf(config, model, keywords=("input_values",), **cfg)
    return build, lambda: (__import__("torch").randn(2, 800),)


_CONV_AUDIO = dict(conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                   num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **TINY)
_SEQ2SEQ = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                vocab_size=1000, use_cache=False)
_NO_VOCAB = {k: v for k, v in TINY.items() if k != "vocab_size"}

THIRD = {
    # timm CNNs (64x64)
    "resnest14d": _timm("resnest14d", cnn=True),  # split attention (radix softmax)
    "cspresnet50": _timm("cspresnet50", cnn=True),
    "repvgg_a0": _timm("repvgg_a0", cnn=True),
    "rexnet_100": _timm("rexnet_100", cnn=True),
    "tf_efficientnetv2_b0": _timm("tf_efficientnetv2_b0", cnn=True),  # TF "same" padding
    "res2net50_14w_8s": _timm("res2net50_14w_8s", cnn=True),
    "selecsls42b": _timm("selecsls42b", cnn=True),
    "ese_vovnet19b_dw": _timm("ese_vovnet19b_dw", cnn=True),
    "lcnet_050": _timm("lcnet_050", cnn=True),
    "xception41": _timm("xception41", cnn=True),
    "dm_nfnet_f0": _timm("dm_nfnet_f0", cnn=True),  # scaled weight standardization
    "regnetz_b16": _timm("regnetz_b16", cnn=True),
    "inception_next_tiny": _timm("inception_next_tiny", cnn=True),
    "mambaout_femto": _timm("mambaout_femto", cnn=True),
    "edgenext_xx_small": _timm("edgenext_xx_small", cnn=True),
    # timm transformers and MLPs
    "sequencer2d_s": _timm("sequencer2d_s"),  # bidirectional LSTMs over rows and columns
    "pvt_v2_b0": _timm("pvt_v2_b0"),
    "coat_lite_tiny": _timm("coat_lite_tiny", img_size=64),
    "efficientformerv2_s0": _timm("efficientformerv2_s0", img_size=64),
    "vit_small_patch16_rope_224": _timm("vit_small_patch16_rope_224", img_size=64),
    "davit_tiny": _timm("davit_tiny"),
    # Hugging Face classes, tiny configs
    "convbert": _hf("ConvBertConfig", "ConvBertModel", embedding_size=64, **TINY),
    "funnel": _hf("FunnelConfig", "FunnelModel", block_sizes=[1, 1], num_decoder_layers=1,
                  d_model=64, n_head=4, d_head=16, d_inner=128, vocab_size=1000),
    "mpnet": _hf("MPNetConfig", "MPNetModel", **TINY),
    "longformer": _hf("LongformerConfig", "LongformerModel", attention_window=[4, 4], **TINY),
    "gptj": _hf("GPTJConfig", "GPTJModel", n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                n_positions=64, vocab_size=1000, use_cache=False),
    "persimmon": _hf("PersimmonConfig", "PersimmonModel", use_cache=False, **TINY),
    "phi3": _hf("Phi3Config", "Phi3Model", num_key_value_heads=2, pad_token_id=0,
                use_cache=False, **TINY),
    "pegasus": _hf("PegasusConfig", "PegasusModel", "pair", ("input_ids", "decoder_input_ids"),
                   decoder_start_token_id=0, pad_token_id=0, **_SEQ2SEQ),
    "fnet": _hf("FNetConfig", "FNetModel", use_tpu_fourier_optimizations=False, **TINY),
    "hubert": _audio("HubertConfig", "HubertModel", **_CONV_AUDIO),
    "mamba": _hf("MambaConfig", "MambaModel", hidden_size=64, num_hidden_layers=2,
                 state_size=8, vocab_size=1000, use_cache=False),
    "rwkv": _hf("RwkvConfig", "RwkvModel", hidden_size=64, num_hidden_layers=2,
                attention_hidden_size=64, intermediate_size=128, vocab_size=1000,
                context_length=32, use_cache=False),
    "swin2sr": _hf("Swin2SRConfig", "Swin2SRForImageSuperResolution", "image32", image_size=32,
                   embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, upscale=2),
    # (DPTForDepthEstimation's depth ends in a ReLU: all zeros with random weights)
    "dpt": _hf("DPTConfig", "DPTForSemanticSegmentation", "image32", image_size=32, patch_size=8,
               num_labels=4,
               backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 32, 64, 64],
               fusion_hidden_size=32, head_hidden_size=16,
               **{**_NO_VOCAB, "num_hidden_layers": 4}),
}

# The fourth sweep (2026-12-06): timm architectures none of the lists above has, at 64x64 where
# the model takes any size and at its own size where the position embedding or windows fix it.
FOURTH = {
    # CNNs
    **{n: _timm(n, cnn=True) for n in (
        "dpn68", "eca_nfnet_l0", "tresnet_m", "ghostnetv2_100", "repghostnet_050",
        "rdnet_tiny", "hgnetv2_b0", "mobileone_s0", "repvit_m0_9", "starnet_s1", "tinynet_a",
        "mobilenetv4_conv_small", "semnasnet_050", "fbnetc_100", "convmixer_768_32",
        "lambda_resnet26t", "caformer_s18", "fastvit_sa12", "efficientvit_m0")},
    "inception_v4": _timm("inception_v4", 128, cnn=True),  # 64x64 is below its smallest input
    # transformers, MLPs and hybrids
    "mobilenetv4_hybrid_medium": _timm("mobilenetv4_hybrid_medium"),
    "cait_xxs24_224": _timm("cait_xxs24_224", img_size=64),
    "mixer_s16_224": _timm("mixer_s16_224", img_size=64),
    "resmlp_12_224": _timm("resmlp_12_224", img_size=64),
    "gmlp_ti16_224": _timm("gmlp_ti16_224", img_size=64),
    "volo_d1_224": _timm("volo_d1_224", 224),
    "crossvit_tiny_240": _timm("crossvit_tiny_240", 240),
    "focalnet_tiny_srf": _timm("focalnet_tiny_srf"),
    "gcvit_xxtiny": _timm("gcvit_xxtiny", 224),
    "nextvit_small": _timm("nextvit_small"),
    "mvitv2_tiny": _timm("mvitv2_tiny", 224),
    "hiera_tiny_224": _timm("hiera_tiny_224", 224),
    "efficientformer_l1": _timm("efficientformer_l1", 224),
    "tiny_vit_11m_224": _timm("tiny_vit_11m_224", 224),
    "botnet26t_256": _timm("botnet26t_256", 256),
    "coatnet_nano_rw_224": _timm("coatnet_nano_rw_224", 224),
    "maxxvitv2_nano_rw_256": _timm("maxxvitv2_nano_rw_256", 256),
    "levit_conv_128s": _timm("levit_conv_128s", 224),
}


def _hf_inputs(config: str, model: str, keywords: tuple[str, ...], make, output: str = "",
               **cfg):
    """A Hugging Face class whose inputs are not tokens or images: `make` builds them."""
    build, _ = _hf(config, model, keywords=keywords, output=output, **cfg)
    return build, make


def _randn(*shape):
    return lambda: (__import__("torch").randn(*shape),)


# The fifth sweep (2026-12-06): timm and Hugging Face architectures none of the lists above has,
# chosen for what they add: split/selective kernels, CSP darknets, blur pools, NAS cells, relative
# position biases, MoE and state-space decoders, audio spectrograms, codecs and time series.
FIFTH = {
    **{n: _timm(n, cnn=True) for n in (
        "cs3darknet_s", "skresnet18", "gernet_s", "ecaresnet26t", "res2next50",
        "seresnext26d_32x4d", "gcresnet33ts", "densenetblur121d", "hardcorenas_a",
        "spnasnet_100", "mixnet_xl", "efficientnet_lite0", "resnetrs50", "rexnetr_100",
        "fbnetv3_b", "lcnet_100", "resnetblur18", "nf_resnet26", "regnety_002",
        "convformer_s18", "poolformerv2_s12")},
    "inception_resnet_v2": _timm("inception_resnet_v2", 128, cnn=True),
    "nasnetalarge": _timm("nasnetalarge", 96, cnn=True),  # NAS cells: pads, pools, concats
    "efficientvit_b1": _timm("efficientvit_b1"),
    "mobilevitv2_075": _timm("mobilevitv2_075"),
    "pit_ti_224": _timm("pit_ti_224", 224),
    "visformer_tiny": _timm("visformer_tiny", 224),
    "convit_tiny": _timm("convit_tiny", 224),
    "twins_pcpvt_small": _timm("twins_pcpvt_small"),
    "deit3_small_patch16_224": _timm("deit3_small_patch16_224", img_size=64),
    "vit_relpos_small_patch16_224": _timm("vit_relpos_small_patch16_224", img_size=64),
    "swinv2_cr_tiny_ns_224": _timm("swinv2_cr_tiny_ns_224", 224),
    "xcit_tiny_12_p16_224": _timm("xcit_tiny_12_p16_224", img_size=64),
    # Hugging Face classes, tiny configs
    "xlnet": _hf("XLNetConfig", "XLNetModel", d_model=64, n_layer=2, n_head=4, d_inner=128,
                 vocab_size=1000, use_mems_eval=False),
    "nystromformer": _hf("NystromformerConfig", "NystromformerModel", num_landmarks=4,
                         segment_means_seq_len=16, **TINY),
    "esm": _hf("EsmConfig", "EsmModel", pad_token_id=1, position_embedding_type="rotary",
               **TINY),
    "roformer": _hf("RoFormerConfig", "RoFormerModel", embedding_size=64, **TINY),
    "squeezebert": _hf("SqueezeBertConfig", "SqueezeBertModel", embedding_size=64, q_groups=2,
                       k_groups=2, v_groups=2, post_attention_groups=2,
                       intermediate_groups=2, output_groups=2, **TINY),
    "mobilebert": _hf("MobileBertConfig", "MobileBertModel", embedding_size=32,
                      intra_bottleneck_size=32, true_hidden_size=32, num_feedforward_networks=2,
                      **TINY),
    "olmo": _hf("OlmoConfig", "OlmoModel", use_cache=False, **TINY),
    "mixtral": _hf("MixtralConfig", "MixtralModel", num_key_value_heads=2, num_local_experts=4,
                   num_experts_per_tok=2, use_cache=False, **TINY),
    "modernbert": _hf("ModernBertConfig", "ModernBertModel", global_attn_every_n_layers=2,
                      local_attention=8, pad_token_id=0, **TINY),
    "data2vec_vision": _hf("Data2VecVisionConfig", "Data2VecVisionModel", "image32",
                           image_size=32, patch_size=8, use_relative_position_bias=True,
                           **_NO_VOCAB),
    "levit_hf": _hf("LevitConfig", "LevitModel", "image64", image_size=64,
                    hidden_sizes=[32, 48, 64], num_attention_heads=[2, 3, 4], depths=[1, 1, 1],
                    key_dim=[8, 8, 8]),
    # (depth[i] > i: CvtStage indexes its drop-path rates by the stage)
    "cvt": _hf("CvtConfig", "CvtModel", "image64", depth=[1, 2, 3]),
    "efficientnet_hf": _hf("EfficientNetConfig", "EfficientNetModel", "image64", image_size=64,
                           width_coefficient=0.5, depth_coefficient=0.5, hidden_dim=640),
    "bit_hf": _hf("BitConfig", "BitModel", "image64", embedding_size=64,
                  hidden_sizes=[128, 256, 512, 1024], depths=[1, 1, 1, 1]),
    "ast": _hf_inputs("ASTConfig", "ASTModel", ("input_values",), _randn(2, 64, 32),
                      num_mel_bins=32, max_length=64, patch_size=8, frequency_stride=8,
                      time_stride=8, **_NO_VOCAB),
    # the decoded audio: with random weights every code is 0, so the codes check nothing
    "encodec": _hf_inputs("EncodecConfig", "EncodecModel", ("input_values",), _randn(2, 1, 960),
                          output="audio_values", num_filters=8, upsampling_ratios=[4, 4], hidden_size=32,
                          num_lstm_layers=1, codebook_size=64, target_bandwidths=[1.5],
                          sampling_rate=4000),
    "patchtst": _hf_inputs("PatchTSTConfig", "PatchTSTModel", ("past_values",), _randn(2, 64, 3),
                           num_input_channels=3, context_length=64, patch_length=8,
                           patch_stride=8, d_model=32, num_attention_heads=4,
                           num_hidden_layers=2, ffn_dim=64),
}


def _series(config: str, model: str, **cfg):
    """A Hugging Face time-series transformer (TimeSeriesTransformer, Informer, Autoformer):
    one variable, context 16 and 3 lags (19 past steps), 8 future steps, one time feature; the
    decoder's last hidden state out."""
    def make():
        import torch

        return (torch.randn(2, 19), torch.randn(2, 19, 1), torch.ones(2, 19), torch.randn(2, 8),
                torch.randn(2, 8, 1))

    return _hf_inputs(config, model, ("past_values", "past_time_features", "past_observed_mask",
                                      "future_values", "future_time_features"), make,
                      prediction_length=8, context_length=16, lags_sequence=[1, 2, 3],
                      num_time_features=1, d_model=32, encoder_layers=2, decoder_layers=2,
                      encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                      decoder_ffn_dim=32, use_cache=False, **cfg)


def _ints(*shape, high: int = 1000):
    return lambda: (__import__("torch").randint(0, high, shape),)


def _tokens_boxes():  # Bros: token ids and their boxes (x0, y0, x1, y1 in [0, 1])
    import torch

    xy = torch.rand(2, 16, 2) * 0.5
    return torch.randint(0, 1000, (2, 16)), torch.cat([xy, xy + 0.25], -1)


def _frames(model):
    """A video as (batch, 4 frames, channels, height, width) to a model that takes the frames
    as one batch (X-CLIP's vision tower, whose layers regroup them by 4)."""
    build, _ = model

    def wrapped():
        import torch

        class Frames(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(x.flatten(0, 1))

        return Frames(build())

    return wrapped, _randn(2, 4, 3, 32, 32)


_DECODER = dict(num_key_value_heads=2, use_cache=False, **TINY)

# The sixth sweep (2026-12-06): kinds the lists above and the zoo lack: time-series transformers
# (Autoformer's FFT autocorrelation, Informer's distilling convolutions), video transformers (3-D
# tubelet patches, divided space-time attention), speech encoders (WavLM's gated relative
# positions, SEW-D's disentangled attention, the Conformer), multimodal towers, document models,
# depth and segmentation heads, and decoders not yet tried. (ELECTRA, DeBERTa-v2, BLOOM, Qwen2,
# Mistral, DLA-34 and HaloNet are in the zoo already; the brief's other timm CNNs are in FOURTH.)
SIXTH = {
    # timm
    "vovnet39a": _timm("vovnet39a", cnn=True),
    "cspdarknet53": _timm("cspdarknet53", cnn=True),
    "ghostnetv3_100": _timm("ghostnetv3_100", cnn=True),
    "sebotnet33ts_256": _timm("sebotnet33ts_256", 256),
    "nest_tiny": _timm("nest_tiny", 224),
    "tnt_s_patch16_224": _timm("tnt_s_patch16_224", 224),
    "shvit_s1": _timm("shvit_s1", 224),
    # time series
    "time_series_transformer": _series("TimeSeriesTransformerConfig",
                                       "TimeSeriesTransformerModel"),
    # (ProbSparse attention samples keys with torch.randint on every call: full attention)
    "informer": _series("InformerConfig", "InformerModel", attention_type="full", distil=True),
    "autoformer": _series("AutoformerConfig", "AutoformerModel", moving_average=5,
                          autocorrelation_factor=2),
    # video: (batch, frames, channels, height, width)
    "videomae": _hf_inputs("VideoMAEConfig", "VideoMAEModel", ("pixel_values",),
                           _randn(2, 4, 3, 32, 32), image_size=32, patch_size=8, num_frames=4,
                           tubelet_size=2, **_NO_VOCAB),
    "timesformer": _hf_inputs("TimesformerConfig", "TimesformerModel", ("pixel_values",),
                              _randn(2, 4, 3, 32, 32), image_size=32, patch_size=8,
                              num_frames=4, **_NO_VOCAB),
    # speech (800 samples of raw audio)
    "wavlm": _audio("WavLMConfig", "WavLMModel", num_buckets=32, max_bucket_distance=64,
                    **_CONV_AUDIO),
    "sew_d": _audio("SEWDConfig", "SEWDModel", squeeze_factor=2, position_buckets=16,
                    max_position_embeddings=64, **_CONV_AUDIO),
    "unispeech_sat": _audio("UniSpeechSatConfig", "UniSpeechSatModel", **_CONV_AUDIO),
    "wav2vec2_conformer": _audio("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerModel",
                                 position_embeddings_type="relative",
                                 conv_depthwise_kernel_size=7, **_CONV_AUDIO),
    "speecht5_asr": _hf_inputs(
        "SpeechT5Config", "SpeechT5ForSpeechToText", ("input_values", "decoder_input_ids"),
        lambda: (__import__("torch").randn(2, 800), __import__("torch").randint(0, 1000, (2, 8))),
        hidden_size=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000,
        conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, use_cache=False),
    # multimodal towers
    "owlvit_vision": _hf("OwlViTVisionConfig", "OwlViTVisionModel", "image32", image_size=32,
                         patch_size=8, **_NO_VOCAB),
    "groupvit_vision": _hf("GroupViTVisionConfig", "GroupViTVisionModel", "image32",
                           image_size=32, patch_size=8, hidden_size=64, intermediate_size=128,
                           num_attention_heads=4, depths=[1, 1, 1], num_group_tokens=[8, 4, 0],
                           num_output_groups=[8, 4, 4], num_hidden_layers=3),
    "blip_vision": _hf("BlipVisionConfig", "BlipVisionModel", "image32", image_size=32,
                       patch_size=8, **_NO_VOCAB),
    "clap_audio": _hf_inputs("ClapAudioConfig", "ClapAudioModel", ("input_features",),
                             _randn(2, 1, 64, 16), spec_size=64, num_mel_bins=16, patch_size=4,
                             patch_stride=(4, 4), window_size=4, hidden_size=64,
                             patch_embeds_hidden_size=16, depths=[1, 1],
                             num_attention_heads=[2, 4], num_hidden_layers=2),
    "xclip_vision": _frames(_hf("XCLIPVisionConfig", "XCLIPVisionModel", "image32",
                                image_size=32, patch_size=8, num_frames=4, **_NO_VOCAB)),
    # document and character-level text
    # (text only: no image; 4 coordinate and 2 shape embeddings, 4 * 10 + 2 * 12 = 64 wide)
    "layoutlmv3_text": _hf("LayoutLMv3Config", "LayoutLMv3Model", coordinate_size=10,
                           shape_size=12, input_size=32, patch_size=8, visual_embed=False,
                           **TINY),
    "canine": _hf("CanineConfig", "CanineModel", hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=128, num_hash_buckets=512,
                  downsampling_rate=4),
    "perceiver_mlm": _hf_inputs("PerceiverConfig", "PerceiverForMaskedLM", ("inputs",),
                                _ints(2, 16, high=262), d_model=64, d_latents=64,
                                num_latents=16, num_blocks=1, num_self_attends_per_block=2,
                                num_self_attention_heads=4, num_cross_attention_heads=4,
                                qk_channels=64, v_channels=64, max_position_embeddings=16),
    "markuplm": _hf("MarkupLMConfig", "MarkupLMModel", **TINY),
    "bros": _hf_inputs("BrosConfig", "BrosModel", ("input_ids", "bbox"), _tokens_boxes, **TINY),
    # depth and segmentation
    "glpn": _hf("GLPNConfig", "GLPNForDepthEstimation", "image64", num_encoder_blocks=2,
                depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2], decoder_hidden_size=32,
                output="predicted_depth"),
    "upernet_convnext": _hf("UperNetConfig", "UperNetForSemanticSegmentation", "image64",
                            backbone_config={"model_type": "convnext",
                                             "hidden_sizes": [16, 32, 64, 128],
                                             "depths": [1, 1, 1, 1],
                                             "out_features": ["stage1", "stage2", "stage3",
                                                              "stage4"]},
                            hidden_size=32, auxiliary_in_channels=64, use_auxiliary_head=False,
                            num_labels=4, output="logits"),
    # (a tiny Swin backbone; multi-scale deformable attention: grid_sample; the mask logits out)
    "mask2former": _hf("Mask2FormerConfig", "Mask2FormerForUniversalSegmentation", "image64",
                       backbone_config={"model_type": "swin", "image_size": 64, "embed_dim": 16,
                                        "depths": [1, 1, 1, 1], "num_heads": [1, 2, 2, 4],
                                        "window_size": 4,
                                        "out_features": ["stage1", "stage2", "stage3",
                                                         "stage4"]},
                       feature_size=32, mask_feature_size=32, hidden_dim=32,
                       encoder_feedforward_dim=64, encoder_layers=1, decoder_layers=2,
                       num_attention_heads=4, dim_feedforward=64, num_queries=8, num_labels=4,
                       output="masks_queries_logits"),
    # text encoders and decoders
    "deberta": _hf("DebertaConfig", "DebertaModel", relative_attention=True,
                   pos_att_type=["c2p", "p2c"], max_relative_positions=16, **TINY),
    "camembert": _hf("CamembertConfig", "CamembertModel", **TINY),
    "codegen": _hf("CodeGenConfig", "CodeGenModel", n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                   n_positions=64, n_ctx=64, vocab_size=1000, use_cache=False),
    "starcoder2": _hf("Starcoder2Config", "Starcoder2Model", **_DECODER),
    "cohere": _hf("CohereConfig", "CohereModel", **_DECODER),
    "granite": _hf("GraniteConfig", "GraniteModel", embedding_multiplier=2.0,
                   attention_multiplier=0.25, residual_multiplier=0.5, **_DECODER),
}
MODELS.update(THIRD)
MODELS.update(FOURTH)
MODELS.update(FIFTH)
MODELS.update(SIXTH)
# the sweeps that try dynamo=True first and batch 1 too
LATER = set(THIRD) | set(FOURTH) | set(FIFTH) | set(SIXTH)
SETS = {"first": FIRST, "third": list(THIRD), "fourth": list(FOURTH), "fifth": list(FIFTH),
        "sixth": list(SIXTH)}
# The package each model needs: a model whose package is missing is skipped, saying so.
PACKAGES = {**{n: "torchvision" for n in FIRST}, **{n: "timm" for n in LATER}}
PACKAGES.update({n: "transformers" for n in FIRST + list(THIRD) + list(FIFTH) + list(SIXTH)
                 if MODELS[n][0].__qualname__.startswith(("_hf", "_frames"))})


# --- one model, one way (in a child process) ----------------------------------------------------

def _setup():
    sys.path.insert(0, str(REPO / "python"))
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import torch

    torch.manual_seed(0)
    build, make = MODELS[_setup.name]
    model = build().eval()
    import torch_models as tm

    args = make()
    # Batch-norm statistics from the model's own activations on 16 inputs (as the zoo test: from
    # 2, Inception-v3's eager float32 output was 1.2e-4 off its float64 one).
    calib = tuple(torch.randn(16, *a.shape[1:]) for a in args) \
        if all(a.is_floating_point() for a in args) else None
    try:
        tm.randomize_(model, calib)
    except Exception:  # noqa: BLE001 - detectors train differently; their own init stays
        tm.randomize_(model)
    return torch, model.eval(), args


def _float64(model, args):
    """The eager output in float64 (None where the model does not run in it): the yardstick for
    telling rounding a model amplifies from a wrong result."""
    import copy

    import torch

    if _setup.name in DETECTORS:
        return None
    try:
        m64 = copy.deepcopy(model).double()
        with torch.no_grad():
            out = m64(*(a.double() if a.is_floating_point() else a for a in args))
        return [x.float() if x.is_floating_point() else x for x in _leaves(out)]
    except Exception:  # noqa: BLE001 - then 1e-4 alone decides
        return None


def _leaves(out) -> list:
    import torch
    import torch.utils._pytree as pytree

    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


def _rel(got, want) -> float:
    import numpy as np

    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"shape {list(got.shape)} vs {list(want.shape)}")
    if want.size == 0:
        return 0.0
    scale = np.abs(want).max()
    err = np.abs(got - want).max()
    if not np.isfinite(err):
        return float("inf")
    return float(err / scale) if scale > 0 else float(err)


def _median_ms(fn, budget: float = 1.0) -> float:
    """The median time of `fn` in ms: one warm-up call, then as many as fit `budget` seconds
    (3 to 20)."""
    import statistics

    fn()
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    times = [once]
    for _ in range(max(2, min(19, int(budget / max(once, 1e-6))))):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e3, 3)


def _reference_ops(compiled) -> list[str]:
    """The ops that ran on the reference interpreter instead of a CPU kernel."""
    return sorted({op for op, backend in compiled.node_backends if backend == "reference"})


def way_optimize(name: str) -> dict:
    """Level 2 (and 3 for CNNs), batch 2 and batch 1 from one compile (the batch is symbolic);
    eager and PyPTO timed at batch 2 when --time is on (set by the driver)."""
    _setup.name = name
    torch, model, args = _setup()
    import pypto

    levels = (2, 3) if name in CNNS else (2,)
    batches = (2, 1) if name in LATER else (2,)
    with torch.no_grad():
        wants = {b: _leaves(model(*(a[:b] for a in args))) for b in batches}
    want = wants[2]
    result, errs, fast = {}, {}, None
    for level in levels:
        fast = pypto.optimize(model, example_inputs=args, level=level)
        for b in batches:
            got = _leaves(fast(*(a[:b] for a in args)))
            if len(got) != len(wants[b]):
                raise AssertionError(f"level {level}, batch {b}: {len(got)} outputs, eager has "
                                     f"{len(wants[b])}")
            errs[f"L{level}b{b}"] = _worst(got, wants[b])
            if b == 2 and errs[f"L{level}b{b}"] >= max(errs.values()):
                worst = got
        result.setdefault("reference_ops", [])
        result["reference_ops"] = sorted(set(result["reference_ops"]) |
                                         set(_reference_ops(fast.compiled)))
        if os.environ.get("PTO_UNSEEN_TIME"):
            with torch.no_grad():
                result[f"ms_L{level}"] = _median_ms(lambda: fast(*args))
    if os.environ.get("PTO_UNSEEN_TIME"):
        with torch.no_grad():
            result["ms_eager"] = _median_ms(lambda: model(*args))
    return {"err": max(errs.values()), "errs": errs, "empty": all(w.numel() == 0 for w in want),
            "constant": all(w.numel() > 0 and bool((w == w.flatten()[0]).all()) for w in want),
            **result, **_against_float64(worst, want, _float64(model, args))}


def _worst(got, want) -> float:
    return max((_rel(g, w) for g, w in zip(got, want)), default=0.0)


def _against_float64(got, peer, want64) -> dict:
    """got's and the peer's (eager float32 or onnxruntime) errors against eager float64."""
    if want64 is None or len(want64) != len(got):
        return {}
    try:
        return {"err64": _worst(got, want64), "peer_err64": _worst(peer, want64)}
    except AssertionError:  # shapes differ (data-dependent outputs): no verdict from float64
        return {}


def _against_eager(got, want, eager) -> dict:
    """PyPTO's and onnxruntime's errors against eager PyTorch (the same model in float32): when
    onnxruntime and PyPTO disagree, which of them eager sides with."""
    try:
        if len(eager) == len(got):
            return {"eager_err": _worst(got, eager), "peer_eager_err": _worst(want, eager)}
    except AssertionError:  # a different number of detections
        pass
    return {}


def way_compile(name: str) -> dict:
    """torch.compile(backend="pypto"): what a model pypto.optimize cannot capture runs as."""
    _setup.name = name
    torch, model, args = _setup()
    import pypto
    import pypto.dynamo

    with torch.no_grad():
        want = _leaves(model(*args))
        got = _leaves(torch.compile(model, backend="pypto")(*args))
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} outputs, eager has {len(want)}")
    st = pypto.dynamo.stats()
    return {"err": _worst(got, want), "empty": all(w.numel() == 0 for w in want),
            "pieces": st["pypto_pieces"], "fallback_ops": st["fallback_ops"],
            **_against_float64(got, want, _float64(model, args))}


def way_onnx(name: str) -> dict:
    _setup.name = name
    torch, model, args = _setup()
    import onnxruntime as ort

    import pypto

    path = os.path.join(tempfile.mkdtemp(), f"{name}.onnx")
    # The first sweep tried dynamo=False first, the later ones dynamo=True (what torch recommends).
    tries = [("dynamo=False", dict(dynamo=False, opset_version=17)),
             ("dynamo=True", dict(dynamo=True, opset_version=18))]
    if name in LATER:
        tries.reverse()
    failures = []
    for exporter, options in tries:
        try:
            torch.onnx.export(model, args, path, **options)
            break
        except Exception as e:  # noqa: BLE001 - then the other exporter
            lines = str(e).strip().splitlines()
            failures.append(f"{exporter}: {type(e).__name__}: {lines[0][:150] if lines else ''}")
    else:
        raise RuntimeError("export: " + " / ".join(failures)) from None
    if failures:
        exporter += f" ({failures[0]})"
    opts = ort.SessionOptions()
    if os.environ.get("PTO_UNSEEN_TIME"):
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    want = sess.run(None, feeds)
    errs, worst, reference_ops, timings = {}, None, [], {}
    for level in (2, 3):
        exe = pypto.onnx.load(path, level=level)
        got = exe(*[a.numpy() for a in args][:len(exe.input_names)])
        got = list(got) if isinstance(got, tuple) else [got]
        if len(got) != len(want):
            raise AssertionError(f"level {level}: {len(got)} outputs, onnxruntime has {len(want)}")
        errs[level] = _worst(got, want)
        worst = got if errs[level] >= max(errs.values()) else worst
        reference_ops = sorted(set(reference_ops) | set(_reference_ops(exe._compiled)))
        if os.environ.get("PTO_UNSEEN_TIME"):
            inputs = [a.numpy() for a in args][:len(exe.input_names)]
            timings[f"ms_L{level}"] = _median_ms(lambda: exe(*inputs))
    if os.environ.get("PTO_UNSEEN_TIME"):
        timings["ms_ort"] = _median_ms(lambda: sess.run(None, feeds))
    with torch.no_grad():
        eager = [x.numpy() for x in _leaves(model(*args))]
    return {"err": max(errs.values()), "exporter": exporter, "reference_ops": reference_ops,
            **timings,
            **_against_float64(worst, want, _float64(model, args)),
            **_against_eager(worst, want, eager),
            "shapes": [list(w.shape) for w in want][:4], "empty": all(w.size == 0 for w in want)}


WAYS = {"optimize": way_optimize, "onnx": way_onnx, "compile": way_compile}


def child(name: str, way: str) -> dict:
    t0 = time.perf_counter()
    result = {"model": name, "way": way}
    if os.environ.get("PTO_UNSEEN_TIME"):  # one thread each: PyTorch, PyPTO, onnxruntime
        import torch

        torch.set_num_threads(1)
        sys.path.insert(0, str(REPO / "python"))
        import pypto

        pypto.set_num_threads(1)
    try:
        result.update(WAYS[way](name))
        result["status"] = "works" if result["err"] <= TOLERANCE else "wrong"
        if result["status"] == "wrong" and result.get("peer_eager_err", 0) > TOLERANCE:
            # onnxruntime is off eager PyTorch itself: eager decides (detectors: near ties)
            result["status"] = "works" if result["eager_err"] <= TOLERANCE else "undecided"
        if result["status"] == "wrong" and "err64" in result and \
                result["err64"] <= ROUNDING * max(result["peer_err64"], TOLERANCE / ROUNDING):
            result["status"] = "rounding"  # the model amplifies float32 rounding, eager's too
        if result.pop("empty", False):
            result["status"] = "empty"  # nothing to compare: not a pass
        elif result.pop("constant", False):
            result["status"] = "constant"  # every output one value: not a pass either
    except Exception as e:  # noqa: BLE001 - recorded
        msg = str(e).strip().splitlines()
        result["status"] = "error"
        result["error"] = f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


# --- the driver ---------------------------------------------------------------------------------

def missing_package(name: str) -> str | None:
    """Why `name` cannot run here (its package is not installed), or None."""
    import importlib.util

    package = PACKAGES.get(name)
    if package and importlib.util.find_spec(package) is None:
        return f"skipped: {name} needs the package {package!r}, which is not installed " \
               f"(pip install {package})"
    return None


def run_one(name: str, way: str, timeout: float) -> dict:
    skip = missing_package(name)
    if skip:
        return {"model": name, "way": way, "status": "skipped", "error": skip}
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        p = subprocess.run([sys.executable, __file__, "--child", name, way], capture_output=True,
                           text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"model": name, "way": way, "status": "timeout", "seconds": timeout}
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"model": name, "way": way, "status": "error",
            "error": f"crash (exit {p.returncode}): {tail[:200]}"}


def cell(r: dict) -> str:
    if r.get("peer_eager_err", 0) > TOLERANCE and r["status"] in ("works", "undecided"):
        return (f"{r['status']}: {r['eager_err']:.1e} from eager, onnxruntime "
                f"{r['err']:.1e} from PyPTO and {r['peer_eager_err']:.1e} from eager")
    if r["status"] in ("works", "wrong"):
        text = f"{r['status']} ({r['err']:.1e})"
        if r.get("fallback_ops"):
            text += f", in PyTorch: {' '.join(r['fallback_ops'])}"
        if r.get("exporter", "").startswith("dynamo=False") and r["model"] in LATER:
            text += " (dynamo=False)"
        elif r.get("exporter", "").startswith("dynamo=True") and r["model"] not in LATER:
            text += " (dynamo)"
        return text + _timings(r)
    if r["status"] == "rounding":
        return (f"rounding ({r['err']:.1e}; vs float64 {r['err64']:.1e}, peer "
                f"{r['peer_err64']:.1e})") + _timings(r)
    if r["status"] == "empty":
        return "empty output (nothing compared)"
    if r["status"] == "constant":
        return "constant output (every element equal: nothing compared)"
    if r["status"] == "skipped":
        return r["error"]
    if r["status"] == "timeout":
        return f"timeout ({r['seconds']:.0f} s)"
    error = r.get("error", "").replace("|", "/")
    return "error: " + (error if len(error) <= 160 else error[:160] + "...")


def _timings(r: dict) -> str:
    """'; L2 / L3 ms vs eager (or ORT) ms', and the ops left to the reference interpreter."""
    levels = [r[k] for k in ("ms_L2", "ms_L3") if k in r]
    peer = r.get("ms_eager", r.get("ms_ort"))
    text = ""
    if levels and peer:
        text += (f"; {' / '.join(f'{t:.2f}' for t in levels)} ms vs "
                 f"{'eager' if 'ms_eager' in r else 'ORT'} {peer:.2f}")
        ratio = min(levels) / peer
        limit = 1.0 if "ms_eager" in r else 1.5
        if ratio > limit:
            text += f" (**{ratio:.2f}x**)"
    if r.get("reference_ops"):
        text += f"; on the reference: {' '.join(r['reference_ops'])}"
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--models", help="comma-separated (default: all, or those of --set)")
    ap.add_argument("--set", choices=sorted(SETS), help="one sweep's models: first (the "
                    "torchvision / transformers list of the first sweep), third (timm and "
                    "transformers, 2026-12-05 afternoon), fourth (timm, 2026-12-06), fifth "
                    "(timm and transformers, 2026-12-06) or sixth (timm and transformers: time "
                    "series, video, speech, multimodal towers, documents, 2026-12-06)")
    ap.add_argument("--time", action="store_true", help="one thread everywhere, and time eager "
                    "/ onnxruntime and PyPTO (median ms at batch 2)")
    ap.add_argument("--ways", default="optimize,onnx")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--table", nargs="+", metavar="JSONL", help="only print the table of "
                    "earlier --json files (a later row of a model and way replaces an earlier)")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="children at a time")
    ap.add_argument("--json", help="write the results here too (appends per row)")
    a = ap.parse_args()
    if a.child:
        print(MARK + json.dumps(child(*a.child)), flush=True)
        return
    if a.table:  # the last row of each model and way in these files
        rows = {}
        for path in a.table:
            for line in open(path):
                r = json.loads(line)
                rows.setdefault(r["model"], {})[r["way"]] = r
        print_table({n: rows[n] for n in MODELS if n in rows})
        return
    if a.time:
        os.environ["PTO_UNSEEN_TIME"] = "1"
    names = a.models.split(",") if a.models else SETS[a.set] if a.set else list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s): {', '.join(unknown)} (known: {', '.join(MODELS)})")
    rows: dict = {name: {} for name in names}

    def one(job):
        r = run_one(*job, a.timeout)
        rows[job[0]][job[1]] = r
        print(f"{job[0]:40s} {job[1]:9s} {cell(r)}  [{r.get('seconds', 0)} s]", flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(r) + "\n")

    jobs = [(name, way) for name in names for way in a.ways.split(",")]
    with ThreadPoolExecutor(a.jobs) as pool:
        list(pool.map(one, jobs))
    print()
    print_table(rows)


def print_table(rows: dict) -> None:
    ways = [w for w in WAYS if any(w in r for r in rows.values())]
    heads = {"optimize": "optimize vs eager", "onnx": "onnx (level 2, 3) vs onnxruntime",
             "compile": "torch.compile vs eager"}
    print("| model | " + " | ".join(heads[w] for w in ways) + " |")
    print("|" + "---|" * (len(ways) + 1))
    for name, done in rows.items():
        print(f"| {name} | " + " | ".join(cell(done[w]) if w in done else "-" for w in ways)
              + " |")


if __name__ == "__main__":
    main()
