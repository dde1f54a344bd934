#!/usr/bin/env python3
"""Keras models converted by tf2onnx, run by PyPTO (levels 2 and 3) against onnxruntime.

Two steps in two environments, since TensorFlow pins numpy and protobuf versions PyPTO's own
environment does not share:

  export  (TensorFlow's python) builds each Keras model with random weights (seed 0, never
          downloaded) and converts it with tf2onnx at opsets 13 and 17: DIR/NAME_opN.onnx, and
          DIR/NAME.json with the inputs to feed (shapes for the unknown dims, token ranges);
  check   (PyPTO's python) loads every file in DIR with pypto.onnx.load(level=2 and 3), runs it
          on random inputs and compares with onnxruntime on the same file (max |got - want| /
          max |want| <= 1e-4), times both in one process on one thread, and lists the ops that
          ran on the reference interpreter.

    python3 -m venv /tmp/tf-venv && /tmp/tf-venv/bin/pip install tensorflow-cpu tf2onnx
    PY=~/.cache/pypto/venv/bin/python
    PTO_BIN=$PWD/build/pto PYTHONPATH=python $PY bench/keras_models.py      # export + check
    $PY bench/keras_models.py --models lstm_text,gru_text --opsets 17
    /tmp/tf-venv/bin/python bench/keras_models.py --export-only             # export alone

With no --tf-python, the export runs in /tmp/tf-venv/bin/python when that exists (or in this
interpreter when it imports tensorflow and tf2onnx); files already in DIR are not exported again
(--force does). docs/unseen_models.md ("Keras models through tf2onnx") has the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TOLERANCE = 1e-4
DEFAULT_DIR = "/tmp/tf-onnx"
DEFAULT_TF_PYTHON = "/tmp/tf-venv/bin/python"
INSTALL = ("python3 -m venv /tmp/tf-venv && /tmp/tf-venv/bin/pip install tensorflow-cpu tf2onnx "
           "(a separate environment: TensorFlow pins numpy and protobuf)")


# --- the Keras models (built in TensorFlow's environment only) ----------------------------------
# Each builder returns (model, inputs): inputs maps an input's position to a dict with the
# concrete shape to feed ("feed", unknown dims included) and, for token inputs, the ids' range
# ("low", "vocab") and how many padding ids (0) end the first row ("pad").

def _app(name: str, size: int):
    def build(keras):
        m = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3))
        return m, [{"feed": [1, size, size, 3]}]
    return build


def _lstm_text(keras):
    L = keras.layers
    x = keras.Input((None,), dtype="int32")
    h = L.Embedding(1000, 32)(x)
    h = L.LSTM(48, return_sequences=True)(h)
    h = L.LSTM(32)(h)
    y = L.Dense(5, activation="softmax")(h)
    return keras.Model(x, y), [{"feed": [2, 20], "vocab": 1000}]


def _gru_text(keras):
    L = keras.layers
    x = keras.Input((None,), dtype="int32")
    h = L.Embedding(1000, 32)(x)
    h = L.Bidirectional(L.GRU(40, return_sequences=True))(h)
    h = L.GRU(24)(h)
    y = L.Dense(3)(h)
    return keras.Model(x, y), [{"feed": [2, 20], "vocab": 1000}]


def _bilstm_text(keras):
    """A masked Embedding (mask_zero: the recurrent layers skip the padding steps), a
    Bidirectional LSTM and a SimpleRNN: with the mask, tf2onnx writes each as a Loop (the
    Bidirectional's backward half between ReverseSequences), not as ONNX's LSTM."""
    L = keras.layers
    x = keras.Input((None,), dtype="int32")
    h = L.Embedding(500, 24, mask_zero=True)(x)
    h = L.Bidirectional(L.LSTM(32, return_sequences=True))(h)
    h = L.SimpleRNN(16)(h)
    y = L.Dense(2)(h)
    return keras.Model(x, y), [{"feed": [3, 12], "vocab": 500, "low": 1, "pad": 4}]


def _tf_ops(keras):
    """TensorFlow ops inside a Keras model, as tf2onnx writes them: tf.where on a condition,
    int32 tf.gather and tf.math.top_k, argmax, one_hot, cumsum, a boolean mask (NonZero: a
    data-dependent shape) reduced to a fixed one, tf.shape arithmetic."""
    import tensorflow as tf

    L = keras.layers
    x = keras.Input((24,))

    class Ops(L.Layer):
        def call(self, t):
            w = tf.where(t > 0.3, t * 2.0, tf.nn.relu(-t) - 1.0)
            top, idx = tf.math.top_k(w, k=5)
            picked = tf.gather(w, idx, batch_dims=1)
            arg = tf.one_hot(tf.argmax(w, axis=-1, output_type=tf.int32), 24)
            csum = tf.math.cumsum(w, axis=-1, reverse=True)
            pos = tf.boolean_mask(w, w > 0.0)  # 1-D, data-dependent length
            count = tf.cast(tf.shape(pos)[0], tf.float32)
            mean_pos = tf.reduce_sum(pos) / tf.maximum(count, 1.0)
            half = tf.shape(t)[1] // 2
            return tf.concat([top, picked, arg, csum[:, :half],
                              tf.fill([tf.shape(t)[0], 1], mean_pos)], axis=-1)

    h = Ops()(x)
    y = L.Dense(8)(h)
    return keras.Model(x, y), [{"feed": [4, 24]}]


def _transformer(keras, act="gelu_tanh"):
    """A one-block encoder: token and position embeddings, MultiHeadAttention with a padding
    mask from the tokens, LayerNormalization, a GELU feed-forward, mean pooling."""
    L = keras.layers
    if act == "gelu_tanh":
        act = lambda t: keras.activations.gelu(t, approximate=True)  # noqa: E731
    seq, vocab, d = 16, 1000, 64
    x = keras.Input((seq,), dtype="int32")
    tok = L.Embedding(vocab, d, mask_zero=True)(x)

    class AddPositions(L.Layer):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.supports_masking = True  # the padding mask goes on to the attention

        def build(self, shape):
            self.pos = self.add_weight(shape=(seq, d), initializer="random_normal", name="pos")

        def call(self, t):
            return t + self.pos[None]

    h = AddPositions()(tok)
    a = L.MultiHeadAttention(num_heads=4, key_dim=16)(h, h)
    h = L.LayerNormalization(epsilon=1e-6)(h + a)
    # GELU's tanh form: Keras 3's exact one is x/2 erfc(-x/sqrt 2), and tf2onnx 1.17 has no
    # conversion for Erfc (transformer_erf keeps it, to see what a user of such a file meets).
    f = L.Dense(128, activation=act)(h)
    f = L.Dense(d)(f)
    h = L.LayerNormalization(epsilon=1e-6)(h + f)
    h = L.GlobalAveragePooling1D()(h)
    y = L.Dense(4)(h)
    return keras.Model(x, y), [{"feed": [2, seq], "vocab": vocab, "low": 1, "pad": 5}]


def _conv1d_audio(keras):
    L = keras.layers
    x = keras.Input((4000, 1))
    h = L.Conv1D(16, 9, strides=2, padding="same")(x)
    h = L.BatchNormalization()(h)
    h = L.ReLU()(h)
    h = L.MaxPooling1D(4)(h)
    h = L.Conv1D(32, 5, padding="same", activation="relu")(h)
    h = L.SeparableConv1D(32, 5, padding="same", activation="relu")(h)
    h = L.AveragePooling1D(2)(h)
    h = L.Conv1D(48, 3, dilation_rate=2, padding="causal", activation="relu")(h)
    h = L.GlobalAveragePooling1D()(h)
    y = L.Dense(10)(h)
    return keras.Model(x, y), [{"feed": [2, 4000, 1]}]


def _resize_unet(keras):
    """A small encoder-decoder: UpSampling2D (nearest and bilinear), tf.image.resize to a fixed
    size, Concatenate skips, Conv2DTranspose."""
    import tensorflow as tf

    L = keras.layers
    x = keras.Input((32, 48, 3))
    e1 = L.Conv2D(8, 3, padding="same", activation="relu")(x)
    e2 = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(e1)
    e3 = L.Conv2D(24, 3, strides=2, padding="same", activation="relu")(e2)
    d2 = L.UpSampling2D(2, interpolation="bilinear")(e3)
    d2 = L.Conv2D(16, 3, padding="same", activation="relu")(L.Concatenate()([d2, e2]))
    d1 = L.UpSampling2D(2)(d2)  # nearest
    d1 = L.Conv2D(8, 3, padding="same", activation="relu")(L.Concatenate()([d1, e1]))
    t = L.Conv2DTranspose(8, 3, strides=2, padding="same")(d1)
    r = L.Lambda(lambda z: tf.image.resize(z, (40, 60), method="bilinear"))(t)
    y = L.Conv2D(2, 1)(r)
    return keras.Model(x, y), [{"feed": [1, 32, 48, 3]}]


def _dynamic_fcn(keras):
    """Unknown batch and image size: a fully convolutional net with BatchNormalization,
    DepthwiseConv2D, a residual and a per-pixel softmax."""
    L = keras.layers
    x = keras.Input((None, None, 3))
    h = L.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(x)
    h = L.BatchNormalization()(h)
    h = L.Activation("swish")(h)
    d = L.DepthwiseConv2D(3, padding="same")(h)
    d = L.BatchNormalization()(d)
    h = L.Add()([h, L.Activation("relu6")(d)])
    h = L.Conv2D(5, 1)(h)
    y = L.Softmax(axis=-1)(h)
    return keras.Model(x, y), [{"feed": [3, 40, 56, 3]}]


MODELS = {
    "mobilenet_v2": _app("MobileNetV2", 96),
    "resnet50": _app("ResNet50", 64),
    "efficientnet_b0": _app("EfficientNetB0", 64),
    "densenet121": _app("DenseNet121", 64),
    "nasnet_mobile": _app("NASNetMobile", 96),
    "lstm_text": _lstm_text,
    "gru_text": _gru_text,
    "bilstm_text": _bilstm_text,
    "tf_ops": _tf_ops,
    "transformer": _transformer,
    "transformer_erf": lambda keras: _transformer(keras, "gelu"),
    "conv1d_audio": _conv1d_audio,
    "resize_unet": _resize_unet,
    "dynamic_fcn": _dynamic_fcn,
}
OPSETS = (13, 17)


def export(names: list[str], opsets: list[int], out: Path, force: bool) -> None:
    """Builds and converts each model (TensorFlow's environment)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    import tf2onnx

    keras = tf.keras
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        todo = [o for o in opsets if force or not (out / f"{name}_op{o}.onnx").exists()]
        if not todo:
            continue
        keras.utils.set_random_seed(0)
        t0 = time.perf_counter()
        try:
            model, inputs = MODELS[name](keras)
        except Exception as e:  # noqa: BLE001 - recorded, the next model goes on
            print(f"{name}: building failed: {type(e).__name__}: {e}", flush=True)
            continue
        # Batch norms with non-trivial statistics (a fresh one is the identity).
        for layer in model.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                rng = np.random.default_rng(len(layer.name))
                w = layer.get_weights()  # gamma, beta, mean, variance
                layer.set_weights([rng.uniform(0.5, 1.5, a.shape).astype(a.dtype) if i in (0, 3)
                                   else rng.normal(0, 0.2, a.shape).astype(a.dtype)
                                   for i, a in enumerate(w)])
        meta = {"inputs": inputs, "tensorflow": tf.__version__, "tf2onnx": tf2onnx.__version__,
                "keras": keras.__version__ if hasattr(keras, "__version__") else "?"}
        (out / f"{name}.json").write_text(json.dumps(meta))
        sig = [tf.TensorSpec(t.shape, t.dtype, name=f"input_{i}")
               for i, t in enumerate(model.inputs)]
        for opset in todo:
            path = out / f"{name}_op{opset}.onnx"
            try:
                try:
                    tf2onnx.convert.from_keras(model, input_signature=sig, opset=opset,
                                               output_path=str(path))
                    how = "from_keras"
                except Exception as first:  # noqa: BLE001 - Keras 3: through a tf.function
                    fn = tf.function(lambda *a: model(list(a) if len(a) > 1 else a[0],
                                                      training=False), input_signature=sig)
                    tf2onnx.convert.from_function(fn, input_signature=sig, opset=opset,
                                                  output_path=str(path))
                    how = f"from_function (from_keras: {type(first).__name__})"
                print(f"{name} opset {opset}: {how}, {time.perf_counter() - t0:.1f} s",
                      flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{name} opset {opset}: conversion failed: {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}", flush=True)
                traceback.print_exc(limit=3)
                path.unlink(missing_ok=True)


# --- the check (PyPTO's environment) ------------------------------------------------------------

def feeds_for(sess, meta: dict, grow: int = 0) -> dict:
    """Random inputs; `grow` is added to each dim the file leaves unknown (a second shape for a
    model with a dynamic batch or size)."""
    import numpy as np

    rng = np.random.default_rng(1 + grow)
    feeds = {}
    for i, inp in enumerate(sess.get_inputs()):
        spec = meta["inputs"][i] if i < len(meta["inputs"]) else {}
        shape = spec.get("feed") or [d if isinstance(d, int) else 1 for d in inp.shape]
        shape = [s if isinstance(d, int) else s + grow for s, d in zip(shape, inp.shape)]
        kind = inp.type  # "tensor(float)", "tensor(int32)", ...
        if "int" in kind:
            dt = np.int64 if "int64" in kind else np.int32
            ids = rng.integers(spec.get("low", 0), spec.get("vocab", 10), shape).astype(dt)
            if spec.get("pad"):  # padding (token 0) at the end of the first row
                ids[0, -spec["pad"]:] = 0
            feeds[inp.name] = ids
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def rel(got, want) -> float:
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = np.abs(want).max() if want.size else 0.0
    err = np.abs(got - want).max() if want.size else 0.0
    return float(err / scale) if scale > 0 else float(err)


def check(path: Path, meta: dict, rounds: int, budget: float) -> dict:
    sys.path.insert(0, str(HERE))
    import numpy as np
    import onnxruntime as ort

    import pypto
    from timing import per_call

    pypto.set_num_threads(1)
    r: dict = {"file": path.name}
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = feeds_for(sess, meta)
    want = sess.run(None, feeds)
    dynamic = any(not isinstance(d, int) for i in sess.get_inputs() for d in i.shape)
    r["dynamic"] = dynamic
    if dynamic:
        feeds2 = feeds_for(sess, meta, grow=1)
        want2 = sess.run(None, feeds2)
    engines = {"ort": lambda: sess.run(None, feeds)}
    r["err"], r["errors"] = {}, {}
    for level in (2, 3):
        key = f"l{level}"
        try:
            exe = pypto.onnx.load(str(path), level=level)
            got = exe(**feeds)
            got = list(got) if isinstance(got, tuple) else [got]
            if len(got) != len(want):
                raise AssertionError(f"{len(got)} outputs, onnxruntime has {len(want)}")
            r["err"][key] = max(rel(g, w) for g, w in zip(got, want))
            if dynamic:  # the same compiled model at a second shape
                got2 = exe(**feeds2)
                got2 = list(got2) if isinstance(got2, tuple) else [got2]
                r["err"][key] = max([r["err"][key]] + [rel(g, w) for g, w in zip(got2, want2)])
            backends = exe._compiled.node_backends
            r.setdefault("reference_ops", {})[key] = dict(
                Counter(op for op, b in backends if b != "cpu"))
            engines[key] = (lambda e: lambda: e(**feeds))(exe)
        except Exception as e:  # noqa: BLE001 - recorded
            msg = str(e).strip().splitlines()
            r["errors"][key] = f"{type(e).__name__}: {msg[0] if msg else ''}"[:400]
            r["trace"] = traceback.format_exc(limit=-4)[-1500:]
    times: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(rounds):
        for k, f in engines.items():
            times[k].append(per_call(f, budget))
    r["ms"] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    if r["errors"]:
        r["status"] = "error"
    elif all(np.isfinite(e) and e <= TOLERANCE for e in r["err"].values()):
        r["status"] = "works"
    else:
        r["status"] = "wrong"
    return r


def row(r: dict) -> str:
    ms = r.get("ms", {})
    f = lambda k: f"{ms[k]:8.3f}" if k in ms else "       -"  # noqa: E731
    err = max(r["err"].values()) if r.get("err") else float("nan")
    ref = {}
    for counts in r.get("reference_ops", {}).values():
        for op, n in counts.items():
            ref[op] = max(ref.get(op, 0), n)
    extra = " ".join(f"{op}x{n}" for op, n in ref.items())
    if r.get("errors"):
        extra = " | ".join(f"{k}: {v}" for k, v in r["errors"].items())
    ratio = min((ms[k] for k in ("l2", "l3") if k in ms), default=float("nan")) / ms["ort"] \
        if "ort" in ms else float("nan")
    return (f"{r['file']:28s} {r['status']:6s} {err:8.1e} {f('ort')} {f('l2')} {f('l3')} "
            f"{ratio:6.2f}  {extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help=f"comma-separated (default: all: {', '.join(MODELS)})")
    ap.add_argument("--opsets", default=",".join(map(str, OPSETS)))
    ap.add_argument("--dir", default=DEFAULT_DIR, help="where the .onnx files go")
    ap.add_argument("--tf-python", help="a python with tensorflow and tf2onnx (default: "
                    f"{DEFAULT_TF_PYTHON} when it exists, else this one)")
    ap.add_argument("--export-only", action="store_true", help="convert, do not check")
    ap.add_argument("--check-only", action="store_true", help="check the files already in --dir")
    ap.add_argument("--force", action="store_true", help="convert again files already there")
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds, alternating engines")
    ap.add_argument("--budget", type=float, default=0.2, help="seconds per timing round")
    ap.add_argument("--json", help="append one line per file here")
    a = ap.parse_args()
    names = a.models.split(",") if a.models else list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s): {', '.join(unknown)} (known: {', '.join(MODELS)})")
    opsets = [int(o) for o in a.opsets.split(",")]
    out = Path(a.dir)

    if not a.check_only:
        try:
            import tensorflow  # noqa: F401
            import tf2onnx  # noqa: F401
            here = True
        except ImportError:
            here = False
        tf_python = a.tf_python or (DEFAULT_TF_PYTHON if not here and
                                    os.path.exists(DEFAULT_TF_PYTHON) else None)
        if tf_python:
            cmd = [tf_python, __file__, "--export-only", "--dir", str(out), "--opsets", a.opsets,
                   "--models", ",".join(names)] + (["--force"] if a.force else [])
            if subprocess.run(cmd).returncode != 0:
                sys.exit(f"the export in {tf_python} failed (see above)")
        elif here:
            export(names, opsets, out, a.force)
        else:
            sys.exit(f"the export needs TensorFlow and tf2onnx, which this python ({sys.executable})"
                     f" lacks, and {DEFAULT_TF_PYTHON} does not exist: install them with\n    "
                     f"{INSTALL}\nor pass --tf-python, or --check-only to check the files already "
                     f"in {out}")
    if a.export_only:
        return

    print(f"{'file':28s} {'status':6s} {'err':>8s} {'ort ms':>8s} {'l2 ms':>8s} {'l3 ms':>8s} "
          f"{'best/ort':>6s}  reference ops or errors  (1 thread, load {_load()})", flush=True)
    for name in names:
        meta_path = out / f"{name}.json"
        for opset in opsets:
            path = out / f"{name}_op{opset}.onnx"
            if not path.exists():
                print(f"{path.name:28s} missing (not exported: see the export's messages)")
                continue
            # One child per file: a crash or a hang in one model does not end the sweep.
            cmd = [sys.executable, __file__, "--_child", str(path), str(meta_path),
                   str(a.rounds), str(a.budget)]
            env = dict(os.environ, PTO_NUM_THREADS="1", OMP_NUM_THREADS="1")
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("@@keras@@")]
                r = json.loads(line[-1][9:]) if line else {
                    "file": path.name, "status": "crash",
                    "errors": {"child": f"exit {p.returncode}: "
                               f"{(p.stderr.strip().splitlines() or [''])[-1][:300]}"}}
            except subprocess.TimeoutExpired:
                r = {"file": path.name, "status": "timeout", "errors": {"child": "900 s"}}
            r["model"], r["opset"], r["load"] = name, opset, _load()
            print(row(r), flush=True)
            if a.json:
                with open(a.json, "a") as fh:
                    fh.write(json.dumps(r) + "\n")


def _load() -> str:
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--_child":
        path, meta_path, rounds, budget = sys.argv[2:6]
        meta = json.loads(Path(meta_path).read_text()) if os.path.exists(meta_path) else \
            {"inputs": []}
        try:
            res = check(Path(path), meta, int(rounds), float(budget))
        except Exception as e:  # noqa: BLE001 - onnxruntime itself refused the file
            res = {"file": Path(path).name, "status": "ort error",
                   "errors": {"ort": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}}
            try:  # and what PyPTO says of it
                sys.path.insert(0, str(REPO / "python"))
                import pypto

                pypto.onnx.load(path, level=2)
                res["errors"]["pypto"] = "loads"
            except Exception as e:  # noqa: BLE001
                res["errors"]["pypto"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        print("@@keras@@" + json.dumps(res), flush=True)
    else:
        main()
