"""onnxruntime's contrib ops (domain com.microsoft) and its SimplifiedLayerNormalization, which
onnxruntime.transformers.optimizer, Optimum's O2/O3 exports and a session's optimized model write:
the importer reads them as the standard ops they stand for (src/frontend/onnx/contrib_ops.cpp).
Each is compared with onnxruntime running the contrib op itself, on graphs written with
onnx.helper, and on small Hugging Face models that onnxruntime's optimizer fused."""

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto

F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
MS = "com.microsoft"
RNG = np.random.default_rng(7)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "contrib", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid(MS, 1)])


def _init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def _randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _check(tmp_path, model, feeds, level=2, atol=2e-5, cpu_only=True):
    """Runs `model` in onnxruntime and in PyPTO at `level`; every output must agree, and (with
    cpu_only) no node of the compiled graph may run on the reference interpreter."""
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    exe = pypto.onnx.load(str(path), level=level)
    got = exe(**feeds)
    got = got if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(want)
    for w, g in zip(want, got):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=atol)
    if cpu_only and level >= 2:
        on_ref = [op for op, b in exe._compiled.node_backends if b == "reference"]
        assert not on_ref, on_ref
    return exe


# ---- elementwise ----

@pytest.mark.parametrize("op,inputs,attrs", [
    ("Gelu", 1, {}),
    ("BiasGelu", 2, {}),
    ("FastGelu", 1, {}),
    ("FastGelu", 2, {}),
    ("QuickGelu", 1, {}),
    ("QuickGelu", 1, {"alpha": 1.25}),
])
def test_gelu_family(tmp_path, op, inputs, attrs):
    names = ["x", "bias"][:inputs]
    node = helper.make_node(op, names, ["y"], domain=MS, **attrs)
    inits = [_init("bias", _randn(24))] if inputs == 2 else []
    m = _model([node], [_vi("x", F, [3, 5, 24])], [_vi("y", F, [3, 5, 24])], inits)
    x = _randn(3, 5, 24, scale=3.0)
    x[0, 0, :3] = [0.0, -9.0, 9.0]
    _check(tmp_path, m, {"x": x})


def test_bias_add(tmp_path):
    node = helper.make_node("BiasAdd", ["x", "bias", "skip"], ["y"], domain=MS)
    m = _model([node], [_vi("x", F, [2, 4, 32]), _vi("skip", F, [2, 4, 32])],
               [_vi("y", F, [2, 4, 32])], [_init("bias", _randn(32))])
    want = None
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    x, skip = _randn(2, 4, 32), _randn(2, 4, 32)
    got = pypto.onnx.load(str(path))(x=x, skip=skip)
    want = x + numpy_helper.to_array(m.graph.initializer[0]) + skip  # no CPU kernel in ORT
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)


# ---- normalizations ----

@pytest.mark.parametrize("beta,bias,sum_out", [(True, True, True), (True, False, False),
                                               (False, True, False), (False, False, True)])
def test_skip_layer_norm(tmp_path, beta, bias, sum_out):
    h = 48
    ins = ["x", "skip", "gamma", "beta" if beta else "", "bias" if bias else ""]
    while not ins[-1]:
        ins.pop()
    outs = ["y", "", "", "sum"] if sum_out else ["y"]
    node = helper.make_node("SkipLayerNormalization", ins, outs, domain=MS, epsilon=1e-5)
    inits = [_init("gamma", _randn(h)), _init("beta", _randn(h)), _init("bias", _randn(h))]
    m = _model([node], [_vi("x", F, ["b", "s", h]), _vi("skip", F, ["b", "s", h])],
               [_vi(o, F, None) for o in outs if o], inits)
    _check(tmp_path, m, {"x": _randn(2, 7, h, scale=4.0) + 3.0, "skip": _randn(2, 7, h)})


@pytest.mark.parametrize("bias,sum_out", [(True, True), (False, False), (False, True)])
def test_skip_simplified_layer_norm(tmp_path, bias, sum_out):
    h = 40
    ins = ["x", "skip", "gamma"] + (["bias"] if bias else [])
    outs = ["y", "", "", "sum"] if sum_out else ["y"]
    node = helper.make_node("SkipSimplifiedLayerNormalization", ins, outs, domain=MS,
                            epsilon=1e-6)
    inits = [_init("gamma", _randn(h)), _init("bias", _randn(h))]
    m = _model([node], [_vi("x", F, [3, 5, h]), _vi("skip", F, [3, 5, h])],
               [_vi(o, F, None) for o in outs if o], inits)
    _check(tmp_path, m, {"x": _randn(3, 5, h), "skip": _randn(3, 5, h)})


