"""Attention as one op: RecognizeAttention finds it in the graphs torch.export makes of the
transformer families users run (BERT with a padding mask, GPT-2 causal with padding, Llama with
grouped KV heads and rotary embeddings, T5's position bias without scaling, torchvision's ViT;
the encoder-decoders Whisper and T5 with their decoders' causal self-attention and their
cross-attention; SDPA with float, boolean and grouped-head masks), the CPU kernel runs it, and the
outputs match eager PyTorch. Tiny configs, random weights."""

import re

import numpy as np
import pytest
import torch

import pypto

transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")


def _ids(batch=2, seq=12):
    torch.manual_seed(1)
    return torch.randint(0, 1000, (batch, seq))


def _padding(batch=2, seq=12):
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, 8:] = 0  # the second sequence is padded: its last keys are masked
    return mask


def _vit():
    m = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                             num_heads=4, hidden_dim=64, mlp_dim=128)
    torch.nn.init.normal_(m.heads.head.weight, std=0.02)  # torchvision zeroes the head
    return m


# name -> (model factory, inputs); every model has two attention layers.
MODELS = {
    "bert (padding mask)": (
        lambda: transformers.BertModel(transformers.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)),
        lambda: (_ids(), _padding())),
    "gpt2 (causal + padding)": (
        lambda: transformers.GPT2Model(transformers.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, use_cache=False)),
        lambda: (_ids(), None, _padding())),
    "llama (grouped KV heads, rotary)": (
        lambda: transformers.LlamaModel(transformers.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, use_cache=False)),
        lambda: (_ids(),)),
    "t5 encoder (position bias, no scale)": (
        lambda: transformers.T5EncoderModel(transformers.T5Config(
            d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=1000)),
        lambda: (_ids(),)),
    "vit": (_vit, lambda: (torch.randn(2, 3, 32, 32),)),
}


def _main(out):
    if isinstance(out, torch.Tensor):
        return out
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def _optimized(factory, inputs):
    """The model `factory` makes, optimized at level 2 and run on `inputs()`: its main output
    equals eager's."""
    torch.manual_seed(0)
    model = factory().eval()
    args = inputs()
    with torch.inference_mode():
        want = _main(model(*args))
    fast = pypto.optimize(model, level=2)
    torch.testing.assert_close(_main(fast(*args)), want, rtol=1e-4, atol=1e-5)
    return fast


def _fired(compiled):
    """How often each pass rule fired, over the whole pipeline."""
    fired = {}
    for report in compiled.pass_report:
        for rule, count in report["fired"].items():
            fired[rule] = fired.get(rule, 0) + count
    return fired


@pytest.mark.parametrize("name", list(MODELS))
def test_attention_is_one_op_and_matches_eager(name):
    fast = _optimized(*MODELS[name])
    fired = _fired(fast.compiled)
    assert fired.get("RecognizeAttention/Attention", 0) == 2, fired
    # Llama's repeat_kv copies of K and V are folded: Attention reads the 2 K/V heads itself.
    assert fired.get("RecognizeAttention/GroupedHeads", 0) == (2 if "grouped" in name else 0), fired
    ops = [step["rule"] or step["op"] for step in fast.compiled.steps]
    assert ops.count("Attention") == 2, ops


