"""Classical-ML models (ONNX domain ai.onnx.ml): each op and attribute form PyPTO reads, built
with onnx.helper and run on PyPTO and on onnxruntime with the same random inputs; and real
scikit-learn models exported by skl2onnx, against onnxruntime and scikit-learn's own predictions.
The tree ensembles run on PyPTO's CPU kernel, checked against the reference interpreter too."""

import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import pypto

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _seed(request):
    """Each test draws from its own seed, whatever order (and worker) the tests run in."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
# onnxruntime evaluates probit's approximation in float32: near p = 0.5, (1 - x)(1 + x) rounds to
# 1 and its log loses most digits (-0.00098 for -0.00054 in double), and near 0 and 1 it is steep.
PROBIT_TOL = 1e-3
NP_TO_ONNX = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
              np.int64: TensorProto.INT64, np.int32: TensorProto.INT32}


def _model(node, x_type, outputs, ml_opset=3, extra_inputs=()):
    """A one-node model: input x of `x_type` [N, F], the node's outputs as (name, type)."""
    ins = [helper.make_tensor_value_info("x", x_type, None)] + list(extra_inputs)
    outs = [helper.make_tensor_value_info(n, t, None) if t is not None
            else onnx.ValueInfoProto(name=n) for n, t in outputs]
    g = helper.make_graph([node], "ml", ins, outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("ai.onnx.ml", ml_opset)])


def _run_both(tmp_path, model, feeds, level=None):
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    exe = pypto.onnx.load(str(path)) if level is None else pypto.onnx.load(str(path), level)
    got = exe(**feeds)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    return want, [np.asarray(g) for g in got], exe


def _compare(want, got, rtol=1e-5, atol=1e-5):
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert w.shape == g.shape, (w.shape, g.shape)
        assert w.dtype == g.dtype, (w.dtype, g.dtype)
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def _check(tmp_path, model, feeds, rtol=1e-5, atol=1e-5, backend=None):
    """PyPTO (level 1, kernels) and the reference interpreter (level 0) against onnxruntime."""
    want, got, exe = _run_both(tmp_path, model, feeds)
    _compare(want, got, rtol, atol)
    if backend:
        assert all(b == backend for _, b in exe._compiled.node_backends), \
            exe._compiled.node_backends
    _, ref, _ = _run_both(tmp_path, model, feeds, level=0)
    _compare(want, ref, rtol, atol)


# ---- random forests in the opset 1/3 form (ids per tree and node) ----

def _forest(n_trees, depth, n_features, rng, modes=("BRANCH_LEQ",), missing=False, splits=None):
    """Complete trees of `depth`: node attributes and, per leaf, (tree, node id)."""
    a = {k: [] for k in ["nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_values", "nodes_truenodeids", "nodes_falsenodeids",
                         "nodes_missing_value_tracks_true"]}
    leaves = []
    for t in range(n_trees):
        # Node ids shuffled within the tree, so that nothing depends on ids being positions.
        count = 2 ** (depth + 1) - 1
        ids = rng.permutation(count)
        for pos in range(count):
            interior = pos < 2 ** depth - 1
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(int(ids[pos]))
            a["nodes_featureids"].append(int(rng.integers(n_features)) if interior else 0)
            a["nodes_modes"].append(str(rng.choice(modes)) if interior else "LEAF")
            v = rng.choice(splits) if splits is not None else rng.standard_normal() * 0.7
            a["nodes_values"].append(float(v) if interior else 0.0)
            a["nodes_truenodeids"].append(int(ids[2 * pos + 1]) if interior else 0)
            a["nodes_falsenodeids"].append(int(ids[2 * pos + 2]) if interior else 0)
            a["nodes_missing_value_tracks_true"].append(int(rng.integers(2)) if missing else 0)
            if not interior:
                leaves.append((t, int(ids[pos])))
    if not missing:
        del a["nodes_missing_value_tracks_true"]
    return a, leaves


