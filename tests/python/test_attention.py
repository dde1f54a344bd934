"""Attention as one op: RecognizeAttention finds it in the graphs torch.export makes of the
transformer families users run (BERT with a padding mask, GPT-2 causal with padding, Llama with
grouped KV heads and rotary embeddings, T5's position bias without scaling, torchvision's ViT),
the CPU kernel runs it, and the outputs match eager PyTorch. Tiny configs, random weights."""

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


@pytest.mark.parametrize("name", list(MODELS))
def test_attention_is_one_op_and_matches_eager(name):
    factory, inputs = MODELS[name]
    torch.manual_seed(0)
    model = factory().eval()
    args = inputs()
    with torch.inference_mode():
        want = _main(model(*args))
    fast = pypto.optimize(model, level=2)
    got = _main(fast(*args))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    fired = {}
    for report in fast.compiled.pass_report:
        for rule, count in report["fired"].items():
            fired[rule] = fired.get(rule, 0) + count
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


@pytest.mark.parametrize("tiles", ["", "5,37"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq,heads,kv_heads", [(600, 4, 4), (1100, 4, 1), (129, 8, 2)])
def test_sdpa_across_key_chunks_matches_float64(seq, heads, kv_heads, causal, tiles, monkeypatch):
    """Sequences that span several of the kernel's key chunks and query tasks (planned tiles, and
    odd ones through PTO_ATTENTION_TILES), grouped heads; causal, or a padding mask that hides the
    last third of the keys of one batch item: equal to torch's float64 math kernel."""
    import torch.nn.functional as F

    if tiles:
        monkeypatch.setenv("PTO_ATTENTION_TILES", tiles)

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v, *mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[0] if mask else None,
                                                  is_causal=causal, enable_gqa=True)

    torch.manual_seed(0)
    q = torch.randn(2, heads, seq, 64)
    k, v = torch.randn(2, kv_heads, seq, 64), torch.randn(2, kv_heads, seq, 64)
    mask = None
    if not causal:  # torch's is_causal takes no mask
        mask = torch.ones(2, 1, 1, seq, dtype=torch.bool)
        mask[1, ..., seq - seq // 3:] = False
    args = (q, k, v) if causal else (q, k, v, mask)
    fast = pypto.optimize(Sdpa().eval(), example_inputs=args)
    want = _sdpa_float64(q, k, v, mask, causal)
    torch.testing.assert_close(fast(*args), want, rtol=1e-4, atol=1e-5)
    steps = [step["rule"] or step["op"] for step in fast.compiled.steps]
    assert steps == ["Attention"], steps
