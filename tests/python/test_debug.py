"""pypto.debug: compare_tensors against torch.isclose / numpy as the reference, and compare_layers
on a real model (torchvision ResNet-18, eval, random weights) with one layer made wrong on purpose
in the compiled copy only: the layer must be the first one named, and every layer before it must
agree."""

import copy

import numpy as np
import pytest
import torch
import torchvision

import pypto
from pypto import debug


# ---- compare_tensors ----

def test_compare_tensors_matches_torch_isclose():
    g = torch.Generator().manual_seed(0)
    b = torch.randn(7, 17, 5, generator=g)
    a = b + torch.randn(7, 17, 5, generator=g) * 1e-3
    a[3, 4, 2] += 0.5
    a[0, 0, 0] = float("nan")
    b[1, 1, 1] = float("nan")
    a[2, 2, 2] = b[2, 2, 2] = float("nan")  # NaN vs NaN agrees
    a[4, 0, 1] = float("inf")
    a[5, 5, 0], b[5, 5, 0] = float("-inf"), float("-inf")  # the same infinity agrees
    for rtol, atol in [(1e-3, 1e-5), (1e-2, 1e-3), (0.0, 0.0)]:
        r = debug.compare_tensors(a, b, rtol=rtol, atol=atol, verbose=False)
        close = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        assert r.mismatches == int((~close).sum())
        assert r.ok == bool(close.all()) is False
        finite = torch.isfinite(a) & torch.isfinite(b)
        d = (a.double() - b.double()).abs()[finite]
        assert r.max_abs_error == pytest.approx(float(d.max()))
        rel = d / b.double().abs()[finite]
        assert r.max_rel_error == pytest.approx(float(rel.max()))
    assert r.nan_mismatches == 2 and r.inf_mismatches == 1
    assert r.worst_index == (0, 0, 0)  # the first disagreement comes first
    assert r.numel == 7 * 17 * 5 and r.shape == (7, 17, 5) and r.dtype == "float32"


def test_compare_tensors_worst_index_and_output(capsys):
    b = np.zeros((3, 4), np.float32)
    a = b.copy()
    a[2, 1] = 0.25
    a[0, 3] = -0.5
    r = debug.compare_tensors(a, b)  # verbose by default
    assert r.worst_index == (0, 3) and r.worst_actual == -0.5 and r.worst_expected == 0.0
    assert r.mismatches == 2 and not r.ok
    printed = capsys.readouterr().out
    assert printed.strip() == str(r)
    assert "MISMATCH" in printed and "2 of 12 elements" in printed and "(0, 3)" in printed
    ok = debug.compare_tensors(b, b, verbose=False)
    assert ok.ok and ok.worst_index is None and ok.max_abs_error == 0
    assert capsys.readouterr().out == ""
    assert str(ok).startswith("OK")


