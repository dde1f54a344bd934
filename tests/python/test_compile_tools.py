"""`pto compile -o`, `pto run model.pto`, `pto compile --graph/--graph-after` and the progress
bar: a saved model runs bit for bit as the ONNX model it was compiled from; damaged files exit 1
with a message; pictures have one cluster per fused kernel; the bar is drawn on a terminal and
nowhere else."""

from __future__ import annotations

import os
import pathlib
import pty
import re
import select
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import export_models
from test_cli import PTO, conv_bn_relu_model, expect_error, pto


@pytest.fixture(scope="module")
def resnet():
    return export_models.export("resnet18")


def _run_outputs(model, tmp_path, tag, *extra):
    out = tmp_path / tag
    r = pto("run", model, "--seed", "5", "--output-dir", out, *extra)
    assert r.returncode == 0, r.stderr
    return r, {p.name: np.load(p) for p in sorted(out.iterdir())}


@pytest.mark.parametrize("level", ["2", "3"])
def test_saved_model_runs_bit_identically(resnet, tmp_path, level):
    saved = tmp_path / "r.pto"
    r = pto("compile", resnet, "--level", level, "-o", saved)
    assert r.returncode == 0, r.stderr
    assert re.search(r"saved .*r\.pto \([0-9.]+ MiB\) in [0-9.]+ ms", r.stdout), r.stdout
    _, want = _run_outputs(resnet, tmp_path, "onnx", "--level", level)
    # Loading runs no graph pass: one would fail on this variable, which names no pass.
    out = tmp_path / "pto"
    run = pto("run", saved, "--seed", "5", "--output-dir", out,
              env={"PTO_DISABLE_PASSES": "NoSuchPass"})
    assert run.returncode == 0, run.stderr
    got = {p.name: np.load(p) for p in sorted(out.iterdir())}
    assert f"level {level}" in run.stdout and "saved model, PyPTO" in run.stdout
    assert want.keys() == got.keys()
    for k in want:
        assert want[k].tobytes() == got[k].tobytes(), k
    # The saved model's stats are the ones compiling printed (pass times aside).
    def stats(*args):
        return re.sub(r"[0-9.]+ ms", "", pto("compile", *args, "--stats").stdout)
    assert stats(saved) == stats(resnet, "--level", level)


def test_saved_model_options_that_do_not_apply(resnet, tmp_path):
    saved = tmp_path / "r.pto"
    assert pto("compile", resnet, "-o", saved).returncode == 0
    expect_error(pto("run", saved, "--level", "1"), "saved model", code=2)
    expect_error(pto("compile", saved, "--dump-after", "FoldConstants"), "saved model", code=2)
    expect_error(pto("compile", resnet, "-o", tmp_path / "no-dir" / "r.pto"), "cannot write")


def test_damaged_saved_models_exit_1(resnet, tmp_path):
    saved = tmp_path / "r.pto"
    assert pto("compile", resnet, "-o", saved).returncode == 0
    data = saved.read_bytes()
    cases = {
        "cut": (data[:-1000], "truncated"),
        "flip": (data[:5000] + bytes([data[5000] ^ 4]) + data[5001:], "checksum"),
        "version": (data[:8] + (7).to_bytes(4, "little") + data[12:], "format version 7"),
    }
    for name, (content, message) in cases.items():
        p = tmp_path / f"{name}.pto"
        p.write_bytes(content)
        expect_error(pto("run", p), str(p), message)
        expect_error(pto("compile", p, "--stats"), message)


def test_saved_model_for_another_isa_exits_1(resnet, tmp_path):
    info = pto("info").stdout
    if "isa:         avx512" not in info:
        pytest.skip("needs an AVX-512 machine to save a model its lower ISA cannot run")
    saved = tmp_path / "r.pto"
    assert pto("compile", resnet, "-o", saved).returncode == 0
    expect_error(pto("run", saved, env={"PTO_ISA": "avx2"}),
                 "compiled for avx512 kernels but this process runs avx2 (PTO_ISA)")


def _svg(path):
    root = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    groups = list(root.iter(f"{ns}g"))
    clusters = sum(g.get("class") == "cluster" for g in groups)
    nodes = sum(g.get("class") == "node" for g in groups)
    texts = [t.text or "" for t in root.iter(f"{ns}text")]
    return clusters, nodes, texts