def test_disabling_the_pass_keeps_the_primitives(monkeypatch):
    factory, inputs = MODELS["bert (padding mask)"]
    torch.manual_seed(0)
    model = factory().eval()
    args = inputs()
    with torch.inference_mode():
        want = _main(model(*args))
    fused = pypto.optimize(model, level=2)
    fused(*args)
    monkeypatch.setenv("PTO_DISABLE_PASSES", "RecognizeAttention")
    plain = pypto.optimize(model, level=2)
    torch.testing.assert_close(_main(plain(*args)), want, rtol=1e-4, atol=1e-5)
    assert all(step["op"] != "Attention" for step in plain.compiled.steps)
    assert plain.stats()["kernels"] > fused.stats()["kernels"]
    monkeypatch.setenv("PTO_DISABLE_PASSES", "NoSuchPass")
    with pytest.raises(Exception, match="unknown pass 'NoSuchPass'"):
        pypto.optimize(model, level=2)(*args)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_with_grouped_heads_reads_the_kv_heads(causal):
    """F.scaled_dot_product_attention(enable_gqa=True): one Attention op on the 2 K/V heads (no
    repeated copies in the graph), equal to eager."""
    import torch.nn.functional as F

    class Gqa(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 9, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    fast = pypto.optimize(Gqa().eval(), example_inputs=(q, k, v))
    with torch.inference_mode():
        want = Gqa()(q, k, v)
    torch.testing.assert_close(fast(q, k, v), want, rtol=1e-4, atol=1e-5)
    steps = [step["rule"] or step["op"] for step in fast.compiled.steps]
    assert steps == ["Attention"], steps


def _whisper():
    return transformers.WhisperModel(transformers.WhisperConfig(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
        max_source_positions=10, max_target_positions=16, vocab_size=1000, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, use_cache=False))


def _t5():
    return transformers.T5Model(transformers.T5Config(
        d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=16,
        vocab_size=1000, use_cache=False))


# name -> (model factory, inputs, source length the encoder's attention sees); two layers each
# of encoder self-attention, decoder self-attention and cross-attention, target length 7.
ENCODER_DECODERS = {
    # 20 mel frames, halved by the encoder's strided convolution.
    "whisper": (_whisper, lambda: (torch.randn(2, 16, 20), None, _ids(seq=7)), 10),
    "t5 (padding mask, position bias)": (_t5, lambda: (_ids(), _padding(), _ids(seq=7)), 12),
}


def _attention_nodes(compiled):
    """The optimized graph's Attention nodes, read from its printed form: name -> (query length,
    key length, has a mask, is_causal). Q and K are 4-D [B, H, S, D] or, once FoldAttentionHeads
    read the heads in place, 3-D [B, S, H * D]."""
    text = str(compiled.graph)
    dims = dict(re.findall(r"%(\S+): \w+\[([^\]]*)\]", text))
    node = r"%(\S+): \w+\[[^\]]*\] = Attention\(([^)]*)\)( \{[^}]*\})?"
    nodes = {}
    for name, args, attrs in re.findall(node, text):
        operands = [a.strip().lstrip("%") for a in args.split(",")]
        q, k = (dims[x].split(", ") for x in operands[:2])
        nodes[name] = (q[-2], k[-2], len(operands) > 3, "is_causal=1" in attrs)
    return nodes


def _kind(name):
    if "decoder" not in name:
        return "encoder self"
    return "cross" if "encoder_attn" in name or "EncDecAttention" in name else "decoder self"


@pytest.mark.parametrize("name", list(ENCODER_DECODERS))
def test_encoder_decoder_attention_of_every_kind_is_one_op(name):
    """Encoder self-attention, the decoder's causal self-attention (its causal mask is a boolean
    or additive mask computed from the positions) and cross-attention (7 queries over the
    encoder's keys) are each one Attention op on the CPU backend; outputs equal eager."""
    factory, inputs, source = ENCODER_DECODERS[name]
    fast = _optimized(factory, inputs)
    kinds = {}
    for node, (sq, kv, masked, causal) in _attention_nodes(fast.compiled).items():
        kinds.setdefault(_kind(node), []).append((int(sq), int(kv), masked or causal))
    t5 = name.startswith("t5")
    assert kinds == {
        "encoder self": [(source, source, t5)] * 2,  # T5: position bias plus the padding mask
        "decoder self": [(7, 7, True)] * 2,
        "cross": [(7, source, t5)] * 2,
    }, kinds
    steps = [(step["op"], step["backend"]) for step in fast.compiled.steps]
    assert steps.count(("Attention", "cpu")) == 6, steps
    assert not any(op in ("Softmax", "MatMul") for op, _ in steps), steps


@pytest.mark.parametrize("mask", ["float", "bool", "bool 2-D"])
@pytest.mark.parametrize("grouped", [False, True])
def test_sdpa_with_an_attention_mask_is_one_op(mask, grouped):
    """F.scaled_dot_product_attention(attn_mask=...) with an additive float mask, a boolean mask
    (true = attend) broadcast over heads, or a [q, kv] boolean mask; with enable_gqa the 2 K/V heads
    are read directly. 9 queries over 11 keys. One Attention op with the mask, equal to eager."""
    import torch.nn.functional as F

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=grouped)

    torch.manual_seed(0)
    heads = 2 if grouped else 8
    q, k, v = torch.randn(2, 8, 9, 16), torch.randn(2, heads, 11, 16), torch.randn(2, heads, 11, 16)
    if mask == "float":
        m = torch.randn(2, 8, 9, 11)
    else:
        m = torch.rand(2, 1, 9, 11) > 0.4 if mask == "bool" else torch.rand(9, 11) > 0.4
        m[..., 3] = True  # every query sees a key (a fully masked row is NaN in eager)
    fast = pypto.optimize(Sdpa().eval(), example_inputs=(q, k, v, m))
    with torch.inference_mode():
        want = Sdpa()(q, k, v, m)
    torch.testing.assert_close(fast(q, k, v, m), want, rtol=1e-4, atol=1e-5)
    steps = [(step["rule"] or step["op"], step["backend"]) for step in fast.compiled.steps]
    assert steps == [("Attention", "cpu")], steps
    assert list(_attention_nodes(fast.compiled).values()) == [("9", "11", True, False)]
    fired = _fired(fast.compiled)
    assert fired.get("RecognizeAttention/GroupedHeads", 0) == (1 if grouped else 0), fired


