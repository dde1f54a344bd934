"""The small entry points: options, device_info, is_available, ONNX load/export."""

import numpy as np
import onnxruntime as ort
import pytest
import torch

import pypto


@pytest.fixture(autouse=True)
def default_options():
    pypto.reset_optimization_options()
    yield
    pypto.reset_optimization_options()


def test_set_optimization_options_as_api_md_spells_it():
    pypto.set_optimization_options({"graph_optimization_level": 3, "memory_optimization": True,
                                    "auto_mixed_precision": False})
    assert pypto.get_optimization_options()["graph_optimization_level"] == 3
    model = torch.nn.Linear(4, 4).eval()
    assert pypto.optimize(model, (torch.randn(2, 4),)).compiled.level == 3
    assert pypto.optimize(model, (torch.randn(2, 4),), level=1).compiled.level == 1


def test_bad_options_are_errors():
    with pytest.raises(ValueError, match="unknown option 'graph_opt_level'"):
        pypto.set_optimization_options({"graph_opt_level": 1})
    with pytest.raises(ValueError, match="graph_optimization_level must be 0..3"):
        pypto.set_optimization_options({"graph_optimization_level": 9})
    with pytest.raises(TypeError, match="'memory_optimization' must be bool"):
        pypto.set_optimization_options({"memory_optimization": 1})
    with pytest.raises(TypeError, match="'auto_mixed_precision' must be bool"):
        pypto.set_optimization_options({"auto_mixed_precision": 1})
    with pytest.raises(TypeError, match="expects a dict"):
        pypto.set_optimization_options([("graph_optimization_level", 1)])
    assert pypto.get_optimization_options()["graph_optimization_level"] == 2  # unchanged


def test_device_info_and_is_available():
    info = pypto.device_info()
    assert pypto.is_available()
    assert info["logical_cores"] >= 1 and info["physical_cores"] >= 1
    assert info["isa"] in ("avx512", "avx2", "generic")
    assert info["l1d_bytes"] > 0 and info["l2_bytes"] > 0
    assert info["cache_model"]["l3_cores"] >= 1 and info["cache_model"]["line_bytes"] >= 32
    fma = info["fma"]  # the measured arithmetic ceiling of one core
    assert fma["isa"] == info["isa"] and fma["gflops_per_core"] > 0
    assert fma["vector_bits"] == {"avx512": 512, "avx2": 256, "generic": 32}[info["isa"]]
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    assert info["extensions"]["avx2"] == ("avx2" in flags)
    assert info["extensions"]["avx512f"] == ("avx512f" in flags)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        h = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return torch.softmax(self.fc(h), dim=-1)