def _regressor(n_trees=5, depth=3, n_features=4, n_targets=1, rng=None, agg="SUM", post="NONE",
               base=None, as_tensor=False, **kw):
    rng = RNG if rng is None else rng
    a, leaves = _forest(n_trees, depth, n_features, rng, **kw)
    w = {"target_treeids": [], "target_nodeids": [], "target_ids": [], "target_weights": []}
    for t, n in leaves:
        for k in range(n_targets):
            if n_targets > 1 and rng.random() < 0.3:
                continue  # a leaf with no weight for some targets
            w["target_treeids"].append(t)
            w["target_nodeids"].append(n)
            w["target_ids"].append(k)
            w["target_weights"].append(float(rng.standard_normal()))
    a.update(w)
    if as_tensor:  # opset 3's double-precision spellings
        for name in ["nodes_values", "target_weights"]:
            a[name + "_as_tensor"] = helper.make_tensor(name, TensorProto.DOUBLE,
                                                        [len(a[name])], a.pop(name))
    if base is not None:
        a["base_values"] = base
    return helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                            n_targets=n_targets, aggregate_function=agg, post_transform=post,
                            **a)


def _x(n, f, dtype=np.float32, nan=False):
    x = RNG.standard_normal((n, f))
    if nan:
        x[RNG.random((n, f)) < 0.2] = np.nan
    if np.dtype(dtype).kind == "i":
        return np.round(x * 2).astype(dtype)
    return x.astype(dtype)


@pytest.mark.parametrize("mode", MODES)
def test_regressor_modes(tmp_path, mode):
    # Thresholds on a grid the inputs also take, so EQ and NEQ split rows both ways.
    node = _regressor(6, 3, 5, modes=(mode,), splits=[-1.0, 0.0, 1.0])
    x = np.round(_x(37, 5)).astype(np.float32)
    _check(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)]), {"x": x},
           backend="cpu")


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("targets", [1, 3])
def test_regressor_aggregates(tmp_path, agg, targets):
    base = list(RNG.standard_normal(targets).astype(float))
    node = _regressor(7, 4, 6, n_targets=targets, agg=agg, base=base, modes=MODES[:4])
    for n in [1, 17, 300]:
        _check(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)]),
               {"x": _x(n, 6)}, backend="cpu")


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"])
@pytest.mark.parametrize("targets", [1, 4])
def test_regressor_post_transforms(tmp_path, post, targets):
    node = _regressor(3, 3, 4, n_targets=targets, post=post)
    if post == "PROBIT":  # probit of a probability: leaf weights in (0, 1 / trees)
        for a in node.attribute:
            if a.name == "target_weights":
                a.floats[:] = list(RNG.random(len(a.floats)) / 3.5)
    tol = PROBIT_TOL if post == "PROBIT" else 1e-5
    _check(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)]),
           {"x": _x(50, 4)}, rtol=tol, atol=tol, backend="cpu")


def test_regressor_missing_values_track_true(tmp_path):
    node = _regressor(8, 4, 5, missing=True, modes=MODES)
    _check(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)]),
           {"x": _x(200, 5, nan=True)}, backend="cpu")


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_regressor_input_types(tmp_path, dtype):
    node = _regressor(5, 3, 4, n_targets=2, as_tensor=dtype == np.float64, modes=MODES[:4])
    x = _x(40, 4, dtype)
    if dtype == np.float64:
        _check(tmp_path, _model(node, TensorProto.DOUBLE, [("y", TensorProto.FLOAT)]), {"x": x},
               backend="cpu")
        return
    # Integer X is compared as float (the spec); onnxruntime has no integer kernel: against
    # onnxruntime on float X.
    want, _, _ = _run_both(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)]),
                           {"x": x.astype(np.float32)})
    path = tmp_path / "int.onnx"
    onnx.save(_model(node, NP_TO_ONNX[dtype], [("y", TensorProto.FLOAT)]), path)
    for level in [None, 0]:
        exe = pypto.onnx.load(str(path)) if level is None else pypto.onnx.load(str(path), level)
        np.testing.assert_allclose(np.asarray(exe(x=x)), want[0], rtol=1e-5, atol=1e-5)


# ---- classifiers ----