def test_position_bias_then_padding_mask_is_one_op():
    """Scores plus a learned position bias, then plus the padding mask, as two Adds (T5's
    attention written out by hand): one Attention whose mask is bias + padding."""

    class BiasThenPadding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.randn(1, 4, 9, 9))

        def forward(self, q, k, v, padding):
            s = q @ k.transpose(-1, -2) / 4 + self.bias + padding
            return torch.softmax(s, dim=-1) @ v

    torch.manual_seed(0)
    model = BiasThenPadding().eval()
    q, k, v = torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16)
    padding = torch.zeros(2, 1, 1, 9)
    padding[1, ..., 6:] = torch.finfo(torch.float32).min  # as Hugging Face masks padded keys
    fast = pypto.optimize(model, example_inputs=(q, k, v, padding))
    with torch.inference_mode():
        want = model(q, k, v, padding)
    torch.testing.assert_close(fast(q, k, v, padding), want, rtol=1e-4, atol=1e-5)
    steps = [(step["rule"] or step["op"], step["backend"]) for step in fast.compiled.steps]
    assert ("Attention", "cpu") in steps and len(steps) <= 2, steps  # and the masks' sum
    assert list(_attention_nodes(fast.compiled).values()) == [("9", "9", True, False)]


def _sdpa_float64(q, k, v, mask, causal):
    """torch's math kernel in float64: the reference, independent of PyPTO's interpreter."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    if causal:
        lower = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
        mask = lower if mask is None else mask & lower
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                              attn_mask=mask).float()


def _expect_sdpa_matches_float64(q, k, v, mask, causal):
    """pypto.optimize of SDPA (grouped heads allowed; `mask` None or boolean, not with causal) is
    one Attention op and equals torch's float64 math kernel."""
    import torch.nn.functional as F

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v, *mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[0] if mask else None,
                                                  is_causal=causal, enable_gqa=True)

    args = (q, k, v) if mask is None else (q, k, v, mask)
    fast = pypto.optimize(Sdpa().eval(), example_inputs=args)
    want = _sdpa_float64(q, k, v, mask, causal)
    torch.testing.assert_close(fast(*args), want, rtol=1e-4, atol=1e-5)
    steps = [step["rule"] or step["op"] for step in fast.compiled.steps]
    assert steps == ["Attention"], steps


