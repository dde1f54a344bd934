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


def run_env(code: str, **env) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(REPO / "python") + os.pathsep
                + os.environ.get("PYTHONPATH", ""))
    for k in ("PTO_THREADING", "PTO_SPIN_US"):
        full.pop(k, None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=300)


def test_threading_follows_torch():
    # auto: PyPTO's own threads until torch (and its libgomp) is loaded, then torch's OpenMP team
    # (guarded)
    code = ("import pypto; pypto.set_num_threads(2); print(pypto.get_threading()); "
            "import torch; print(pypto.get_threading()); pypto.set_threading('own'); "
            "print(pypto.get_threading())")
    r = run_env(code, PTO_THREADING="auto")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["own", "auto", "own"]
    # the default is auto: torch's team beside torch, own threads without it
    r = run_env("import torch, pypto; print(pypto.get_threading()); pypto.set_threading('omp'); "
                "print(pypto.get_threading())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["auto", "omp"]
    r = run_env("import pypto; print(pypto.get_threading())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["own"]
    r = run_env("import pypto; pypto.set_threading('omp')")
    assert r.returncode != 0 and "needs the process to have loaded libgomp.so.1" in r.stderr


def test_threading_values_are_checked():
    with pytest.raises(ValueError, match="set_threading: mode must be one of auto, own, omp"):
        pypto.set_threading("openmp")
    with pytest.raises(TypeError):
        pypto.set_threading(None)
    for var, bad, want in [("PTO_THREADING", "gomp", "PTO_THREADING must be one of auto, own, omp"),
                           ("PTO_SPIN_US", "-5", "PTO_SPIN_US must be an integer in [0, 1000000]")]:
        r = run_env("import pypto; pypto.set_num_threads(2)", **{var: bad})
        assert r.returncode != 0 and "ValueError" in r.stderr and want in r.stderr, r.stderr


@pytest.mark.parametrize("threads", [2, 3])
def test_threading_modes_give_the_same_bits(threads):
    import torch
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(8, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 16, 3),
        torch.nn.Flatten(), torch.nn.Linear(16 * 22 * 22, 40), torch.nn.Softmax(-1)).eval()
    x = torch.randn(2, 8, 24, 24)
    with torch.no_grad():
        want = net(x)
    pypto.set_num_threads(threads)
    got = {}
    try:
        for mode in ["own", "omp", "auto", "own"]:
            pypto.set_threading(mode)
            assert pypto.get_threading() == mode
            fast = pypto.optimize(net, (x,))
            got.setdefault(mode, []).append(fast(x))
    finally:
        pypto.set_threading("auto")  # the default
    for y in got["own"] + got["omp"] + got["auto"]:
        assert torch.equal(y, got["own"][0])  # the same bits in every mode
    torch.testing.assert_close(got["omp"][0], want, rtol=1e-4, atol=1e-5)


def test_a_forked_child_runs_after_the_parent_used_the_team():
    # the parent ran kernels on torch's OpenMP team (auto) and on its own threads; a child made by
    # fork() (multiprocessing's default on Linux) runs the same model to the same bits in each mode
    code = """
import os, signal, torch, pypto
torch.manual_seed(0)
pypto.set_num_threads(2)
net = torch.nn.Sequential(torch.nn.Conv2d(8, 32, 3, padding=1), torch.nn.ReLU(),
                          torch.nn.Conv2d(32, 16, 3)).eval()
x = torch.randn(2, 8, 24, 24)
fast = pypto.optimize(net, (x,))
for mode in ["auto", "own", "omp"]:
    pypto.set_threading(mode)
    want = fast(x)
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)
        os._exit(0 if torch.equal(fast(x), want) else 3)
    print(mode, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    r = run_env(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["auto", "0", "own", "0", "omp", "0"], r.stdout