def _classifier(n_trees, depth, n_features, labels, classes_weighted, rng=None, post="NONE",
                base=None, positive=False, **kw):
    rng = RNG if rng is None else rng
    a, leaves = _forest(n_trees, depth, n_features, rng, **kw)
    w = {"class_treeids": [], "class_nodeids": [], "class_ids": [], "class_weights": []}
    for t, n in leaves:
        for k in classes_weighted:
            w["class_treeids"].append(t)
            w["class_nodeids"].append(n)
            w["class_ids"].append(k)
            v = rng.random() / n_trees if positive else rng.standard_normal()
            w["class_weights"].append(float(v))
    a.update(w)
    if base is not None:
        a["base_values"] = base
    return helper.make_node("TreeEnsembleClassifier", ["x"], ["label", "scores"],
                            domain="ai.onnx.ml", classlabels_int64s=labels, post_transform=post,
                            **a)


CLASSIFIERS = [  # labels, classes with weights, positive weights, base values
    ([10, 20, 30], [0, 1, 2], False, None),
    ([10, 20, 30], [0, 1, 2], True, [0.1, -0.2, 0.3]),
    ([10, 20, 30, 40], [0, 2], False, [0.5, 0.0, 0.2, -0.1]),  # classes no leaf weighs
    ([0, 1], [0, 1], True, None),  # two classes, both weighted (a random forest)
    ([0, 1], [0, 1], False, [0.3, 0.3]),
    ([3, 7], [1], True, None),  # one weight column: onnxruntime's binary case
    ([3, 7], [1], False, None),
    ([3, 7], [0], False, [0.25]),  # one base value (skl2onnx's binary gradient boosting)
    ([3, 7], [1], False, [0.2, 0.2]),
]


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("labels,weighted,positive,base", CLASSIFIERS)
def test_classifier(tmp_path, labels, weighted, positive, base, post):
    node = _classifier(5, 3, 4, labels, weighted, post=post, base=base, positive=positive,
                       modes=MODES[:4])
    model = _model(node, TensorProto.FLOAT, [("label", TensorProto.INT64),
                                              ("scores", TensorProto.FLOAT)])
    _check(tmp_path, model, {"x": _x(120, 4)}, backend="cpu")


def test_classifier_double_input_as_tensor(tmp_path):
    node = _classifier(4, 3, 4, [1, 2, 5], [0, 1, 2], post="SOFTMAX")
    for name in ["nodes_values", "class_weights"]:
        a = next(a for a in node.attribute if a.name == name)
        node.attribute.remove(a)
        node.attribute.append(helper.make_attribute(
            name + "_as_tensor", helper.make_tensor(name, TensorProto.DOUBLE, [len(a.floats)],
                                                    list(a.floats))))
    model = _model(node, TensorProto.DOUBLE, [("label", TensorProto.INT64),
                                               ("scores", TensorProto.FLOAT)])
    _check(tmp_path, model, {"x": _x(60, 4, np.float64)}, backend="cpu")