@pytest.mark.parametrize("tiles", ["", "5,37"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq,heads,kv_heads", [(600, 4, 4), (1100, 4, 1), (129, 8, 2)])
def test_sdpa_across_key_chunks_matches_float64(seq, heads, kv_heads, causal, tiles, monkeypatch):
    """Sequences that span several of the kernel's key chunks and query tasks (planned tiles, and
    odd ones through PTO_ATTENTION_TILES), grouped heads; causal, or a padding mask that hides the
    last third of the keys of one batch item: equal to torch's float64 math kernel."""
    if tiles:
        monkeypatch.setenv("PTO_ATTENTION_TILES", tiles)
    torch.manual_seed(0)
    q = torch.randn(2, heads, seq, 64)
    k, v = torch.randn(2, kv_heads, seq, 64), torch.randn(2, kv_heads, seq, 64)
    mask = None
    if not causal:  # torch's is_causal takes no mask
        mask = torch.ones(2, 1, 1, seq, dtype=torch.bool)
        mask[1, ..., seq - seq // 3:] = False
    _expect_sdpa_matches_float64(q, k, v, mask, causal)


@pytest.mark.parametrize("tiles", ["", "0,0,3"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("queries,heads,kv_heads,head", [(1, 12, 12, 64), (1, 8, 2, 128),
                                                         (2, 4, 1, 80)])
def test_sdpa_decode_matches_float64(queries, heads, kv_heads, head, causal, tiles, monkeypatch):
    """Decode steps (one or two queries against a 4097-long K/V cache; the decode kernel), grouped
    heads and MQA, planned and forced split-K: equal to torch's float64 math kernel, causal
    (top-left: the queries see the first keys only) or with a padding mask on one batch item."""
    if tiles:
        monkeypatch.setenv("PTO_ATTENTION_TILES", tiles)
    torch.manual_seed(1)
    length = 4097
    q = torch.randn(2, heads, queries, head)
    k, v = torch.randn(2, kv_heads, length, head), torch.randn(2, kv_heads, length, head)
    mask = None
    if not causal:
        mask = torch.ones(2, 1, 1, length, dtype=torch.bool)
        mask[1, ..., 3000:] = False
    _expect_sdpa_matches_float64(q, k, v, mask, causal)


def test_mask_broadcast_over_the_keys_matches_eager_and_exports(tmp_path):
    """SDPA with a float mask of one column ([b, 1, q, 1]: the same bias for every key, which
    torch broadcasts) is one Attention with PyPTO's mask_broadcast (ONNX's Attention would pad
    the short key axis as masked instead); equal to eager. Exported, the attribute becomes an
    Expand of the mask to the keys' count, and the file runs to the same values."""
    import torch.nn.functional as F

    class Biased(torch.nn.Module):
        def forward(self, q, k, v, bias):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    torch.manual_seed(0)
    args = (torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8),
            torch.randn(2, 1, 5, 1))
    with torch.inference_mode():
        want = Biased()(*args)
    fast = pypto.optimize(Biased().eval(), example_inputs=args)
    torch.testing.assert_close(fast(*args), want, rtol=1e-4, atol=1e-5)
    assert "mask_broadcast=1" in str(fast.compiled.graph), fast.compiled.graph
    assert [step["rule"] or step["op"] for step in fast.compiled.steps] == ["Attention"]
    path = tmp_path / "biased.onnx"
    pypto.onnx.export(fast, args, path)
    again = pypto.onnx.load(path, level=0)
    assert "mask_broadcast" not in str(again.graph) and "Expand(" in str(again.graph)
    got = again(*(a.numpy() for a in args))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
