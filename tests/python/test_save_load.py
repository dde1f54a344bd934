"""pypto.save / pypto.load: compiled models from the zoo load without compiling again and give
bit-identical outputs (torch.equal against the module they were saved from, at levels 2 and 3,
and at a second batch size through the symbolic batch); damaged files, files of another format
version and files for another ISA are ValueErrors; pypto.save_graph draws the compiled graph."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET

import pytest
import torch
import torch.utils._pytree as pytree

import pypto
import torch_models

REPO = pathlib.Path(__file__).resolve().parents[2]


def _bert_tiny():
    import transformers

    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=128, vocab_size=1000)
    return transformers.BertModel(cfg)


def _gpt2_small():
    import transformers

    cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000,
                                  use_cache=False)
    return transformers.GPT2Model(cfg)


def _tokens(b):
    return (torch.randint(0, 1000, (b, 16)),)


def _image(b):
    return (torch.randn(b, 3, 64, 64),)


# The zoo models cheap enough to compile twice per level here; the transformers in small
# configurations (same layers and ops as the full ones, fewer and narrower).
MODELS = {
    "resnet18": (lambda: torch_models.ZOO["resnet18"].build(), _image),
    "mobilenet_v2": (lambda: torch_models.ZOO["mobilenet_v2"].build(), _image),
    "mobilenet_v3_small": (lambda: torch_models.ZOO["mobilenet_v3_small"].build(), _image),
    "bert_tiny": (_bert_tiny, _tokens),
    "gpt2_2layers": (_gpt2_small, _tokens),
}


def _build(name):
    torch.manual_seed(0)
    return MODELS[name][0]().eval()


def _inputs(name, batch):
    torch.manual_seed(100 + batch)
    return MODELS[name][1](batch)


def _assert_same(a, b):
    fa, sa = pytree.tree_flatten(a)
    fb, sb = pytree.tree_flatten(b)
    assert sa == sb, (sa, sb)
    assert type(a) is type(b)
    assert fa, "no outputs"
    for x, y in zip(fa, fb):
        assert torch.equal(x, y), (x - y).abs().max()


@pytest.mark.parametrize("level", [2, 3])
@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_model_round_trips_bit_identically(name, level, tmp_path, monkeypatch):
    model = _build(name)
    x1 = _inputs(name, 1)
    fast = pypto.optimize(model, x1, level=level)
    path = tmp_path / f"{name}.pto"
    t0 = time.perf_counter()
    pypto.save(fast, path)
    save_s = time.perf_counter() - t0
    # Loading runs no graph pass: one would fail on this variable, which names no pass.
    monkeypatch.setenv("PTO_DISABLE_PASSES", "NoSuchPass")
    t0 = time.perf_counter()
    loaded = pypto.load(path)
    load_s = time.perf_counter() - t0
    monkeypatch.delenv("PTO_DISABLE_PASSES")
    print(f"{name} level {level}: {path.stat().st_size / 2**20:.2f} MiB, save {save_s * 1e3:.0f} "
          f"ms, load {load_s * 1e3:.0f} ms")
    assert isinstance(loaded, torch.nn.Module)
    assert loaded.compiled.level == level
    assert loaded.stats()["kernels"] == fast.stats()["kernels"]
    for batch in (1, 2):
        x = _inputs(name, batch)
        with torch.no_grad():
            want = fast(*x)
            got = loaded(*x)
            _assert_same(got, want)
    # And it still computes the model (not only what the saved graph computes).
    with torch.no_grad():
        ref = torch_models.first_tensor(model(*x1))
        got = torch_models.first_tensor(loaded(*x1))
    assert (got - ref).abs().max() <= 1e-3 * max(1.0, ref.abs().max().item())


# The rest of the zoo at full size (ResNet-50, EfficientNet-B0, ViT-B/16, ConvNeXt-tiny, BERT-base,
# GPT-2 small, T5-small's encoder): one level and one batch each, since each compile takes
# seconds; the small configurations above cover the levels and batch sizes.
@pytest.mark.parametrize("name", [n for n in torch_models.CORE if n not in MODELS])
def test_every_other_zoo_model_round_trips_bit_identically(name, tmp_path):
    model = torch_models.build(name)
    x = torch_models.inputs(name, 1)
    fast = pypto.optimize(model, x, level=2)
    path = tmp_path / f"{name}.pto"
    pypto.save(fast, path)
    loaded = pypto.load(path)
    with torch.no_grad():
        _assert_same(loaded(*x), fast(*x))


def test_loads_in_a_fresh_process(tmp_path):
    """A new interpreter rebuilds transformers' output type from the file alone."""
    model = _build("bert_tiny")
    x = _inputs("bert_tiny", 2)
    fast = pypto.optimize(model, x)
    pypto.save(fast, tmp_path / "b.pto")
    torch.save(x, tmp_path / "x.pt")
    with torch.no_grad():
        want = fast(*x)
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(REPO / "python")!r})
        import pypto
        m = pypto.load({str(tmp_path / "b.pto")!r})
        assert "transformers" in sys.modules
        x = torch.load({str(tmp_path / "x.pt")!r})
        with torch.no_grad():
            torch.save(m(*x), {str(tmp_path / "y.pt")!r})
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "y.pt", weights_only=False)
    _assert_same(got, want)