def test_classifier_string_labels_rejected(tmp_path):
    node = _classifier(2, 2, 3, [0, 1], [0, 1])
    a = next(a for a in node.attribute if a.name == "classlabels_int64s")
    node.attribute.remove(a)
    node.attribute.append(helper.make_attribute("classlabels_strings", ["no", "yes"]))
    model = _model(node, TensorProto.FLOAT, [("label", None),
                                              ("scores", TensorProto.FLOAT)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    with pytest.raises(NotImplementedError, match="string class labels.*integer labels"):
        pypto.onnx.load(str(path))  # at import


# ---- TreeEnsemble (ai.onnx.ml opset 5) ----

def _tree_ensemble(n_trees, depth, n_features, n_targets, rng=None, dtype=np.float32, agg=1,
                   post=0, member=False, leaf_tree=False, missing=False):
    """Complete trees in TreeEnsemble's form: interior nodes and leaves indexed separately."""
    rng = RNG if rng is None else rng
    a = {k: [] for k in ["nodes_featureids", "nodes_modes", "nodes_splits", "nodes_truenodeids",
                         "nodes_falsenodeids", "nodes_trueleafs", "nodes_falseleafs",
                         "nodes_missing_value_tracks_true", "leaf_targetids", "leaf_weights",
                         "tree_roots"]}
    members = []
    for _ in range(n_trees):
        base_node, base_leaf = len(a["nodes_featureids"]), len(a["leaf_weights"])
        a["tree_roots"].append(base_node)
        interior = 2 ** depth - 1
        for pos in range(interior):
            mode = int(rng.integers(7 if member else 6))
            a["nodes_featureids"].append(int(rng.integers(n_features)))
            a["nodes_modes"].append(mode)
            a["nodes_splits"].append(float(rng.integers(-2, 3)))
            a["nodes_missing_value_tracks_true"].append(int(rng.integers(2)) if missing else 0)
            if mode == 6:
                members += [float(v) for v in rng.choice([-2, -1, 0, 1, 2], 2, replace=False)]
                members.append(np.nan)
            for side, child in (("true", 2 * pos + 1), ("false", 2 * pos + 2)):
                leaf = child >= interior
                a[f"nodes_{side}leafs"].append(int(leaf))
                a[f"nodes_{side}nodeids"].append(base_leaf + child - interior if leaf
                                                 else base_node + child)
        for _ in range(interior + 1):
            a["leaf_targetids"].append(int(rng.integers(n_targets)))
            a["leaf_weights"].append(float(rng.standard_normal()))
    if leaf_tree:  # a tree that is one leaf: both children of its root the same leaf
        a["tree_roots"].append(len(a["nodes_featureids"]))
        for k, v in [("nodes_featureids", 0), ("nodes_modes", 0), ("nodes_splits", 0.0),
                     ("nodes_missing_value_tracks_true", 0), ("nodes_trueleafs", 1),
                     ("nodes_falseleafs", 1)]:
            a[k].append(v)
        a["nodes_truenodeids"].append(len(a["leaf_weights"]))
        a["nodes_falsenodeids"].append(len(a["leaf_weights"]))
        a["leaf_targetids"].append(0)
        a["leaf_weights"].append(0.75)
    t = NP_TO_ONNX[dtype]
    attrs = {k: v for k, v in a.items() if k not in ["nodes_modes", "nodes_splits",
                                                     "leaf_weights"]}
    if not missing:
        del attrs["nodes_missing_value_tracks_true"]
    attrs["nodes_modes"] = helper.make_tensor("m", TensorProto.UINT8, [len(a["nodes_modes"])],
                                              a["nodes_modes"])
    attrs["nodes_splits"] = helper.make_tensor("s", t, [len(a["nodes_splits"])],
                                               a["nodes_splits"])
    attrs["leaf_weights"] = helper.make_tensor("w", t, [len(a["leaf_weights"])],
                                               a["leaf_weights"])
    if member:
        attrs["membership_values"] = helper.make_tensor("mv", t, [len(members)], members)
    return helper.make_node("TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml",
                            n_targets=n_targets, aggregate_function=agg, post_transform=post,
                            **attrs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("agg", [0, 1, 2, 3])
def test_tree_ensemble(tmp_path, dtype, agg):
    node = _tree_ensemble(6, 3, 5, 3, dtype=dtype, agg=agg, member=True, leaf_tree=True,
                          missing=True)
    x = np.round(_x(90, 5, dtype, nan=True))
    _check(tmp_path, _model(node, NP_TO_ONNX[dtype], [("y", NP_TO_ONNX[dtype])], ml_opset=5),
           {"x": x}, backend="cpu")


@pytest.mark.parametrize("post", [0, 3, 4])
def test_tree_ensemble_post_transform(tmp_path, post):
    node = _tree_ensemble(4, 3, 4, 3, post=post)
    if post == 4:  # probit of a probability: leaf weights in (0, 1 / trees)
        w = next(a for a in node.attribute if a.name == "leaf_weights")
        w.t.float_data[:] = list(RNG.random(len(w.t.float_data)) / 4.5)
    tol = PROBIT_TOL if post == 4 else 1e-5
    _check(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)], ml_opset=5),
           {"x": np.round(_x(30, 4))}, rtol=tol, atol=tol, backend="cpu")


@pytest.mark.parametrize("post", [1, 2])
def test_tree_ensemble_softmax_logistic(tmp_path, post):
    """post_transform 1 is SOFTMAX and 2 LOGISTIC (the spec; onnxruntime 1.2x swaps them), so
    checked against numpy on onnxruntime's untransformed scores."""
    node = _tree_ensemble(4, 3, 4, 3, post=0)
    x = {"x": np.round(_x(30, 4))}
    raw, _, _ = _run_both(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)],
                                           ml_opset=5), x)
    raw = raw[0].astype(np.float64)
    want = (np.exp(raw - raw.max(1, keepdims=True)) / np.exp(raw - raw.max(1, keepdims=True))
            .sum(1, keepdims=True)) if post == 1 else 1 / (1 + np.exp(-raw))
    next(a for a in node.attribute if a.name == "post_transform").i = post
    path = tmp_path / "m.onnx"
    onnx.save(_model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)], ml_opset=5), path)
    for level in [None, 0]:
        exe = pypto.onnx.load(str(path)) if level is None else pypto.onnx.load(str(path), level)
        np.testing.assert_allclose(np.asarray(exe(**x)), want, rtol=1e-5, atol=1e-6)