def test_graph_pictures(resnet, tmp_path):
    svg = tmp_path / "g.svg"
    r = pto("compile", resnet, "--graph", svg, "--dump-tiles")
    assert r.returncode == 0, r.stderr
    kernels = re.findall(r"^kernel \d+ \[\w+\] ([^:]+): (.*)$", r.stdout, re.M)
    fused = [nodes.split() for rule, nodes in kernels if len(nodes.split()) > 1]
    clusters, nodes, texts = _svg(svg)
    assert clusters == len(fused) > 0
    # Every node once, plus the input and the output.
    all_nodes = [n for _, ns in kernels for n in ns.split()]
    assert nodes == len(all_nodes) + 2
    for n in all_nodes:
        assert any(n in t for t in texts), n
    # After a pass: the graph as it was then, no kernels yet (BatchNorm folding leaves Conv).
    after = tmp_path / "after.dot"
    m = conv_bn_relu_model(tmp_path / "m.onnx")
    r = pto("compile", m, "--graph", after, "--graph-after", "CanonicalizeOps")
    assert r.returncode == 0, r.stderr
    text = after.read_text()
    assert "BatchNormalization" in text and "subgraph" not in text
    assert "label=\"m.onnx after CanonicalizeOps\"" in text
    r = pto("compile", m, "--graph", after, "--graph-after", "EliminateDeadCode")
    assert "BatchNormalization" not in after.read_text()
    r = pto("compile", m, "--graph", after)
    assert after.read_text().count("subgraph cluster_") == 1  # Conv+Relu


def test_graph_errors(resnet, tmp_path):
    expect_error(pto("compile", resnet, "--graph", tmp_path / "g.txt"), "must end in", code=2)
    expect_error(pto("compile", resnet, "--graph-after", "FoldConstants"), "needs --graph",
                 code=2)
    expect_error(pto("compile", resnet, "--graph", tmp_path / "g.dot", "--graph-after", "Nope"),
                 "pass 'Nope' does not run at level 2", "FoldConstants")
    expect_error(pto("compile", resnet, "--level", "1", "--graph", tmp_path / "g.dot",
                     "--graph-after", "AssignLayouts"), "does not run at level 1")
    # Without Graphviz: a clear error for a picture, DOT still works.
    no_dot = {"PATH": str(tmp_path)}
    expect_error(pto("compile", resnet, "--graph", tmp_path / "g.svg", env=no_dot),
                 "needs Graphviz's `dot`", ".dot writes the DOT text")
    assert not (tmp_path / "g.svg").exists()
    r = pto("compile", resnet, "--graph", tmp_path / "g.dot", env=no_dot)
    assert r.returncode == 0 and (tmp_path / "g.dot").read_text().startswith("digraph")


def _on_a_terminal(args, env, program=PTO):
    """Runs `program` (pto) with stderr on a pseudo-terminal; returns (exit code, what the
    terminal got)."""
    master, slave = pty.openpty()
    full = dict(os.environ)
    full.pop("PTO_PROGRESS", None)
    full.update(env)
    p = subprocess.Popen([str(program), *map(str, args)], stdout=subprocess.DEVNULL, stderr=slave,
                         env=full)
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return p.wait(timeout=120), seen.decode(errors="replace")


def test_progress_bar_on_a_terminal_only(resnet, tmp_path):
    code, seen = _on_a_terminal(["compile", resnet, "-o", tmp_path / "r.pto"],
                                {"PTO_PROGRESS_DELAY": "0"})
    assert code == 0
    assert re.search(r"compiling: passes \[[#.]{24}\] \d+/\d+ \w+", seen), seen
    assert re.search(r"compiling: kernels \[#{24}\] (\d+)/\1", seen), seen
    assert seen.endswith("\r\x1b[K"), repr(seen[-40:])  # erased when done
    # Not a terminal: nothing on stderr.
    r = pto("compile", resnet, "-o", tmp_path / "r.pto", env={"PTO_PROGRESS_DELAY": "0"})
    assert r.returncode == 0 and r.stderr == ""
    # PTO_PROGRESS=0 silences it on a terminal too.
    code, seen = _on_a_terminal(["compile", resnet, "-o", tmp_path / "r.pto"],
                                {"PTO_PROGRESS_DELAY": "0", "PTO_PROGRESS": "0"})
    assert code == 0 and "compiling" not in seen


OPTIMIZE = """
import torch, pypto
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(8 * 14 * 14, 4)).eval()
x = torch.randn(1, 3, 16, 16)
torch.testing.assert_close(pypto.optimize(model, (x,))(x), model(x), rtol=1e-4, atol=1e-4)
"""


def test_pypto_optimize_shows_progress_on_a_terminal_only():
    # Capture, then the passes and kernels under the pypto.optimize label.
    package = str(pathlib.Path(__file__).resolve().parents[2] / "python")
    env = {"PTO_PROGRESS_DELAY": "0", "PYTHONPATH": package}
    code, seen = _on_a_terminal(["-c", OPTIMIZE], env, sys.executable)
    assert code == 0, seen
    assert re.search(r"pypto\.optimize \[\.{24}\] 0/1 torch\.export: Sequential", seen), seen
    assert re.search(r"pypto\.optimize: passes \[[#.]{24}\] \d+/\d+ \w+", seen), seen
    assert re.search(r"pypto\.optimize: kernels \[#{24}\] (\d+)/\1", seen), seen
    assert seen.endswith("\r\x1b[K"), repr(seen[-40:])
    # Not a terminal: nothing on stderr.
    r = subprocess.run([sys.executable, "-c", OPTIMIZE], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=300)
    assert r.returncode == 0 and "pypto.optimize" not in r.stderr, r.stderr
