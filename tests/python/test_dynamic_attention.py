"""Attention over symbolic sizes: BERT (padding mask) and GPT-2 (causal and padding) with a
symbolic batch and sequence, captured by pypto.optimize with torch.export Dims and exported to
ONNX with dynamic axes (by both exporters), keep one Attention op per layer, and one compiled
model matches eager PyTorch / onnxruntime at every size, batch 1 and odd lengths included. Tiny
configs, random weights. BERT's Q, K and V projections are one GEMM (MergeSiblingMatMuls) at
symbolic sizes too, which Attention reads in place (FoldAttentionHeads), on and off."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pypto

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

SIZES = [(1, 7), (2, 16), (3, 13)]  # (batch, sequence)


def _bert():
    return transformers.BertModel(transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128))


def _gpt2():
    return transformers.GPT2Model(transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, use_cache=False))


class _Hidden(torch.nn.Module):
    """model(input_ids, attention_mask).last_hidden_state: two tensors in, one out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def _model(factory):
    torch.manual_seed(0)
    return _Hidden(factory()).eval()


def _inputs(batch, seq):
    g = torch.Generator().manual_seed(batch * 100 + seq)
    ids = torch.randint(0, 1000, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq - 3:] = 0  # the last sequence is padded (batch 1: the only one)
    return ids, mask


def _attention_steps(compiled):
    return [s["rule"] or s["op"] for s in compiled.steps].count("Attention")


def _merged_projections(compiled):
    """How many Q/K/V triples MergeSiblingMatMuls made one GEMM (BERT: one a layer; GPT-2's
    c_attn is one already)."""
    return sum(r["fired"].get("MergeSiblingMatMuls/3Products", 0) for r in compiled.pass_report)


@pytest.mark.parametrize("factory", [_bert, _gpt2], ids=["bert", "gpt2"])
def test_optimize_with_symbolic_batch_and_sequence_fuses_attention(factory):
    from torch.export import Dim

    model = _model(factory)
    batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=1, max=512)
    spec = {0: batch, 1: seq}
    fast = pypto.optimize(model, _inputs(2, 12), dynamic_shapes=(spec, spec))
    text = str(fast.compiled.graph)
    assert "i64[batch, seq]" in text and text.count("Attention(") == 2
    assert _merged_projections(fast.compiled) == (2 if factory is _bert else 0)
    for b, s in SIZES:
        args = _inputs(b, s)
        with torch.inference_mode():
            want = model(*args)
        torch.testing.assert_close(fast(*args), want, rtol=1e-4, atol=1e-5)
        assert _attention_steps(fast.compiled) == 2, (b, s)


def _export(model, path, dynamo):
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(model, _inputs(2, 12), str(path), input_names=["input_ids", "mask"],
                      output_names=["y"], dynamic_axes={"input_ids": axes, "mask": axes, "y": axes},
                      dynamo=dynamo)


# Both exporters, both models: one Attention op per layer. The TorchScript exporter's BERT reads
# its positions through a Slice of a [1, 512] buffer to the sequence length (min(512, seq) long,
# which broadcasts with seq to seq); its GPT-2 expands the mask to Where(Equal(Concat(batch, [-1],
# seq, seq), -1), 1, ...), a literal -1 among symbols. The dynamo exporter's GPT-2 mask is
# expanded to Concat(batch, 1, seq, Reshape(seq * batch / batch, [-1])): a shape value too.
EXPORTS = [("bert", True), ("bert", False), ("gpt2", True), ("gpt2", False)]
FACTORIES = {"bert": _bert, "gpt2": _gpt2}


def _kernels(compiled):
    """The fused GEMM, attention and normalization kernels, by rule: what a static graph gets."""
    rules = [s["rule"] or s["op"] for s in compiled.steps]
    return sorted(r for r in rules
                  if r.startswith(("MatMul", "Gemm")) or r in ("Attention", "LayerNormalization"))


@pytest.mark.parametrize("name,dynamo", EXPORTS, ids=["bert-dynamo", "bert-torchscript",
                                                      "gpt2-dynamo", "gpt2-torchscript"])
def test_onnx_export_with_dynamic_axes_matches_onnxruntime(name, dynamo, tmp_path):
    """One compiled model of the file for every (batch, sequence); each equals onnxruntime on the
    same file and eager PyTorch. (The TorchScript export's mask at batch 1 came out wrong: an
    in-place And over a broadcast input of the same aligned size.)"""
    path = tmp_path / f"{name}.onnx"
    model = _model(FACTORIES[name])
    _export(model, path, dynamo)
    exe = pypto.onnx.load(path)
    session = ort.InferenceSession(str(path))
    for b, s in SIZES:
        args = _inputs(b, s)
        ids, mask = (x.numpy() for x in args)
        got = exe(ids, mask)
        want = session.run(None, {"input_ids": ids, "mask": mask})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        with torch.inference_mode():
            np.testing.assert_allclose(got, model(*args).numpy(), rtol=1e-4, atol=1e-5)
        assert _attention_steps(exe._compiled) == 2, (b, s)
    assert _merged_projections(exe._compiled) == (2 if name == "bert" else 0)