def test_tree_ensemble_needs_opset_5(tmp_path):
    node = _tree_ensemble(1, 2, 2, 1)
    path = tmp_path / "m.onnx"
    onnx.save(_model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)], ml_opset=3), path)
    with pytest.raises(ValueError, match="TreeEnsemble is an op of ai.onnx.ml opset 5"):
        pypto.onnx.load(str(path))


def test_old_tree_ensembles_deprecated_at_opset_5(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_model(_regressor(2, 2, 3), TensorProto.FLOAT, [("y", TensorProto.FLOAT)],
                     ml_opset=5), path)
    with pytest.raises(ValueError, match="deprecated at ai.onnx.ml opset 5.*TreeEnsemble"):
        pypto.onnx.load(str(path))


def test_deep_lopsided_tree(tmp_path):
    """A chain 60 nodes deep (deeper than the CPU kernel's branch-free form takes) of BRANCH_LEQ
    nodes, each with a leaf on its true side, and a shallow tree beside it."""
    depth = 60
    a = {k: [] for k in ["nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_values", "nodes_truenodeids", "nodes_falsenodeids"]}
    w = {"target_treeids": [], "target_nodeids": [], "target_ids": [], "target_weights": []}

    def add(tree, node, feature, mode, value, t, f):
        for k, v in zip(a, [tree, node, feature, mode, value, t, f]):
            a[k].append(v)

    for i in range(depth):  # interior node 2i, its leaf 2i + 1, then node 2i + 2
        add(0, 2 * i, i % 4, "BRANCH_LEQ", float(-1.5 + 3 * i / depth), 2 * i + 1, 2 * i + 2)
    for leaf in list(range(1, 2 * depth, 2)) + [2 * depth]:
        add(0, leaf, 0, "LEAF", 0.0, 0, 0)
        w["target_treeids"].append(0)
        w["target_nodeids"].append(leaf)
        w["target_ids"].append(0)
        w["target_weights"].append(float(leaf))
    add(1, 0, 1, "BRANCH_LEQ", 0.0, 1, 2)
    for leaf in [1, 2]:
        add(1, leaf, 0, "LEAF", 0.0, 0, 0)
        w["target_treeids"].append(1)
        w["target_nodeids"].append(leaf)
        w["target_ids"].append(0)
        w["target_weights"].append(0.5 * leaf)
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                            n_targets=1, **a, **w)
    _check(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)]),
           {"x": _x(100, 4) * 2}, backend="cpu")


def test_cyclic_tree_rejected(tmp_path):
    node = _regressor(1, 2, 3)
    true_ids = next(a for a in node.attribute if a.name == "nodes_truenodeids")
    node_ids = next(a for a in node.attribute if a.name == "nodes_nodeids")
    true_ids.ints[1] = node_ids.ints[0]  # the root's left child points back at the root
    path = tmp_path / "m.onnx"
    onnx.save(_model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)]), path)
    with pytest.raises(ValueError, match="cycle"):
        pypto.onnx.load(str(path))(x=_x(2, 3))


# ---- linear models ----

