#!/usr/bin/env python3
"""LightGBM and XGBoost models exported by onnxmltools: PyPTO against onnxruntime and the
library's own predict / predict_proba.

lightgbm, xgboost and onnxmltools are not among PyPTO's dependencies. Install them where this
script can import them together with pypto and onnxruntime, for example a scratch environment
that also sees PyPTO's (never into PyPTO's own environment):

    python3 -m venv /tmp/pk-venv
    echo ~/.cache/pypto/venv/lib/python3.11/site-packages > \
        /tmp/pk-venv/lib/python3.11/site-packages/pypto-venv.pth
    /tmp/pk-venv/bin/pip install --no-deps lightgbm xgboost-cpu onnxmltools
    PYTHONPATH=python /tmp/pk-venv/bin/python bench/onnxmltools_trees.py [--rows 2000]

Models (random data, seed 0, 10 features, a few NaNs in the inputs): regressors, binary and
3-class classifiers of each library, a LightGBM model with a categorical feature and XGBoost's
base score variants. Each is converted (onnxmltools.convert_lightgbm / convert_xgboost, ZipMap
off where the converter has the option), run in onnxruntime and pypto.onnx.load at level 2, and
both are compared with the library's predictions. Time: median of --calls calls each at 1 thread
in this process, the load average printed before and after.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

import numpy as np  # noqa: E402


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def data(rows: int, classes: int, seed: int = 0, nan: bool = True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 10)).astype(np.float32)
    score = x[:, 0] * 2 + np.sin(x[:, 1] * 3) + x[:, 2] * x[:, 3]
    if classes == 0:
        y = score + rng.standard_normal(rows) * 0.1
    else:
        y = np.digitize(score, np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1]))
    if nan:
        x[rng.random(x.shape) < 0.03] = np.nan
    return x, y


def models():
    import lightgbm as lgb
    import xgboost as xgb
    p = dict(n_estimators=30, verbose=-1)
    return {
        "lgbm_regressor": (lambda: lgb.LGBMRegressor(**p), 0),
        "lgbm_regressor_poisson": (lambda: lgb.LGBMRegressor(objective="poisson", **p), -1),
        "lgbm_binary": (lambda: lgb.LGBMClassifier(**p), 2),
        "lgbm_multiclass": (lambda: lgb.LGBMClassifier(**p), 3),
        "lgbm_rf_binary": (lambda: lgb.LGBMClassifier(boosting_type="rf", bagging_freq=1,
                                                      bagging_fraction=0.7, **p), 2),
        "xgb_regressor": (lambda: xgb.XGBRegressor(n_estimators=30, max_depth=4), 0),
        "xgb_binary": (lambda: xgb.XGBClassifier(n_estimators=30, max_depth=4), 2),
        "xgb_multiclass": (lambda: xgb.XGBClassifier(n_estimators=30, max_depth=4), 3),
        "xgb_regressor_base_score": (lambda: xgb.XGBRegressor(n_estimators=10, max_depth=3,
                                                              base_score=0.7), 0),
        "lgbm_multiclassova": (lambda: lgb.LGBMClassifier(objective="multiclassova", **p), 3),
        "lgbm_regressor_gamma": (lambda: lgb.LGBMRegressor(objective="gamma", **p), -1),
        "lgbm_regressor_tweedie": (lambda: lgb.LGBMRegressor(objective="tweedie", **p), -1),
        "lgbm_regressor_huber": (lambda: lgb.LGBMRegressor(objective="huber", **p), 0),
        "lgbm_binary_xentropy": (lambda: lgb.LGBMClassifier(objective="cross_entropy", **p), 2),
        "lgbm_regressor_split": (lambda: lgb.LGBMRegressor(n_estimators=120, verbose=-1), 0),
        "lgbm_regressor_double": (lambda: lgb.LGBMRegressor(**p), 0),
        "lgbm_categorical": (lambda: lgb.LGBMRegressor(**p), -2),
        "xgb_regressor_poisson": (lambda: xgb.XGBRegressor(n_estimators=10, max_depth=3,
                                                           objective="count:poisson"), -1),
        "xgb_regressor_gamma": (lambda: xgb.XGBRegressor(n_estimators=10, max_depth=3,
                                                         objective="reg:gamma"), -1),
        "xgb_regressor_logistic": (lambda: xgb.XGBRegressor(n_estimators=10, max_depth=3,
                                                            objective="reg:logistic"), -3),
        "xgb_multi_softmax": (lambda: xgb.XGBClassifier(n_estimators=10, max_depth=3,
                                                        objective="multi:softmax"), 3),
        "xgb_rf_classifier": (lambda: xgb.XGBRFClassifier(n_estimators=10, max_depth=4), 3),
        "xgb_rf_regressor": (lambda: xgb.XGBRFRegressor(n_estimators=10, max_depth=4), 0),
        "xgb_dart": (lambda: xgb.XGBRegressor(n_estimators=10, max_depth=3, booster="dart",
                                              rate_drop=0.1), 0),
        "xgb_gblinear": (lambda: xgb.XGBRegressor(n_estimators=10, booster="gblinear"), 0),
        "xgb_binary_logitraw": (lambda: xgb.XGBClassifier(n_estimators=10, max_depth=3,
                                                          objective="binary:logitraw"), 2),
    }


def convert(model, name: str, features: int):
    import onnxmltools
    from onnxmltools.convert.common.data_types import DoubleTensorType, FloatTensorType
    tensor = DoubleTensorType if name.endswith("double") else FloatTensorType
    types = [("input", tensor([None, features]))]
    if name.startswith("lgbm"):
        split = 50 if name.endswith("split") else None
        return onnxmltools.convert_lightgbm(model, initial_types=types, zipmap=False, split=split)
    return onnxmltools.convert_xgboost(model, initial_types=types)


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    return float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30)


def run(name, make, classes, rows, calls, tmp) -> str:
    import onnx
    import onnxruntime as ort
    from ml_trees import burst  # bench/ml_trees.py: the median of a burst of calls

    import pypto
    x, y = data(2000, abs(classes))
    x0 = np.nan_to_num(x)
    if classes == -1:  # a count target (poisson, gamma, tweedie)
        y = np.round(np.exp(np.clip(x0[:, 0], -2, 2) + 0.5 * x0[:, 1])).astype(float) + 0.5
    elif classes == -3:  # a probability target (reg:logistic)
        y = 1 / (1 + np.exp(-x0[:, 0] * 2))
    fit = {}
    if classes == -2:  # feature 4 categorical: small integers, fitted as a category
        x[:, 4] = np.floor(np.abs(x0[:, 4]) * 4) % 7
        y = y + np.isin(x[:, 4], [1, 3, 4]) * 2
        fit = {"categorical_feature": [4]}
    model = make().fit(x, y, **fit)
    try:
        onx = convert(model, name, x.shape[1])
    except Exception as e:
        return f"| {name} | onnxmltools cannot convert it: {type(e).__name__}: {str(e)[:150]} |"
    path = Path(tmp) / f"{name}.onnx"
    onnx.save(onx, path)
    ops = sorted({f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in onx.graph.node})
    test_x, _ = data(rows, 2, seed=1)
    if classes == -2:
        test_x[:, 4] = np.floor(np.abs(np.nan_to_num(test_x[:, 4])) * 4) % 7
    if name.endswith("double"):
        test_x = test_x.astype(np.float64)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    want = sess.run(None, {"input": test_x})
    if classes > 0:
        lib = [model.predict(test_x), model.predict_proba(test_x)]
    else:
        lib = [model.predict(test_x).reshape(want[0].shape)]
    try:
        exe = pypto.onnx.load(str(path), level=2)
        got = exe(input=test_x)
        got = got if isinstance(got, tuple) else (got,)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        tb = "" if isinstance(e, (ValueError, TypeError, NotImplementedError)) else (
            " " + traceback.format_exc(limit=3).replace("\n", " "))
        return f"| {name} | {', '.join(ops)} | error: {type(e).__name__}: {msg[:300]}{tb} |"
    vs_ort = max(rel(g, w) for g, w in zip(got, want))
    ort_vs_lib = max(rel(w, lb) for w, lb in zip(want, lib))
    pto_vs_lib = max(rel(g, lb) for g, lb in zip(got, lib))
    pypto.set_num_threads(1)
    t_p = min(burst(lambda: exe(input=test_x), calls) for _ in range(2))
    t_o = min(burst(lambda: sess.run(None, {"input": test_x}), calls) for _ in range(2))
    status = "works" if vs_ort <= 1e-4 else "wrong"
    return (f"| {name} | {', '.join(ops)} | {status} ({vs_ort:.1e}) | {pto_vs_lib:.1e} "
            f"(ORT {ort_vs_lib:.1e}) | {t_p * 1e3:.3f} ms vs {t_o * 1e3:.3f} ms |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--only", help="a substring of the model names to run")
    args = ap.parse_args()
    try:
        import lightgbm  # noqa: F401
        import onnxmltools  # noqa: F401
        import onnxruntime  # noqa: F401
        import xgboost  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e.name} is not installed (see this script's docstring for the scratch "
              "environment)")
        return
    print(f"load average before: {loadavg()}")
    print("| model | ops | PyPTO vs onnxruntime | vs the library's predict (onnxruntime's) | "
          "PyPTO vs ORT, 1 thread |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (make, classes) in models().items():
            if args.only and args.only not in name:
                continue
            print(run(name, make, classes, args.rows, args.calls, tmp), flush=True)
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
