"""Whole models through `pto run`, compared with onnxruntime on the same inputs.

ResNet-18, MobileNetV2, BERT-base and GPT-2 small, built in code with random weights (seed 0) and
exported once to a cache outside the clone (see export_models.py). Every output must agree with
onnxruntime to max|got - want| / max|want| <= 1e-4, with the same dtype and shape.
"""

import pytest

import export_models as em

TOLERANCE = 1e-4


@pytest.mark.parametrize("name", list(em.MODELS))
def test_model_matches_onnxruntime(name, pto_run, tmp_path):
    model = em.export(name)
    inputs = em.make_inputs(name)
    want = em.run_onnxruntime(model, inputs)
    assert list(want) == list(em.MODELS[name].outputs)
    got = pto_run(model, inputs, list(want), tmp_path)
    for out, w in want.items():
        g = got[out]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"output '{out}'"
        err = em.relative_error(g, w)
        assert err <= TOLERANCE, f"output '{out}': relative error {err:.3e} > {TOLERANCE:g}"


def test_relative_error():
    import numpy as np

    want = np.array([[1.0, -4.0], [2.0, 0.0]], dtype=np.float32)
    assert em.relative_error(want, want) == 0.0
    assert em.relative_error(want + np.float32(0.5), want) == pytest.approx(0.125)
    assert em.relative_error(np.array([np.nan]), np.array([1.0])) != 0.0  # NaN never passes
    assert not em.relative_error(np.array([np.nan]), np.array([1.0])) <= TOLERANCE


def test_output_file_names(tmp_path):
    assert em.output_file(tmp_path, "logits").name == "logits.npy"
    assert em.output_file(tmp_path, "/encoder/Add_1:0 out").name == "_encoder_Add_1_0_out.npy"