@pytest.mark.parametrize("targets", [1, 3])
@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC", "PROBIT"])
def test_linear_regressor(tmp_path, targets, post):
    f = 5
    coef = RNG.standard_normal(targets * f) * (0.02 if post == "PROBIT" else 1)
    icpt = RNG.standard_normal(targets) * 0.05 + (0.5 if post == "PROBIT" else 0)
    node = helper.make_node("LinearRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                            coefficients=list(coef), intercepts=list(icpt), targets=targets,
                            post_transform=post)
    tol = PROBIT_TOL if post == "PROBIT" else 1e-5
    _check(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)]),
           {"x": _x(23, f)}, rtol=tol, atol=tol)
    if post == "NONE":  # onnxruntime reads float X only; the others against numpy
        for dtype in [np.float64, np.int64, np.int32]:
            x = _x(23, f, dtype)
            path = tmp_path / "m.onnx"
            onnx.save(_model(node, NP_TO_ONNX[dtype], [("y", TensorProto.FLOAT)]), path)
            want = x.astype(np.float64) @ coef.reshape(targets, f).T + icpt
            np.testing.assert_allclose(np.asarray(pypto.onnx.load(str(path))(x=x)), want,
                                       rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("classes,labels", [(3, [4, 5, 6]), (1, [0, 1]), (1, [7, 9]), (1, [])])
@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"])
def test_linear_classifier(tmp_path, classes, labels, post):
    f = 4
    attrs = {"coefficients": list(RNG.standard_normal(classes * f)),
             "intercepts": list(RNG.standard_normal(classes)), "post_transform": post}
    if labels:
        attrs["classlabels_ints"] = labels
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
                            **attrs)
    model = _model(node, TensorProto.FLOAT, [("label", TensorProto.INT64),
                                              ("scores", TensorProto.FLOAT)])
    _check(tmp_path, model, {"x": _x(31, f)})


# ---- preprocessing ----

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_scaler(tmp_path, dtype):
    for offset, scale in [([0.5], [2.0]), (list(RNG.standard_normal(4)), list(RNG.random(4)))]:
        node = helper.make_node("Scaler", ["x"], ["y"], domain="ai.onnx.ml", offset=offset,
                                scale=scale)
        _check(tmp_path, _model(node, NP_TO_ONNX[dtype], [("y", TensorProto.FLOAT)]),
               {"x": _x(9, 4, dtype)})


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer(tmp_path, norm):
    node = helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm=norm)
    x = _x(12, 5)
    x[3] = 0  # a zero row
    for dtype in [np.float32, np.float64, np.int64]:
        _check(tmp_path, _model(node, NP_TO_ONNX[dtype], [("y", TensorProto.FLOAT)]),
               {"x": x.astype(dtype)})


def test_binarizer(tmp_path):
    node = helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.25)
    _check(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)]),
           {"x": _x(10, 7)})
    for dtype in [np.float64, np.int64]:  # onnxruntime reads float only: against numpy
        x = _x(10, 7, dtype)
        path = tmp_path / "m.onnx"
        onnx.save(_model(node, NP_TO_ONNX[dtype], [("y", NP_TO_ONNX[dtype])]), path)
        got = np.asarray(pypto.onnx.load(str(path))(x=x))
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, (x > 0.25).astype(dtype))


def test_array_feature_extractor(tmp_path):
    idx = helper.make_tensor_value_info("i", TensorProto.INT64, None)
    node = helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml")
    for dtype, shape in [(np.float32, (6, 5)), (np.int64, (2, 3, 5)), (np.float64, (5,))]:
        model = _model(node, NP_TO_ONNX[dtype], [("y", NP_TO_ONNX[dtype])], extra_inputs=[idx])
        x = _x(int(np.prod(shape)), 1, dtype).reshape(shape)
        _check(tmp_path, model, {"x": x, "i": np.array([4, 0, 2, 2], np.int64)})


def test_imputer(tmp_path):
    node = helper.make_node("Imputer", ["x"], ["y"], domain="ai.onnx.ml",
                            imputed_value_floats=[1.5, -2.0, 3.0], replaced_value_float=np.nan)
    _check(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)]),
           {"x": _x(20, 3, nan=True)})
    node = helper.make_node("Imputer", ["x"], ["y"], domain="ai.onnx.ml",
                            imputed_value_int64s=[9], replaced_value_int64=0)
    _check(tmp_path, _model(node, TensorProto.INT64, [("y", TensorProto.INT64)]),
           {"x": _x(20, 3, np.int64)})


@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.float64])
def test_one_hot_encoder(tmp_path, dtype):
    node = helper.make_node("OneHotEncoder", ["x"], ["y"], domain="ai.onnx.ml",
                            cats_int64s=[-1, 0, 2, 3], zeros=1)
    _check(tmp_path, _model(node, NP_TO_ONNX[dtype], [("y", TensorProto.FLOAT)]),
           {"x": _x(8, 3, np.int64).astype(dtype)})