def test_onnx_export_then_onnxruntime_and_pypto_load(tmp_path):
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    fast = pypto.optimize(model, (x,))
    path = tmp_path / "net.onnx"
    pypto.onnx.export(fast, (x,), path)
    want = model(x).detach().numpy()
    # onnxruntime reads what we wrote, with the batch still symbolic.
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert sess.get_inputs()[0].shape[0] == "batch"
    for b in (2, 3):
        xb = np.random.default_rng(b).standard_normal((b, 3, 8, 8)).astype(np.float32)
        (got,) = sess.run(None, {sess.get_inputs()[0].name: xb})
        np.testing.assert_allclose(got, model(torch.from_numpy(xb)).detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
    # ... and so does pypto.onnx.load, with numpy in and numpy out.
    exe = pypto.onnx.load(path)
    got = exe(x.numpy())
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # torch in, torch out; by name too.
    got_t = exe(**{exe.input_names[0]: x})
    assert isinstance(got_t, torch.Tensor)
    np.testing.assert_allclose(got_t.numpy(), want, rtol=1e-5, atol=1e-6)


def test_onnx_export_of_a_plain_module(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).eval()
    x = torch.randn(2, 4)
    path = tmp_path / "plain.onnx"
    pypto.onnx.export(model, (x,), path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_onnx_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        pypto.onnx.load(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="bad.onnx"):
        pypto.onnx.load(bad)
    model = torch.nn.Linear(4, 3).eval()
    path = tmp_path / "lin.onnx"
    pypto.onnx.export(model, (torch.randn(2, 4),), path)
    exe = pypto.onnx.load(path)
    with pytest.raises(TypeError, match="missing input"):
        exe()
    with pytest.raises(TypeError, match="has no input 'nope'"):
        exe(nope=np.zeros((2, 4), np.float32))
    with pytest.raises(TypeError, match="expected dtype f32, got i64"):
        exe(np.zeros((2, 4), np.int64))
    with pytest.raises(TypeError, match="cannot export a str"):
        pypto.onnx.export("model", (), tmp_path / "x.onnx")


def _softmax_model(path, **attrs):
    """An ONNX file of y = Softmax(x) with the given node attributes, built with `onnx`."""
    from onnx import TensorProto, helper

    node = helper.make_node("Softmax", ["x"], ["y"], name="sm", **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path.write_bytes(model.SerializeToString())
    return path


def test_onnx_load_rejects_attributes_the_op_does_not_have(tmp_path):
    # As ONNX Runtime does ("Unrecognized attribute"): a misspelt attribute is an error naming the
    # node, the op and the attribute, and listing what the op accepts; so is one of the wrong kind.
    with pytest.raises(ValueError, match=r"\[Softmax\] node 'sm': unrecognized attribute 'axes' "
                                         r"for operator Softmax; it accepts axis"):
        pypto.onnx.load(_softmax_model(tmp_path / "bogus.onnx", axis=1, axes=[1]))
    with pytest.raises(ValueError, match="attribute 'axis' of operator Softmax should be of kind "
                                         "int, got float"):
        pypto.onnx.load(_softmax_model(tmp_path / "kind.onnx", axis=1.5))
    exe = pypto.onnx.load(_softmax_model(tmp_path / "good.onnx", axis=0))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    e = np.exp(x - x.max(0))
    np.testing.assert_allclose(exe(x), e / e.sum(0), rtol=1e-6)


class SmallCNN(torch.nn.Module):
    """A torchvision-like stem and block: Conv-BN-ReLU, a residual, pooling, a classifier."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(h + self.bn2(self.conv2(h)))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(h, 1), 1))


def _trained_bn(model):
    torch.manual_seed(0)
    for m in model.modules():  # non-trivial running statistics, as after training
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.num_batches_tracked.fill_(100)
    return model.eval()


def _unused_initializers(graph) -> set:
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    return {t.name for t in graph.initializer} - read


@pytest.mark.parametrize("optimized_first", [False, True])
def test_onnx_export_drops_unused_initializers_and_names_outputs(tmp_path, optimized_first):
    import onnx

    torch.manual_seed(0)
    model = _trained_bn(SmallCNN())
    x = torch.randn(2, 3, 12, 12)
    path = tmp_path / "cnn.onnx"
    pypto.onnx.export(pypto.optimize(model, (x,)) if optimized_first else model, (x,), path)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    assert _unused_initializers(proto.graph) == set()
    assert not any("num_batches_tracked" in t.name for t in proto.graph.initializer)
    assert [i.name for i in proto.graph.input] == ["x"]
    assert [o.name for o in proto.graph.output] == ["output"]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b in (1, 3):
        xb = torch.randn(b, 3, 12, 12)
        got = sess.run(["output"], {"x": xb.numpy()})[0]
        with torch.no_grad():
            np.testing.assert_allclose(got, model(xb).numpy(), rtol=1e-4, atol=1e-5)
    assert pypto.onnx.load(path).output_names == ["output"]


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 6)

    def forward(self, output, y):  # an input called "output" keeps its name
        h = self.fc(output)
        return h.softmax(-1), h + y, y


def test_onnx_export_output_names_default_and_given(tmp_path):
    import onnx

    torch.manual_seed(0)
    model = TwoHeads().eval()
    x, y = torch.randn(2, 4), torch.randn(2, 6)
    with torch.no_grad():
        want = [t.numpy() for t in model(x, y)]
    for given in (None, ["probs", "logits", "passthrough"]):
        path = tmp_path / f"heads_{given is None}.onnx"
        pypto.onnx.export(model, (x, y), path, output_names=given)
        proto = onnx.load(str(path))
        names = [o.name for o in proto.graph.output]
        assert [i.name for i in proto.graph.input] == ["output", "y"]
        assert names == (given or ["output_0", "output_1", "output_2"])
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = sess.run(names, {"output": x.numpy(), "y": y.numpy()})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    fast = pypto.optimize(model, (x, y))
    pypto.onnx.export(fast, (x, y), tmp_path / "named.onnx", output_names=["a", "b", "c"])
    assert pypto.onnx.load(tmp_path / "named.onnx").output_names == ["a", "b", "c"]
    with pytest.raises(ValueError, match="2 output name"):
        pypto.onnx.export(model, (x, y), tmp_path / "bad.onnx", output_names=["a", "b"])
    with pytest.raises(ValueError, match="'y' is already the name"):
        pypto.onnx.export(model, (x, y), tmp_path / "bad.onnx", output_names=["a", "b", "y"])
    with pytest.raises(TypeError, match="keeps its graph's names"):
        pypto.onnx.export(pypto.onnx.load(path), None, tmp_path / "x.onnx", output_names=["a"])


def test_import_does_not_load_torch_and_the_backend_registers_when_it_loads(tmp_path):
    """ONNX-only programs do not pay for importing torch; torch.compile(backend="pypto") still
    works when torch is imported after pypto, and the torch entry points load on first use."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, numpy as np, onnx, pypto\n"
            "from onnx import helper, TensorProto as T\n"
            "g = helper.make_graph([helper.make_node('Relu', ['x'], ['y'])], 'g',\n"
            "    [helper.make_tensor_value_info('x', T.FLOAT, [2])],\n"
            "    [helper.make_tensor_value_info('y', T.FLOAT, [2])])\n"
            f"path = {str(tmp_path / 'relu.onnx')!r}\n"
            "onnx.save(helper.make_model(g), path)\n"
            "y = pypto.onnx.load(path)(np.array([-1.0, 2.0], np.float32))\n"
            "assert y.tolist() == [0.0, 2.0] and pypto.onnx.load(path).stats()['kernels'] == 1\n"
            "assert 'torch' not in sys.modules, 'pypto loaded torch'\n"
            "import torch\n"
            "assert 'pypto' in torch._dynamo.list_backends(exclude_tags=())\n"
            # pypto.save, pypto.load and pypto.debug import the implementation first: the
            # entry points must stay the functions, not become the modules.
            "import pypto._optimize, pypto._jit, pypto.serialization\n"
            "assert callable(pypto.optimize) and callable(pypto.jit)\n"
            "print('ok')\n")
    package = str(Path(pypto.__file__).resolve().parents[1])  # the pypto these tests test
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": package})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize("first", [
    "from pypto.quantization import quantize_dynamic", "import pypto.amp", "import pypto.debug",
    "import pypto.dynamo", "from pypto.custom_ops import custom_op", "import pypto.tuning",
    "from pypto.frontend import aten_more", "import pypto.profiler"])