def _fired(compiled, rule):
    return sum(r["fired"].get(rule, 0) for r in compiled.pass_report)


@pytest.mark.parametrize("name,dynamo", EXPORTS, ids=["bert-dynamo", "bert-torchscript",
                                                      "gpt2-dynamo", "gpt2-torchscript"])
def test_attention_reading_heads_in_place_matches_onnxruntime(name, dynamo, tmp_path, monkeypatch):
    """FoldAttentionHeads on and off (PTO_DISABLE_PASSES) on one file with symbolic batch and
    sequence: with it each layer's Attention reads Q, K and V, and the merged Q/K/V product
    (BERT's merge, GPT-2's c_attn), in place (3-D, qkv_split) and the head-split copies are gone;
    both equal onnxruntime at every size."""
    path = tmp_path / f"{name}.onnx"
    _export(_model(FACTORIES[name]), path, dynamo)
    folded = pypto.onnx.load(path)
    monkeypatch.setenv("PTO_DISABLE_PASSES", "FoldAttentionHeads")
    apart = pypto.onnx.load(path)
    monkeypatch.delenv("PTO_DISABLE_PASSES")
    session = ort.InferenceSession(str(path))
    for b, s in SIZES:
        ids, mask = (x.numpy() for x in _inputs(b, s))
        want = session.run(None, {"input_ids": ids, "mask": mask})[0]
        np.testing.assert_allclose(folded(ids, mask), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(apart(ids, mask), want, rtol=1e-4, atol=1e-5)
    assert _fired(folded._compiled, "FoldAttentionHeads/Heads") == 2
    assert _fired(folded._compiled, "FoldAttentionHeads/Split") == 2
    assert _fired(apart._compiled, "FoldAttentionHeads/Heads") == 0
    steps = [s["rule"] or s["op"] for s in folded._compiled.steps]
    assert "Split" not in steps and "Transpose" not in steps, steps
    assert len(steps) < len(apart._compiled.steps)
    # The optimized graph exported: qkv_split is written as a Split before the 3-D Attention,
    # which loads back (the Attention keeps the source's opset, which onnxruntime rejects for it:
    # a limit of exporting RecognizeAttention's output, not of this form).
    exported = tmp_path / f"{name}-optimized.onnx"
    pypto.onnx.export(folded, None, exported)
    again = pypto.onnx.load(exported, level=0)
    assert "qkv_split=" not in str(again.graph) and "Split(" in str(again.graph)
    np.testing.assert_allclose(again(ids, mask), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_torchscript_dynamic_export_fuses_like_the_static_one(name, tmp_path):
    """The TorchScript exporter flattens every Linear of a dynamic model to Reshape(x, [-1, K]) ->
    Gemm -> Reshape(Concat(Shape(x)[0], Shape(x)[1], [N])): folded into MatMul on [batch, seq, K]
    like the static export's, so the GEMM kernels get the same epilogues (bias, GELU, residual
    Add) and attention the same one op per layer."""
    model = _model(FACTORIES[name])
    dynamic, static = tmp_path / "dynamic.onnx", tmp_path / "static.onnx"
    _export(model, dynamic, dynamo=False)
    torch.onnx.export(model, _inputs(2, 12), str(static), input_names=["input_ids", "mask"],
                      output_names=["y"], dynamo=False)
    runs = []
    for path in (dynamic, static):
        exe = pypto.onnx.load(path)
        ids, mask = (x.numpy() for x in _inputs(2, 12))
        runs.append(exe(ids, mask))
        runs.append(_kernels(exe._compiled))
    np.testing.assert_allclose(runs[0], runs[2], rtol=1e-5, atol=1e-6)
    assert runs[1] == runs[3]
    assert runs[1].count("Attention") == 2 and any("+" in r for r in runs[1])


@pytest.mark.parametrize("grouped", [False, True])
def test_causal_sdpa_with_a_symbolic_sequence_is_one_op(grouped):
    """F.scaled_dot_product_attention(is_causal=True) with a symbolic sequence: no [L, S] causal
    constant can be built, so the converter emits Attention(is_causal=1) itself (it raised
    NotImplementedError before); equal to eager at lengths 1, 9 and 33, grouped K/V heads too."""
    import torch.nn.functional as F
    from torch.export import Dim

    class Causal(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)

    kv_heads = 2 if grouped else 4

    def qkv(seq):
        g = torch.Generator().manual_seed(seq)
        return (torch.randn(2, 4, seq, 16, generator=g),
                torch.randn(2, kv_heads, seq, 16, generator=g),
                torch.randn(2, kv_heads, seq, 16, generator=g))

    seq = Dim("seq", min=1, max=256)
    fast = pypto.optimize(Causal().eval(), qkv(8), dynamic_shapes=({2: seq},) * 3)
    for s in (1, 9, 33):
        args = qkv(s)
        torch.testing.assert_close(fast(*args), Causal()(*args), rtol=1e-4, atol=1e-5)
    assert [s["rule"] or s["op"] for s in fast.compiled.steps] == ["Attention"]


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_exported_llama_decoder_with_its_cache_reads_the_kv_heads(dynamo, tmp_path):
    """A Llama decoder exported to ONNX with its K/V cache (symbolic batch, sequence and past;
    bench/generate_ort.py's export), by both exporters. The TorchScript one writes repeat_kv's
    Expand target as Where(Equal(shape, -1), 1, shape) over Shape(Concat(past, new)):
    ResolveShapes proves it [1, kv, groups, 1, d] (sizes are never -1; the length is the cache's
    own). The dynamo one writes the length as past + seq and K^T as a [b * h, L, d] batched
    transpose: the cache's length is the sum (past+seq) by Concat's inference, and
    SimplifyTransposes makes the batched transpose one. Either way each layer is one Attention
    reading the kv heads of the cache (no repeated copies), and every output matches onnxruntime:
    a prefill with an empty cache, a decode step, batch 1 and 2."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import generate_ort

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300)).eval()
    path = str(tmp_path / "decoder.onnx")
    names, _ = generate_ort.export_decoder(model, path, dynamo=dynamo)
    exe = pypto.onnx.load(path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch, seq, past in [(1, 5, 0), (2, 1, 9), (1, 1, 17)]:
        feeds = [rng.integers(0, 300, (batch, seq)), np.ones((batch, past + seq), np.int64),
                 np.tile(np.arange(past, past + seq), (batch, 1))]
        feeds += [rng.standard_normal((batch, 2, past, 16), dtype=np.float32) for _ in range(4)]
        want = session.run(None, dict(zip(names, feeds)))
        got = exe(*feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5)
        steps = [s["rule"] or s["op"] for s in exe._compiled.steps]
        assert steps.count("Attention") == 2, (batch, seq, past)
    graph = str(exe._compiled.graph)
    assert "Softmax(" not in graph
    # The Expands left build the mask (bool, int64); K and V reach Attention unrepeated.
    expands = [line for line in graph.splitlines() if "= Expand(" in line]
    assert not any(": f32[" in line for line in expands), expands
    attention = [line for line in graph.splitlines() if "= Attention(" in line]
    assert len(attention) == 2 and all("present_" in line for line in attention), attention


def _decoder(family):
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                vocab_size=300)
    if family == "phi3":
        return transformers.Phi3ForCausalLM(transformers.Phi3Config(
            num_key_value_heads=2, pad_token_id=0, **base))
    if family == "gptneox":  # rotary on a quarter of each head, the rest passed through
        return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**base))
    if family == "falcon":
        return transformers.FalconForCausalLM(transformers.FalconConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=300,
            new_decoder_architecture=True, num_kv_heads=2))
    return transformers.StableLmForCausalLM(transformers.StableLmConfig(  # partial rotary too
        num_key_value_heads=2, **base))


@pytest.mark.parametrize("family,dynamo", [("phi3", False), ("gptneox", False),
                                           ("falcon", True), ("stablelm", True)])
def test_exported_decoders_of_other_families_fuse_attention_and_rotary(family, dynamo, tmp_path):
    """Other decoder families exported with their cache: Phi-3's fused QKV projection sliced
    three ways, GPT-NeoX's and StableLM's rotary embedding on part of each head (the rest
    concatenated back), Falcon's grouped heads. Each layer is one Attention over the cache and
    two RotaryEmbedding (the TorchScript exporter's rotate_half halves come from Shape() of a
    slice whose end ResolveShapes proves in an earlier sweep), and every output matches
    onnxruntime."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import generate_ort

    torch.manual_seed(0)
    model = _decoder(family).eval()
    path = str(tmp_path / "decoder.onnx")
    names, _ = generate_ort.export_decoder(model, path, dynamo=dynamo)
    _, kv, head = generate_ort._geometry(model.config)
    exe = pypto.onnx.load(path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for batch, seq, past in [(1, 4, 0), (2, 1, 7)]:
        feeds = [rng.integers(0, 300, (batch, seq)), np.ones((batch, past + seq), np.int64),
                 np.tile(np.arange(past, past + seq), (batch, 1))]
        feeds += [rng.standard_normal((batch, kv, past, head), dtype=np.float32)
                  for _ in names[3:]]
        want = session.run(None, dict(zip(names, feeds)))
        for g, w in zip(exe(*feeds), want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5)
    ops = [s["rule"] or s["op"] for s in exe._compiled.steps]
    assert ops.count("Attention") == 2 and ops.count("RotaryEmbedding") == 4, ops
    assert "Softmax" not in ops and "Neg" not in ops, ops
    expands = [line for line in str(exe._compiled.graph).splitlines() if "= Expand(" in line]
    assert not any(": f32[" in line for line in expands), expands