def test_simplified_layer_norm_default_domain(tmp_path):
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], axis=-1,
                            epsilon=1e-6)
    m = _model([node], [_vi("x", F, [2, 9, 64])], [_vi("y", F, [2, 9, 64])],
               [_init("scale", _randn(64))])
    _check(tmp_path, m, {"x": _randn(2, 9, 64, scale=2.0)})


@pytest.mark.parametrize("segments,mask,positions", [(True, True, False), (False, False, False),
                                                     (True, False, True)])
def test_embed_layer_norm(tmp_path, segments, mask, positions):
    vocab, maxpos, h, b, s = 30, 20, 32, 2, 9
    ins = ["ids", "seg" if segments else "", "word", "pos", "segemb" if segments else "",
           "gamma", "beta", "mask" if mask else "", "pos_ids" if positions else ""]
    while not ins[-1]:
        ins.pop()
    node = helper.make_node("EmbedLayerNormalization", ins, ["y", "mask_index", "emb_sum"],
                            domain=MS, epsilon=1e-12)
    inputs = [_vi("ids", I32, ["b", "s"])]
    feeds = {"ids": RNG.integers(0, vocab, (b, s)).astype(np.int32)}
    if segments:
        inputs.append(_vi("seg", I32, ["b", "s"]))
        feeds["seg"] = RNG.integers(0, 2, (b, s)).astype(np.int32)
    if mask:
        inputs.append(_vi("mask", I32, ["b", "s"]))
        feeds["mask"] = np.ones((b, s), np.int32)
        feeds["mask"][1, 5:] = 0
    if positions:
        inputs.append(_vi("pos_ids", I32, ["b", "s"]))
        feeds["pos_ids"] = RNG.integers(0, maxpos, (b, s)).astype(np.int32)
    inits = [_init("word", _randn(vocab, h)), _init("pos", _randn(maxpos, h)),
             _init("segemb", _randn(2, h)), _init("gamma", _randn(h)), _init("beta", _randn(h))]
    m = _model([node], inputs, [_vi("y", F, None), _vi("mask_index", I32, None),
                                _vi("emb_sum", F, None)], inits)
    _check(tmp_path, m, feeds)


# ---- matrix products ----

@pytest.mark.parametrize("ta,tb,alpha", [(0, 1, 1.0), (1, 0, 0.5), (1, 1, 2.0), (0, 0, 0.125)])
def test_fused_mat_mul(tmp_path, ta, tb, alpha):
    a_shape = [2, 12, 7] if ta else [2, 7, 12]
    b_shape = [2, 9, 12] if tb else [2, 12, 9]
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, transA=ta, transB=tb,
                            alpha=alpha)
    m = _model([node], [_vi("a", F, a_shape), _vi("b", F, b_shape)], [_vi("y", F, [2, 7, 9])])
    _check(tmp_path, m, {"a": _randn(*a_shape), "b": _randn(*b_shape)})


@pytest.mark.parametrize("act,params,with_z", [("Relu", [], False), ("Clip", [0.0, 6.0], True),
                                               ("LeakyRelu", [0.1], False),
                                               ("HardSigmoid", [0.2, 0.5], False),
                                               ("Sigmoid", [], True), ("Tanh", [], False)])
def test_fused_conv(tmp_path, act, params, with_z):
    ins = ["x", "w", "b"] + (["z"] if with_z else [])
    extra = {"activation_params": params} if params else {}
    node = helper.make_node("FusedConv", ins, ["y"], domain=MS, activation=act,
                            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], group=1,
                            **extra)
    inputs = [_vi("x", F, [1, 4, 10, 10])] + ([_vi("z", F, [1, 8, 10, 10])] if with_z else [])
    m = _model([node], inputs, [_vi("y", F, [1, 8, 10, 10])],
               [_init("w", _randn(8, 4, 3, 3, scale=0.5)), _init("b", _randn(8))])
    feeds = {"x": _randn(1, 4, 10, 10)}
    if with_z:
        feeds["z"] = _randn(1, 8, 10, 10)
    _check(tmp_path, m, feeds)