def test_calling_convention_survives(tmp_path):
    """Keyword arguments and a mismatched call are handled as by the optimized module."""
    model = _build("bert_tiny")
    ids = torch.randint(0, 1000, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.int64)
    fast = pypto.optimize(model, (ids,), example_kwargs={"attention_mask": mask})
    pypto.save(fast, tmp_path / "m.pto")
    loaded = pypto.load(tmp_path / "m.pto")
    with torch.no_grad():
        _assert_same(loaded(ids, attention_mask=mask), fast(ids, attention_mask=mask))
    with pytest.raises(TypeError, match="positional"):
        loaded(ids, ids, attention_mask=mask)
    with pytest.raises(TypeError):
        loaded(ids.numpy(), attention_mask=mask)
    # The loaded module exports its compiled graph like the optimized one.
    pypto.onnx.export(loaded, (ids,), tmp_path / "m.onnx")
    again = pypto.onnx.load(tmp_path / "m.onnx")
    want = fast(ids, attention_mask=mask)
    assert torch.allclose(again(ids, mask)[0], want.last_hidden_state, rtol=1e-4, atol=1e-5)


def test_onnx_models_save_and_load(tmp_path):
    model = _build("resnet18")
    x = _inputs("resnet18", 1)
    pypto.onnx.export(pypto.optimize(model, x, level=0), x, tmp_path / "r.onnx")
    exe = pypto.onnx.load(tmp_path / "r.onnx")
    pypto.save(exe, tmp_path / "r.pto")
    loaded = pypto.load(tmp_path / "r.pto")
    assert isinstance(loaded, pypto.onnx.OnnxModel)
    assert loaded._compiled.saved_info["isa"] == pypto.device_info()["isa"]
    assert torch.equal(loaded(x[0]), exe(x[0]))
    assert loaded.input_names == exe.input_names
    # A CompiledGraph comes back as one.
    pypto.save(exe._compiled, tmp_path / "g.pto")
    graph = pypto.load(tmp_path / "g.pto")
    assert isinstance(graph, pypto.CompiledGraph)
    assert torch.equal(graph.run([x[0]])[0], exe(x[0]))


def test_bad_arguments(tmp_path):
    lazy = pypto.optimize(_build("resnet18"))  # not compiled until called
    with pytest.raises(ValueError, match="not been compiled"):
        pypto.save(lazy, tmp_path / "m.pto")
    with pytest.raises(TypeError, match="pypto.save expects"):
        pypto.save(torch.nn.Linear(2, 2), tmp_path / "m.pto")
    with pytest.raises(ValueError, match="cannot open"):
        pypto.load(tmp_path / "missing.pto")
    (tmp_path / "text.pto").write_text("hello")
    with pytest.raises(ValueError, match="not a PyPTO saved model"):
        pypto.load(tmp_path / "text.pto")
    with pytest.raises(ValueError, match="cannot write"):
        fast = pypto.optimize(_build("resnet18"), _inputs("resnet18", 1))
        pypto.save(fast, tmp_path / "no-such-dir" / "m.pto")


@pytest.fixture(scope="module")
def saved_resnet(tmp_path_factory):
    path = tmp_path_factory.mktemp("saved") / "r.pto"
    pypto.save(pypto.optimize(_build("resnet18"), _inputs("resnet18", 1)), path)
    return path