def test_label_encoder(tmp_path):
    cases = [(dict(keys_int64s=[1, 2, 3], values_int64s=[10, 20, 30], default_int64=-5),
              TensorProto.INT64, TensorProto.INT64, np.int64),
             (dict(keys_int64s=[-1, 0, 1], values_floats=[0.5, 1.5, 2.5], default_float=9.0),
              TensorProto.INT64, TensorProto.FLOAT, np.int64),
             (dict(keys_floats=[-1.0, 0.0, 1.0], values_int64s=[7, 8, 9]),
              TensorProto.FLOAT, TensorProto.INT64, np.float32)]
    for attrs, tin, tout, dtype in cases:
        node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", **attrs)
        _check(tmp_path, _model(node, tin, [("y", tout)], ml_opset=2),
               {"x": np.round(_x(9, 2)).astype(dtype)})


def test_feature_vectorizer(tmp_path):
    node = helper.make_node("FeatureVectorizer", ["x", "x2"], ["y"], domain="ai.onnx.ml",
                            inputdimensions=[3, 4])
    x2 = helper.make_tensor_value_info("x2", TensorProto.FLOAT, None)
    model = _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)], extra_inputs=[x2])
    _check(tmp_path, model, {"x": _x(6, 3), "x2": _x(6, 2)})  # x2 zero-padded to 4 columns


# ---- scikit-learn models exported by skl2onnx ----

sklearn = pytest.importorskip("sklearn")
skl2onnx = pytest.importorskip("skl2onnx")


def _sk_data(classes=3, n=300, f=6):
    x = RNG.standard_normal((n, f)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    if classes == 3:
        y += (x[:, 2] > 0.8).astype(np.int64)
    return x, y


def _sklearn_models():
    from sklearn.ensemble import (GradientBoostingClassifier, GradientBoostingRegressor,
                                  RandomForestClassifier, RandomForestRegressor)
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    return {
        "random_forest_classifier": (lambda: RandomForestClassifier(20, max_depth=6,
                                                                     random_state=0), 3),
        "random_forest_binary": (lambda: RandomForestClassifier(10, max_depth=5,
                                                                 random_state=0), 2),
        "random_forest_regressor": (lambda: RandomForestRegressor(20, max_depth=6,
                                                                   random_state=0), 0),
        "gradient_boosting_classifier": (lambda: GradientBoostingClassifier(
            n_estimators=20, random_state=0), 3),
        "gradient_boosting_binary": (lambda: GradientBoostingClassifier(
            n_estimators=20, random_state=0), 2),
        "gradient_boosting_regressor": (lambda: GradientBoostingRegressor(
            n_estimators=20, random_state=0), 0),
        "logistic_regression": (lambda: LogisticRegression(), 3),
        "logistic_regression_binary": (lambda: LogisticRegression(), 2),
        "linear_regression": (lambda: LinearRegression(), 0),
        "scaler_logistic_pipeline": (lambda: make_pipeline(StandardScaler(),
                                                           LogisticRegression()), 3),
    }


def _sk_run(tmp_path, model, x, rows, zipmap_off):
    """Exports the fitted model with skl2onnx; returns onnxruntime's and PyPTO's outputs on
    `rows` random rows, those rows, the executable and the input name."""
    options = {id(model): {"zipmap": False}} if zipmap_off else None
    onx = skl2onnx.to_onnx(model, x[:1], options=options)
    path = tmp_path / "m.onnx"
    onnx.save(onx, path)
    name_in = onx.graph.input[0].name
    test_x = RNG.standard_normal((rows, x.shape[1])).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {name_in: test_x})
    exe = pypto.onnx.load(str(path))
    got = exe(**{name_in: test_x})
    got = [np.asarray(g) for g in (got if isinstance(got, (list, tuple)) else [got])]
    return want, got, test_x, exe, name_in, onx