def test_compare_tensors_dtypes_and_errors():
    x = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    assert debug.compare_tensors(x, x.numpy(), verbose=False).ok  # torch vs numpy, same dtype
    y = x.clone()
    y[1, 2] = 9
    r = debug.compare_tensors(y, x, rtol=0, atol=0, verbose=False)
    assert r.mismatches == 1 and r.max_abs_error == 4 and r.worst_index == (1, 2)
    h = torch.randn(4, 4, dtype=torch.bfloat16)
    assert debug.compare_tensors(h, h.clone(), verbose=False).ok
    with pytest.raises(ValueError, match="shapes differ"):
        debug.compare_tensors(torch.zeros(2, 3), torch.zeros(3, 2))
    with pytest.raises(TypeError, match="dtypes differ"):
        debug.compare_tensors(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    with pytest.raises(TypeError, match="torch.Tensor or numpy.ndarray"):
        debug.compare_tensors([1.0, 2.0], torch.zeros(2))
    with pytest.raises(ValueError, match="rtol and atol"):
        debug.compare_tensors(torch.zeros(2), torch.zeros(2), rtol=-1)


# ---- compare_layers ----

@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return torchvision.models.resnet18().eval(), torch.randn(1, 3, 48, 48)


def perturbed(model, layer: str, factor: float = 1.5):
    """A copy of `model` whose `layer` has its weight scaled: the original is untouched."""
    bad = copy.deepcopy(model)
    with torch.no_grad():
        bad.get_submodule(layer).weight.mul_(factor)
    return bad


def assert_first_is(report, layer):
    names = [x.name for x in report.layers]
    first = report.first_mismatch
    assert first is not None, str(report)
    # Every layer that ran before the first mismatch agrees, and it is the first that does not.
    before = report.layers[:report.layers.index(first)]
    assert before and all(x.comparison.ok for x in before), str(report)
    assert layer in names or layer in first.covers, str(report)
    return first


def test_compare_layers_names_a_perturbed_layer_unfused(resnet):
    model, x = resnet
    fast = pypto.optimize(perturbed(model, "layer2.0.conv2"), (x,), level=0)
    report = debug.compare_layers(model, fast, (x,))
    first = assert_first_is(report, "layer2.0.conv2")
    assert first.name == "layer2.0.conv2" and first.module_type == "Conv2d"  # exactly it
    assert not first.comparison.ok and first.comparison.max_abs_error > 0.01
    assert not report.ok and report.unmatched == []  # level 0 materializes every layer
    assert "first layer beyond tolerance: layer2.0.conv2 (Conv2d)" in str(report)


def test_compare_layers_maps_fused_kernels_to_their_last_module(resnet):
    model, x = resnet
    fast = pypto.optimize(perturbed(model, "layer3.1.conv1"), (x,), level=2)
    report = debug.compare_layers(model, fast, (x,))
    first = assert_first_is(report, "layer3.1.conv1")
    # conv1 + bn1 (folded) + relu are one kernel whose one output is the ReLU's.
    assert first.name == "layer3.1.relu" and "layer3.1.conv1" in first.covers, str(report)
    assert first.kernel.startswith("Conv")
    assert "layer3.1.conv1" in report.unmatched  # inside the kernel


def test_compare_layers_level3_compares_in_nchw_and_passes(resnet):
    model, x = resnet
    fast = pypto.optimize(model, (x,), level=3)
    report = debug.compare_layers(model, fast, (x,), verbose=False)
    assert report.ok, str(report)
    assert any(x.kernel.startswith("ConvBlocked") for x in report.layers)
    assert len(report.layers) > 30
    names = [x.label for x in report.layers]
    assert names.index("layer1.0.relu") < names.index("layer2.0.relu") < names.index("fc")


def test_compare_layers_finds_a_broken_kernel(resnet, monkeypatch):
    """A kernel whose output is wrong (PTO_TEST_PERTURB_VALUE adds 1 to it), not a weight."""
    model, x = resnet
    probe = pypto.optimize(model, (x,), level=2)
    value = next(v for v, mods in probe._captured.module_outputs.items()
                 if ("layer2.1.relu", 0) in mods)
    monkeypatch.setenv("PTO_TEST_PERTURB_VALUE", value)
    fast = pypto.optimize(model, (x,), level=2)
    report = debug.compare_layers(model, fast, (x,))
    first = assert_first_is(report, "layer2.1.relu")
    assert first.label == "layer2.1.relu"
    assert first.comparison.max_abs_error == pytest.approx(1.0, abs=1e-5)


def test_compare_layers_with_keyword_inputs_on_a_transformer():
    """A Hugging Face BERT called with keyword arguments (input_ids=, attention_mask=), compiled
    by compare_layers itself (compiled=None), then a copy with one feed-forward layer wrong."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3,
                                     num_attention_heads=4, intermediate_size=64)
    model = transformers.BertModel(config).eval()
    kwargs = {"input_ids": torch.randint(0, 100, (2, 9)),
              "attention_mask": torch.ones(2, 9, dtype=torch.int64)}
    kwargs["attention_mask"][1, 6:] = 0
    report = debug.compare_layers(model, None, (), kwargs=kwargs)
    assert report.ok, str(report)
    labels = [x.label for x in report.layers]
    assert len(labels) > 10 and any(n.startswith("encoder.layer.2.") for n in labels), labels

    bad = perturbed(model, "encoder.layer.1.intermediate.dense", 2.0)
    fast = pypto.optimize(bad, example_kwargs=kwargs)
    report = debug.compare_layers(model, fast, (), kwargs=kwargs)
    # The dense layer and its GELU, and the output dense and its residual Add, run fused: the
    # first output compared after them is layer 1's output LayerNorm, and all before it agree.
    first = report.first_mismatch
    assert first is not None and first.name == "encoder.layer.1.output.LayerNorm", str(report)
    before = report.layers[:report.layers.index(first)]
    assert before and all(x.comparison.ok for x in before), str(report)
    assert "encoder.layer.1.intermediate.dense" in report.unmatched, str(report)


def test_compare_layers_errors(resnet, capsys):
    model, x = resnet
    with pytest.raises(TypeError, match="what pypto.optimize returned"):
        debug.compare_layers(model, model, (x,))
    small = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    fast = pypto.optimize(small, (torch.randn(2, 4),))
    with pytest.raises(ValueError, match="rtol and atol"):
        debug.compare_layers(small, fast, torch.randn(2, 4), atol=-1)
    report = debug.compare_layers(small, fast, torch.randn(2, 4), verbose=True)
    assert report.ok and str(report) in capsys.readouterr().out


def test_run_values_are_every_kernel_output():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4),
                                torch.nn.Softmax(dim=1)).eval()
    x = torch.randn(3, 8)
    for level in (0, 2):
        fast = pypto.optimize(model, (x,), level=level)
        cg = fast.compiled
        values = cg.run_values([x])
        steps = cg.steps
        # One entry per kernel output, in step order, the graph output among them.
        assert [s for s, _, _ in values] == sorted(s for s, _, _ in values)
        assert {s for s, _, _ in values} == set(range(len(steps)))
        by_name = {n: v for _, n, v in values}
        assert len(by_name) == len(values)
        torch.testing.assert_close(by_name[cg.output_names[0]], model(x), rtol=1e-5, atol=1e-6)
        if level == 0:  # every node is its own kernel: the hidden ReLU is there
            hidden = torch.relu(model[0](x))
            assert any(v.shape == hidden.shape and torch.allclose(v, hidden, atol=1e-6)
                       for _, _, v in values)