def test_damaged_files_are_value_errors(saved_resnet, tmp_path):
    data = saved_resnet.read_bytes()
    cases = {
        "truncated": (data[: len(data) // 2], "truncated"),
        "header": (data[:20], "truncated"),
        "flipped": (data[:1000] + bytes([data[1000] ^ 1]) + data[1001:], "checksum"),
        "version": (data[:8] + (99).to_bytes(4, "little") + data[12:],
                    r"format version 99; this PyPTO \(0\.1\.0\) reads versions 1 to 3 only"),
        "appended": (data + b"\0", "after its end"),
    }
    for name, (bytes_, message) in cases.items():
        p = tmp_path / f"{name}.pto"
        p.write_bytes(bytes_)
        with pytest.raises(ValueError, match=message) as e:
            pypto.load(p)
        assert str(p) in str(e.value)


def test_model_for_another_isa_is_refused(saved_resnet):
    """Kernels compiled for AVX-512 may not run under PTO_ISA=avx2 (nor on a CPU without it)."""
    if pypto.device_info()["isa"] != "avx512":
        pytest.skip("needs an AVX-512 machine to save a model its lower ISA cannot run")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / "python")!r})
        import pypto
        try:
            pypto.load({str(saved_resnet)!r})
        except ValueError as e:
            print(e)
    """)
    env = dict(os.environ, PTO_ISA="avx2")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "compiled for avx512 kernels but this process runs avx2 (PTO_ISA)" in r.stdout


def _svg_facts(path):
    """(cluster count, node titles, all text) of an SVG written by Graphviz."""
    root = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    clusters, titles, texts = 0, set(), []
    for g in root.iter(f"{ns}g"):
        cls = g.get("class")
        title = g.find(f"{ns}title")
        if cls == "cluster":
            clusters += 1
        elif cls == "node" and title is not None:
            titles.add(title.text)
    for t in root.iter(f"{ns}text"):
        texts.append(t.text or "")
    return clusters, titles, "\n".join(texts)


@pytest.mark.parametrize("name", ["resnet50", "bert"])
def test_save_graph_svg_shows_every_kernel_and_op(name, tmp_path):
    model = torch_models.build(name)
    fast = pypto.optimize(model, torch_models.inputs(name, 1))
    path = pypto.save_graph(fast, tmp_path / f"{name}.svg")
    clusters, titles, text = _svg_facts(path)
    steps = fast.compiled.steps
    assert clusters == sum(len(s["nodes"]) > 1 for s in steps) > 0
    graph = fast.compiled._exe.graph
    for i, op in enumerate(graph.ops):
        assert f"n{i}" in titles, f"node {i} ({op}) not drawn"
    for s in steps:
        for node_name in s["nodes"]:
            short = node_name if len(node_name) <= 40 else node_name[-37:]
            assert short in text, node_name
    for op in set(graph.ops):
        assert op in text.split("\n") or any(t.endswith("." + op) for t in text.split("\n")), op
    dot = pypto.save_graph(fast, tmp_path / f"{name}.dot")
    assert pathlib.Path(dot).read_text().startswith("digraph pypto {")


def test_save_graph_errors(tmp_path, monkeypatch):
    exe_module = pypto.optimize(_build("resnet18"), _inputs("resnet18", 1))
    with pytest.raises(ValueError, match="must end in"):
        pypto.save_graph(exe_module, tmp_path / "g.txt")
    with pytest.raises(TypeError):
        pypto.save_graph(object(), tmp_path / "g.svg")
    monkeypatch.setenv("PATH", str(tmp_path))  # no Graphviz here
    with pytest.raises(RuntimeError, match="needs Graphviz"):
        pypto.save_graph(exe_module, tmp_path / "g.svg")
    pypto.save_graph(exe_module, tmp_path / "g.dot")  # DOT needs no Graphviz
    assert (tmp_path / "g.dot").read_text().count("subgraph cluster_") > 0


def test_save_graph_after_a_pass(tmp_path):
    """The graph as a pass left it: BatchNorm is there before FoldBatchNorm and gone after."""
    fast = pypto.optimize(_build("resnet18"), _inputs("resnet18", 1))
    before = pathlib.Path(pypto.save_graph(fast, tmp_path / "a.dot", after="CanonicalizeOps"))
    folded = pathlib.Path(pypto.save_graph(fast, tmp_path / "b.dot", after="FoldBatchNorm"))
    assert "BatchNormalization" in before.read_text() and "subgraph" not in before.read_text()
    assert "BatchNormalization" not in folded.read_text()
    assert 'label="after FoldBatchNorm"' in folded.read_text()
    with pytest.raises(ValueError, match="does not run at level 2"):
        pypto.save_graph(fast, tmp_path / "c.dot", after="AssignLayouts")
    pypto.save(fast, tmp_path / "m.pto")
    with pytest.raises(ValueError, match="needs the graph before the passes"):
        pypto.save_graph(pypto.load(tmp_path / "m.pto"), tmp_path / "d.dot", after="FoldBatchNorm")