@pytest.mark.parametrize("act,attrs", [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.2})])
def test_fused_gemm(tmp_path, act, attrs):
    node = helper.make_node("FusedGemm", ["a", "w", "c"], ["y"], domain=MS, transB=1, alpha=0.5,
                            beta=2.0, activation=act, **attrs)
    m = _model([node], [_vi("a", F, [6, 16])], [_vi("y", F, [6, 10])],
               [_init("w", _randn(10, 16)), _init("c", _randn(10))])
    _check(tmp_path, m, {"a": _randn(6, 16)})


# ---- attention ----

def _attention_model(b, s, h, heads, mask=None, extra=None, v_hidden=None, attrs=None,
                     past=0):
    """Attention(x, w, bias, mask?, past?, attention_bias?) with its inputs and feeds."""
    vh = v_hidden or h
    ins = ["x", "w", "bias", "", "", ""]
    inputs = [_vi("x", F, ["b", "s", h])]
    feeds = {"x": _randn(b, s, h)}
    if mask is not None:
        ins[3] = "mask"
        inputs.append(_vi("mask", I32, list(mask.shape)))
        feeds["mask"] = mask
    outs = ["y"]
    if past:
        ins[4] = "past"
        inputs.append(_vi("past", F, [2, "b", heads, "p", h // heads]))
        feeds["past"] = _randn(2, b, heads, past, h // heads)
        outs.append("present")
    if extra is not None:
        ins[5] = "attn_bias"
        inputs.append(_vi("attn_bias", F, None))
        feeds["attn_bias"] = extra
    while not ins[-1]:
        ins.pop()
    a = dict(num_heads=heads, **(attrs or {}))
    if v_hidden:
        a["qkv_hidden_sizes"] = [h, h, vh]
    node = helper.make_node("Attention", ins, outs, domain=MS, **a)
    inits = [_init("w", _randn(h, 2 * h + vh, scale=0.3)), _init("bias", _randn(2 * h + vh))]
    return _model([node], inputs, [_vi(o, F, None) for o in outs], inits), feeds


@pytest.mark.parametrize("kind", ["none", "raw2d", "end1d", "raw3d", "causal", "bias4d",
                                  "scale", "v_hidden"])
def test_attention(tmp_path, kind):
    b, s, h, heads = 2, 7, 32, 4
    mask = extra = v_hidden = None
    attrs = {}
    if kind == "raw2d":
        mask = np.ones((b, s), np.int32)
        mask[1, 4:] = 0
        mask[0, 0] = 0
    elif kind == "end1d":
        mask = np.array([s, 3], np.int32)
    elif kind == "raw3d":
        mask = (RNG.random((b, s, s)) > 0.3).astype(np.int32)
        mask[:, :, 0] = 1
    elif kind == "causal":
        attrs["unidirectional"] = 1
        mask = np.ones((b, s), np.int32)
        mask[0, 5:] = 0
    elif kind == "bias4d":
        extra = _randn(1, heads, s, s)
    elif kind == "scale":
        attrs["scale"] = 0.05
    elif kind == "v_hidden":
        v_hidden = 16
    m, feeds = _attention_model(b, s, h, heads, mask, extra, v_hidden, attrs)
    _check(tmp_path, m, feeds)


def test_attention_decode_step_with_past(tmp_path):
    """GPT-2's decoding: one new token, unidirectional, the K/V cache stacked in `past`."""
    m, feeds = _attention_model(2, 1, 32, 4, mask=np.ones((2, 6), np.int32),
                                attrs={"unidirectional": 1}, past=5)
    _check(tmp_path, m, feeds)


def test_attention_rejects_what_it_does_not_read(tmp_path):
    m, feeds = _attention_model(1, 4, 16, 2, attrs={"do_rotary": 1})
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    with pytest.raises(NotImplementedError, match="do_rotary is not supported"):
        pypto.onnx.load(str(path))


@pytest.mark.parametrize("kind", ["self", "cross_bias", "padding", "causal_past", "attn_bias"])
def test_multi_head_attention(tmp_path, kind):
    b, s, l, d, heads = 2, 5, 5, 32, 4
    if kind == "cross_bias":
        l = 8
    ins = ["q", "k", "v", "", "", "", "", ""]
    outs = ["y"]
    feeds = {"q": _randn(b, s, d), "k": _randn(b, l, d), "v": _randn(b, l, d)}
    inputs = [_vi("q", F, ["b", "s", d]), _vi("k", F, ["b", "l", d]), _vi("v", F, ["b", "l", d])]
    inits = []
    attrs = {"num_heads": heads}
    if kind == "cross_bias":
        ins[3] = "bias"
        inits.append(_init("bias", _randn(3 * d)))
    if kind == "padding":
        ins[4] = "kpm"
        inputs.append(_vi("kpm", I32, ["b", "l"]))
        feeds["kpm"] = np.ones((b, l), np.int32)
        feeds["kpm"][1, 3:] = 0
    if kind == "attn_bias":
        ins[5] = "ab"
        inputs.append(_vi("ab", F, [b, heads, s, l]))
        feeds["ab"] = _randn(b, heads, s, l)
    if kind == "causal_past":
        attrs["unidirectional"] = 1
        ins[6], ins[7] = "pk", "pv"
        p = 3
        inputs += [_vi("pk", F, ["b", heads, "p", d // heads]),
                   _vi("pv", F, ["b", heads, "p", d // heads])]
        feeds["pk"], feeds["pv"] = _randn(b, heads, p, d // heads), _randn(b, heads, p, d // heads)
        outs += ["present_k", "present_v"]
    while not ins[-1]:
        ins.pop()
    node = helper.make_node("MultiHeadAttention", ins, outs, domain=MS, **attrs)
    m = _model([node], inputs, [_vi(o, F, None) for o in outs], inits)
    _check(tmp_path, m, feeds)


@pytest.mark.parametrize("layout,interleaved,offset", [("bnsh", 0, False), ("bsd", 1, False),
                                                       ("bsd", 0, True)])
def test_rotary_embedding(tmp_path, layout, interleaved, offset):
    b, s, heads, hd, maxpos = 2, 6, 2, 8, 16
    shape = [b, heads, s, hd] if layout == "bnsh" else [b, s, heads * hd]
    attrs = {"interleaved": interleaved}
    if layout == "bsd":
        attrs["num_heads"] = heads
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS,
                            **attrs)
    pos = np.array([3], np.int64) if offset else RNG.integers(0, maxpos - 1, (b, s))
    angles = np.arange(maxpos)[:, None] * (0.5 ** np.arange(hd // 2))[None, :]
    m = _model([node], [_vi("x", F, shape), _vi("pos", I64, list(pos.shape))],
               [_vi("y", F, shape)],
               [_init("cos", np.cos(angles).astype(np.float32)),
                _init("sin", np.sin(angles).astype(np.float32))])
    _check(tmp_path, m, {"x": _randn(*shape), "pos": pos.astype(np.int64)})


def test_unread_contrib_op_names_itself(tmp_path):
    node = helper.make_node("DecoderMaskedMultiHeadAttention", ["q", "q", "q"], ["y"],
                            domain=MS, num_heads=2)
    m = _model([node], [_vi("q", F, [1, 4, 8])], [_vi("y", F, None)])
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    with pytest.raises(NotImplementedError, match="DecoderMaskedMultiHeadAttention.*contrib op"):
        pypto.onnx.load(str(path))


# ---- whole models that onnxruntime's transformer optimizer fused ----

def _hf_optimized(tmp_path, kind):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from onnxruntime.transformers.optimizer import optimize_model
    torch.manual_seed(0)
    if kind == "bert":
        cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, vocab_size=100)
        cfg._attn_implementation = "eager"  # the pattern onnxruntime's fusions know
        model, names = transformers.BertModel(cfg), ["input_ids", "attention_mask",
                                                     "token_type_ids"]
        args = (torch.randint(0, 100, (2, 16)), torch.ones(2, 16, dtype=torch.int64),
                torch.zeros(2, 16, dtype=torch.int64))
    else:
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100,
                                      n_positions=64, use_cache=False)
        cfg._attn_implementation = "eager"
        model, names = transformers.GPT2Model(cfg), ["input_ids", "attention_mask"]
        args = (torch.randint(0, 100, (2, 16)), torch.ones(2, 16, dtype=torch.int64))

    class Hidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m.eval()

        def forward(self, *a):
            return self.m(**dict(zip(names, a))).last_hidden_state

    raw = tmp_path / f"{kind}.onnx"
    torch.onnx.export(Hidden(model).eval(), args, str(raw), input_names=names, dynamo=False,
                      opset_version=17, dynamic_axes={n: {0: "b", 1: "s"} for n in names})
    fused = optimize_model(str(raw), model_type=kind, num_heads=4, hidden_size=64, opt_level=0)
    out = tmp_path / f"{kind}_fused.onnx"
    fused.save_model_to_file(str(out))
    return onnx.load(out)


@pytest.mark.parametrize("kind,want", [
    ("bert", {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"}),
    ("gpt2", {"SkipLayerNormalization", "FastGelu"})])
def test_models_fused_by_onnxruntime(tmp_path, kind, want):
    model = _hf_optimized(tmp_path, kind)
    ops = collections.Counter(n.op_type for n in model.graph.node if n.domain == MS)
    assert want <= set(ops), ops  # the optimizer fused what this test is about
    feeds = {"input_ids": RNG.integers(0, 100, (2, 11)).astype(np.int64),
             "attention_mask": np.ones((2, 11), np.int64)}
    feeds["attention_mask"][1, 7:] = 0
    if kind == "bert":
        feeds["token_type_ids"] = RNG.integers(0, 2, (2, 11)).astype(np.int64)
    names = {i.name for i in model.graph.input}
    feeds = {k: v for k, v in feeds.items() if k in names}
    exe = _check(tmp_path, model, feeds, atol=1e-4)
    ran = {op for op, _ in exe._compiled.node_backends}
    assert "Attention" in ran and "LayerNormalization" in ran


@pytest.mark.parametrize("level", [0, 2])
def test_expansion_written_back_runs_in_onnxruntime(tmp_path, level):
    """An expanded Attention with a padding mask, written back as ONNX (standard ops; at level 2
    the fused Attention with its Q/K/V read in place and a [batch, 1, 1, keys] mask), loads in
    onnxruntime and agrees with the contrib op."""
    mask = np.ones((2, 7), np.int32)
    mask[1, 4:] = 0
    m, feeds = _attention_model(2, 7, 32, 4, mask)
    path = tmp_path / "contrib.onnx"
    onnx.save(m, path)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    exe = pypto.onnx.load(str(path), level=level)
    exe(**feeds)
    out = tmp_path / "written.onnx"
    pypto.onnx.export(exe, None, out)
    written = onnx.load(out)
    assert not [n.op_type for n in written.graph.node if n.domain == MS]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=2e-5)


# ---- weight-only quantized MatMul ----

@pytest.mark.parametrize("bits,symmetric,k", [(4, False, 100), (4, True, 128), (8, False, 72)])
def test_mat_mul_nbits_from_onnxruntime_quantizer(tmp_path, bits, symmetric, k):
    """onnxruntime's MatMulNBitsQuantizer (as the int4 LLM exports write MatMulNBits) on a
    MatMul + bias; PyPTO dequantizes the weight once and runs float32 (onnxruntime at
    accuracy_level 0 dequantizes too: the same products up to summation order)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                 MatMulNBitsQuantizer)
    n = 24
    nodes = [helper.make_node("MatMul", ["a", "w"], ["t"]),
             helper.make_node("Add", ["t", "bias"], ["y"])]
    m = _model(nodes, [_vi("a", F, ["b", 5, k])], [_vi("y", F, ["b", 5, n])],
               [_init("w", _randn(k, n)), _init("bias", _randn(n))])
    config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=symmetric, bits=bits,
                                          accuracy_level=0)
    q = MatMulNBitsQuantizer(m, algo_config=config)
    q.process()
    quantized = q.model.model
    assert [nd.op_type for nd in quantized.graph.node if nd.domain == MS] == ["MatMulNBits"]
    _check(tmp_path, quantized, {"a": _randn(3, 5, k)}, atol=1e-4)


# ---- GroupQueryAttention (onnxruntime-genai's LLM exports) ----

def _gqa_case(b, s, past, lens, heads=4, kv=2, head=16, packed=False, rotary=True,
              interleaved=0, window=-1):
    """A GroupQueryAttention node and its feeds: `past` rows of K/V cache (0: none), `lens` the
    tokens each batch holds after this step (seqlens_k + 1), total_sequence_length max(lens)."""
    total = int(max(lens))
    ins = ["q", "k", "v", "pk", "pv", "seqlens", "total", "cos", "sin"]
    inputs = [_vi("q", F, ["b", "s", (heads + 2 * kv) * head if packed else heads * head])]
    feeds = {"q": _randn(b, s, (heads + 2 * kv) * head if packed else heads * head)}
    if packed:
        ins[1] = ins[2] = ""
    else:
        inputs += [_vi("k", F, ["b", "s", kv * head]), _vi("v", F, ["b", "s", kv * head])]
        feeds["k"], feeds["v"] = _randn(b, s, kv * head), _randn(b, s, kv * head)
    if past:
        inputs += [_vi("pk", F, ["b", kv, "p", head]), _vi("pv", F, ["b", kv, "p", head])]
        feeds["pk"], feeds["pv"] = _randn(b, kv, past, head), _randn(b, kv, past, head)
    else:
        ins[3] = ins[4] = ""
    inputs += [_vi("seqlens", I32, ["b"]), _vi("total", I32, [])]
    feeds["seqlens"] = np.asarray(lens, np.int32) - 1
    feeds["total"] = np.array(total, np.int32)
    inits = []
    if rotary:
        angles = np.arange(32)[:, None] * (0.7 ** np.arange(head // 2))[None, :]
        inits = [_init("cos", np.cos(angles).astype(np.float32)),
                 _init("sin", np.sin(angles).astype(np.float32))]
    else:
        ins = ins[:7]
    node = helper.make_node("GroupQueryAttention", ins, ["y", "present_k", "present_v"],
                            domain=MS, num_heads=heads, kv_num_heads=kv,
                            do_rotary=int(rotary), rotary_interleaved=interleaved,
                            local_window_size=window)
    outs = [_vi("y", F, None), _vi("present_k", F, None), _vi("present_v", F, None)]
    return _model([node], inputs, outs, inits), feeds


def _check_gqa(tmp_path, model, feeds, lens, s, first_prompt):
    """Output rows of real queries and present rows below each batch's length (onnxruntime
    leaves the rest unspecified) agree with onnxruntime."""
    path = tmp_path / "gqa.onnx"
    onnx.save(model, path)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    exe = pypto.onnx.load(str(path))
    got = [np.asarray(g) for g in exe(**feeds)]
    on_ref = [op for op, b in exe._compiled.node_backends if b == "reference"]
    assert not on_ref, on_ref
    for bi, n in enumerate(lens):
        rows = n if first_prompt else s  # padded prompt queries have no defined output
        np.testing.assert_allclose(got[0][bi, :rows], want[0][bi, :rows], rtol=1e-4, atol=2e-5)
        for o in (1, 2):
            assert got[o].shape == want[o].shape
            np.testing.assert_allclose(got[o][bi, :, :n], want[o][bi, :, :n], rtol=1e-5,
                                       atol=1e-6)


@pytest.mark.parametrize("packed,rotary", [(True, True), (False, False), (False, True)])
def test_gqa_first_prompt(tmp_path, packed, rotary):
    m, feeds = _gqa_case(2, 7, 0, [7, 7], packed=packed, rotary=rotary)
    _check_gqa(tmp_path, m, feeds, [7, 7], 7, True)


def test_gqa_padded_prompt(tmp_path):
    m, feeds = _gqa_case(2, 7, 0, [7, 4])
    _check_gqa(tmp_path, m, feeds, [7, 4], 7, True)


@pytest.mark.parametrize("lens,past", [([6], 5), ([6, 6], 5), ([6, 4], 6), ([9, 3], 8)])
def test_gqa_token_generation(tmp_path, lens, past):
    """One new token; the caches right-padded: batch b's new row goes at lens[b] - 1."""
    m, feeds = _gqa_case(len(lens), 1, past, lens, interleaved=1)
    _check_gqa(tmp_path, m, feeds, lens, 1, False)


def test_gqa_subsequent_prompt_and_window(tmp_path):
    m, feeds = _gqa_case(1, 3, 4, [7], window=3)
    _check_gqa(tmp_path, m, feeds, [7], 3, False)