@pytest.mark.parametrize("name", sorted(_sklearn_models()))
def test_sklearn_model(tmp_path, name):
    make, classes = _sklearn_models()[name]
    x, y = _sk_data(classes or 3)
    model = make().fit(x, y if classes else x[:, 0] * 2 + np.sin(x[:, 1]))
    want, got, test_x, exe, name_in, _ = _sk_run(tmp_path, model, x, 257, bool(classes))
    _compare(want, got, rtol=1e-5, atol=1e-5)
    # Written back (the ai.onnx.ml nodes keep their domain and opset), onnxruntime runs the file
    # PyPTO wrote to the same results.
    pypto.onnx.export(exe, None, tmp_path / "back.onnx")
    back = ort.InferenceSession(str(tmp_path / "back.onnx"),
                                providers=["CPUExecutionProvider"]).run(None, {name_in: test_x})
    _compare(want, back, rtol=0, atol=0)
    if classes:  # and scikit-learn's own predictions
        np.testing.assert_array_equal(got[0], model.predict(test_x))
        np.testing.assert_allclose(got[1], model.predict_proba(test_x), rtol=1e-4, atol=1e-5)
    else:
        np.testing.assert_allclose(got[0].ravel(), model.predict(test_x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", ["linear", "poly", "rbf", "sigmoid", "linear_svr"])
def test_sklearn_svm_regressor(tmp_path, kernel):
    from sklearn.svm import SVR, LinearSVR
    x, _ = _sk_data(3, n=120, f=4)
    model = (LinearSVR(max_iter=100000) if kernel == "linear_svr"
             else SVR(kernel=kernel, degree=2, gamma=0.3, coef0=0.5))
    model.fit(x, x[:, 0] * 2 + np.sin(x[:, 1]))
    want, got, test_x, _, _, onx = _sk_run(tmp_path, model, x, 53, False)
    assert {n.op_type for n in onx.graph.node} & {"SVMRegressor", "LinearRegressor"}
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[0].ravel(), model.predict(test_x), rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore:.*probability.*:FutureWarning")  # scikit-learn 1.9's SVC
@pytest.mark.filterwarnings("ignore:Attribute `prob:FutureWarning")
@pytest.mark.parametrize("kernel", ["linear", "poly", "rbf", "sigmoid"])
@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("probability", [False, True])
def test_sklearn_svm_classifier(tmp_path, kernel, classes, probability):
    from sklearn.svm import SVC
    x, y = _sk_data(classes, n=150, f=4)
    model = SVC(kernel=kernel, degree=2, gamma=0.3, coef0=0.5, probability=probability,
                random_state=0).fit(x, y)
    want, got, test_x, _, _, onx = _sk_run(tmp_path, model, x, 61, True)
    assert "SVMClassifier" in {n.op_type for n in onx.graph.node}
    # onnxruntime couples the pairwise probabilities in float32 (its iteration stops within
    # 0.005 / classes of the fixed point); the decisions are plain sums
    tol = 1e-3 if probability else 1e-4
    _compare(want, got, rtol=tol, atol=tol)
    np.testing.assert_array_equal(got[0], model.predict(test_x))


def test_svm_regressor_one_class(tmp_path):
    sv = RNG.standard_normal((5, 3))
    node = helper.make_node("SVMRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                            coefficients=list(RNG.standard_normal(5)), n_supports=5,
                            support_vectors=list(sv.ravel()), rho=[0.1], kernel_type="RBF",
                            kernel_params=[0.5, 0.0, 3.0], one_class=1)
    _check(tmp_path, _model(node, TensorProto.FLOAT, [("y", TensorProto.FLOAT)]),
           {"x": _x(40, 3)})


def test_zipmap_says_how_to_export(tmp_path):
    """A classifier exported with its ZipMap (skl2onnx's default) is refused with the export
    option that leaves it out; exported so, the same model loads and runs."""
    from sklearn.linear_model import LogisticRegression
    x, y = _sk_data(3)
    model = LogisticRegression().fit(x, y)
    path = tmp_path / "zipmap.onnx"
    onnx.save(skl2onnx.to_onnx(model, x[:1]), path)
    with pytest.raises(NotImplementedError, match=r"'zipmap': False"):
        pypto.onnx.load(str(path))
    onnx.save(skl2onnx.to_onnx(model, x[:1], options={id(model): {"zipmap": False}}), path)
    label, proba = pypto.onnx.load(str(path))(x)
    np.testing.assert_array_equal(np.asarray(label), model.predict(x))
    np.testing.assert_allclose(np.asarray(proba), model.predict_proba(x), rtol=1e-4, atol=1e-5)