def test_a_module_imported_first_loads_torch_cleanly(first):
    """A pypto module that imports torch itself, imported first in a process: torch's import
    hook must not load the converters in the middle of that module (`from pypto.quantization
    import quantize_dynamic` as the seeds write it was an AttributeError: its torch ops were not
    defined yet); torch.compile(backend="pypto") still works afterwards."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (f"{first}\n"
            "import torch\n"
            "f = torch.compile(lambda x: torch.relu(x) * 2, backend='pypto')\n"
            "assert f(torch.tensor([-1.0, 3.0])).tolist() == [0.0, 6.0]\n"
            "import pypto.dynamo\n"
            "assert pypto.dynamo.stats()['pypto_runs'] == 1\n"
            "print('ok')\n")
    package = str(Path(pypto.__file__).resolve().parents[1])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": package})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_cache_sizes_override_reaches_the_cache_model():
    """PTO_CACHE_SIZES changes what kernels block for (device_info()["cache_model"]); a malformed
    value is a clear error, not a silent default."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    package = str(Path(pypto.__file__).resolve().parents[1])
    code = "import pypto; print(pypto.device_info()['cache_model'])"

    def run(value):
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": package, "PTO_CACHE_SIZES": value})

    r = run("l2=512K,l3=2M")
    assert r.returncode == 0, r.stderr
    model = eval(r.stdout)  # a printed dict of ints, bools and strings
    assert model["l2_bytes"] == 512 << 10 and model["l3_bytes_per_core"] == 2 << 20
    assert model["from_env"] is True
    bad = run("l2=lots")
    assert bad.returncode != 0 and "PTO_CACHE_SIZES='l2=lots'" in bad.stderr
