"""pypto.set_num_threads / get_num_threads: the kernel thread pool's size from Python."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pypto
from conftest import REPO


@pytest.fixture(autouse=True)
def default_threads():
    yield
    pypto.set_num_threads(None)


def test_set_and_get():
    for n in [1, 2, 3, 1]:
        pypto.set_num_threads(n)
        assert pypto.get_num_threads() == n


def test_invalid_values_raise():
    pypto.set_num_threads(2)
    for bad in [0, -1, 4097]:
        with pytest.raises(ValueError, match="set_num_threads"):
            pypto.set_num_threads(bad)
    for bad in ["2", 2.0, True]:
        with pytest.raises(TypeError):
            pypto.set_num_threads(bad)
    assert pypto.get_num_threads() == 2  # unchanged by the refused calls


def run_python(code: str, env_threads: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PTO_NUM_THREADS=env_threads,
               PYTHONPATH=str(REPO / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_default_comes_from_the_environment():
    code = ("import pypto; print(pypto.get_num_threads()); pypto.set_num_threads(1); "
            "pypto.set_num_threads(None); print(pypto.get_num_threads())")
    r = run_python(code, "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "3"]
    r = run_python("import pypto; pypto.get_num_threads()", "many")
    assert r.returncode != 0 and "ValueError" in r.stderr and "PTO_NUM_THREADS" in r.stderr


def test_cli_threads(pto_bin, tmp_path):
    from onnx import TensorProto as TP
    from onnx import helper
    import onnx

    x = helper.make_tensor_value_info("x", TP.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TP.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)

    def pto(*args, env_threads=None):
        env = dict(os.environ)
        env.pop("PTO_NUM_THREADS", None)
        if env_threads:
            env["PTO_NUM_THREADS"] = env_threads
        return subprocess.run([str(pto_bin), *args], capture_output=True, text=True, env=env,
                              timeout=120)

    r = pto("run", str(model), "--threads", "3")
    assert r.returncode == 0, r.stderr
    assert "threads: 3\n" in r.stdout
    r = pto("run", str(model), "--threads", "0")
    assert r.returncode == 2 and "--threads expects an integer in [1, 4096]" in r.stderr
    assert "threads:     3 (from PTO_NUM_THREADS)" in pto("info", env_threads="3").stdout
    r = pto("info")
    assert r.returncode == 0 and "(default)" in r.stdout
