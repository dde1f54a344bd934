"""The benchmark tools' own logic: the conv layer census and FLOP count, the GEMM shape parser."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import conv_layers  # noqa: E402
import gemm  # noqa: E402


def test_resnet18_census():
    layers = conv_layers.collect_layers("resnet18")
    assert sum(n for _, n in layers) == 20  # stem, 16 3x3, 3 downsampling 1x1
    names = [lay.name() for lay, _ in layers]
    assert names[0] == "3->64 @224 7x7 s2"
    assert dict(zip(names, (n for _, n in layers)))["64->64 @56 3x3"] == 4
    assert "128->256 @28 1x1 s2" in names
    assert conv_layers.select(layers, "@7,7x7") == [layers[0], *[
        (lay, n) for lay, n in layers if "@7 " in lay.name()]]


@pytest.mark.parametrize("layer", [
    conv_layers.Layer(3, 224, 224, 64, (7, 7), (2, 2), (3, 3), (1, 1), 1, False),
    conv_layers.Layer(96, 112, 112, 96, (3, 3), (2, 2), (1, 1), (1, 1), 96, False),
    conv_layers.Layer(64, 56, 56, 256, (1, 1), (1, 1), (0, 0), (1, 1), 1, True),
])
def test_flops_match_torch(layer):
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        y = layer.module(relu=False)(torch.randn(2, layer.c, layer.h, layer.w))
    assert tuple(y.shape[2:]) == layer.out_hw()
    assert layer.flops(2) == counter.get_total_flops()


def test_gemm_shapes():
    assert gemm.parse_shape("512") == (512, 512, 512)
    assert gemm.parse_shape("64x576x3136") == (64, 576, 3136)
    for bad in ("1x2", "0x1x1", "axb"):
        with pytest.raises(ValueError):
            gemm.parse_shape(bad)


def test_attention_flops_count_the_visible_keys():
    import attention

    h, d = 12, 64
    assert attention.flops("s512") == 4 * h * 512 * 512 * d
    # causal: query i sees keys 0..i, 512 * 513 / 2 pairs
    assert attention.flops("s512-causal") == 4 * h * (512 * 513 // 2) * d
    assert attention.flops("decode-4096") == 4 * h * 4096 * d
    assert attention.flops("gqa-decode-4096") == 4 * 32 * 4096 * 128


def test_attention_table_sets_each_precision_beside_its_peer():
    """bench/attention.py's table: a column per engine that ran, PyPTO over torch in fp32 and in
    bf16 (each against its own precision), GFLOP/s of the PyPTO engines, a failed run named."""
    import attention

    def r(engine, ms, **extra):
        return {"engine": engine, "case": "s128", "threads": 1, "status": "ok",
                "median": ms / 1e3, "peak_mib": 1.0, "max_rel_error": 1e-3, **extra}

    results = [r("torch", 0.5), r("pypto", 0.4, planned_mib=0.0), r("torch-bf16", 0.3),
               r("pypto-bf16", 0.2, planned_mib=0.0),
               {"engine": "pypto-unfused", "case": "s128", "threads": 1, "status": "WRONG"}]
    lines = attention.table(results, {1: 200.0})
    head = next(line for line in lines if line.startswith("| case"))
    row = next(line for line in lines if line.startswith("| s128"))
    cells = dict(zip([c.strip() for c in head.split("|")[1:-1]],
                     [c.strip() for c in row.split("|")[1:-1]]))
    assert cells["pypto / torch"] == "1.25x" and cells["pypto-bf16 / torch-bf16"] == "1.50x"
    assert cells["pypto-unfused ms"] == "WRONG"
    gf = attention.flops("s128") / 0.2e-3 / 1e9
    assert cells["pypto-bf16 GFLOP/s (% FMA peak)"] == f"{gf:.1f} ({100 * gf / 200:.0f}%)"
    assert attention.TOLERANCE["pypto-bf16"] == 3e-2 and "pypto" not in attention.TOLERANCE


def test_compile_vs_optimize_summary_takes_the_median_round_and_ratios():
    import compile_vs_optimize as cvo

    def r(engine, ms, cpu, **extra):
        return {"case": "m", "engine": engine, "status": "ok", "median": ms / 1e3,
                "cpu_median": cpu / 1e3, **extra}

    stats = {"graphs": 1, "pypto_pieces": 1, "fallback_nodes": 0, "frozen_weights": 7,
             "weight_inputs": 0, "fallback_ops": []}
    results = [r("eager", 9.0, 8.0), r("optimize", 2.0, 1.0), r("optimize", 4.0, 3.0),
               r("optimize", 3.0, 2.0), r("compile", 3.3, 2.5, dynamo=stats),
               r("dynamo_floor", 0.5, 0.4),
               {"case": "m", "engine": "compile", "status": "wrong"}]
    engines = ["eager", "optimize", "compile", "dynamo_floor"]
    (row,) = cvo.summarize(results, ["m"], engines)
    assert row["compile"] == "wrong"  # a wrong round stands for the lot
    (row,) = cvo.summarize(results[:-1], ["m"], engines)
    assert row["optimize"] == pytest.approx(3.0) and row["optimize_cpu"] == pytest.approx(2.0)
    assert row["ratio"] == pytest.approx(1.1) and row["cpu_ratio"] == pytest.approx(1.25)
    # the best a backend adding nothing could do: (optimize + Dynamo's floor) / optimize
    assert row["bound"] == pytest.approx(3.5 / 3.0) and row["cpu_bound"] == pytest.approx(1.2)
    assert row["frozen"] == 7 and row["pieces"] == 1
    text = "\n".join(cvo.table([row], engines))
    assert "| m | 9.00 | 3.00 | 3.30 | 0.500 (-) | 1.100 | 1.167 | 1.250 | 1.200 | -0.200 |" in text
    assert "compile / optimize, wall-clock: geometric mean 1.100" in text
    assert "1 of 1 cases within 1.10" in text


def test_zoo_speed_times_a_model_against_eager_and_onnxruntime(tmp_path):
    """bench/zoo_speed.py end to end on one small model, 2 threads: exported, every engine (each in
    a process of its own) within 1e-3 of eager PyTorch, the ratio the better level over
    onnxruntime, the slow-phase probe timed."""
    import json
    import subprocess

    out = tmp_path / "rows.json"
    bench = Path(__file__).resolve().parents[2] / "bench" / "zoo_speed.py"
    p = subprocess.run([sys.executable, str(bench), "--models", "mnasnet0_5", "--image", "64",
                        "--rounds", "1", "--budget", "0.01", "--threads", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["status"] == "ok", row
    assert row["inputs"] == [[1, 3, 64, 64]] and row["exporter"] == "torchscript"
    assert set(row["err"]) == {"ort", "l2", "l3"} and max(row["err"].values()) <= 1e-3
    assert all(v > 0 for v in row["ms"].values())
    assert row["ratio"] == pytest.approx(row["ms"][row["best"]] / row["ms"]["ort"])
    assert row["probe_ms"] > 0 and row["slow_wait_s"] >= 0
    assert "2 thread(s)" in p.stdout and "mnasnet0_5" in p.stdout and "slowest relative to onnxruntime" in p.stdout


def test_conv_bf16_times_the_taps_kernel_against_itself_turned_off():
    """bench/conv_bf16.py --baseline taps-off on ResNet-18's stem alone: the bf16 model timed with
    the AMX taps kernel on and off (PTO_CONV_TAPS around the baseline's calls), both within bf16's
    tolerance of eager fp32 (the script checks), one table row with both times and their ratio;
    an unknown baseline is refused."""
    import os
    import subprocess

    import pypto

    env = dict(os.environ, PYTHONPATH=str(Path(pypto.__file__).resolve().parents[1]))
    env.pop("PTO_CONV_TAPS", None)
    bench = Path(__file__).resolve().parents[2] / "bench" / "conv_bf16.py"
    p = subprocess.run([sys.executable, str(bench), "--model", "resnet18", "--layers", "7x7",
                        "--baseline", "taps-off", "--quick"], capture_output=True, text=True,
                       timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "| bf16 taps off ms | bf16 taps on ms |" in p.stdout, p.stdout
    (row,) = [r for r in p.stdout.splitlines() if r.startswith("| 3->64 @224 7x7 s2 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    off, on, ratio = float(cells[4]), float(cells[5]), float(cells[6].rstrip("x"))
    assert off > 0 and on > 0 and ratio == pytest.approx(off / on, rel=0.01)
    p = subprocess.run([sys.executable, str(bench), "--baseline", "nosuch"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert p.returncode == 2 and "invalid choice" in p.stderr, p.stderr


@pytest.mark.parametrize("args,message", [(["--rounds", "0"], "--rounds must be at least 1"),
                                          (["--models", "nosuch"], "unknown model(s) nosuch"),
                                          (["--threads", "0"], "--threads must be at least 1"),
                                          (["--budget", "0"], "must be positive")])
def test_zoo_speed_rejects_bad_options(args, message):
    import subprocess

    bench = Path(__file__).resolve().parents[2] / "bench" / "zoo_speed.py"
    p = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_onnx_exporter_sweep_checks_a_dynamo_export_against_eager(tmp_path):
    """bench/onnx_exporter_sweep.py on one small model, dynamic batch: the dynamo exporter's file
    runs in onnxruntime and PyPTO (levels 2, 3) at batches 1 and 3, each within 1e-4 of eager
    PyTorch, every node on a CPU kernel; an unknown model is a usage error."""
    import json
    import subprocess

    bench = Path(__file__).resolve().parents[2] / "bench" / "onnx_exporter_sweep.py"
    out = tmp_path / "rows.jsonl"
    p = subprocess.run([sys.executable, str(bench), "--models", "squeezenet1_1", "--dynamic",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["status"] == "ok" and row["reference_ops"] == [], row
    assert set(row["err"]) == {f"{e} b{b}" for e in ("ort", "L2", "L3") for b in (1, 3)}
    assert max(row["err"].values()) <= 1e-4, row
    assert "1 ok" in p.stdout
    p = subprocess.run([sys.executable, str(bench), "--models", "nosuch"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "not zoo models: nosuch" in p.stderr, p.stderr


def test_zoo_profile_lists_both_engines_kernels(tmp_path):
    """bench/zoo_profile.py on a Conv -> Relu -> MatMul file: onnxruntime's nodes and PyPTO's
    kernels, each covering the graph, with positive times."""
    import json
    import subprocess

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    m = numpy_helper.from_array(rng.standard_normal((30, 5)).astype(np.float32), "m")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("MatMul", ["r", "m"], ["y"], name="matmul")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 30, 30])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w, m])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    out = tmp_path / "prof.json"
    bench = Path(__file__).resolve().parents[2] / "bench" / "zoo_profile.py"
    p = subprocess.run([sys.executable, str(bench), str(path), "--runs", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(out.read_text())
    covered = {s for k in d["pypto"] for s in k["sources"]}
    assert covered == {"conv", "relu", "matmul"}
    assert all(k["ms"] > 0 for k in d["pypto"]) and d["pypto_call_ms"] > 0
    assert {n["op"] for n in d["ort"]} >= {"MatMul"} and all(n["ms"] >= 0 for n in d["ort"])
    assert "by PyPTO kernel" in p.stdout


def test_pto_bench_rejects_an_unknown_benchmark_and_runs_a_known_one(pto_bin):
    import json
    import subprocess

    bench = pto_bin.parent / "bench" / "pto_bench"
    p = subprocess.run([str(bench), "--only", "fma,nosuch"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "unknown benchmark 'nosuch'" in p.stderr, p.stderr
    p = subprocess.run([str(bench), "--only", "fma", "--quick", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["fma"] and "memory" not in out and out["fma"][0]["gflops"] > 0


def test_pto_bench_amx_stores(pto_bin):
    """--only amx_stores measures the AMX products with C's stores for each K, C size and output
    type (where the CPU has AMX-BF16; an empty list and a note elsewhere), and only when asked."""
    import json
    import subprocess

    bench = str(pto_bin.parent / "bench" / "pto_bench")
    p = subprocess.run([bench, "--only", "amx_stores", "--threads", "1", "--quick", "--max-time",
                        "0.02", "--min-calls", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    rows = out["amx_stores"]
    if "amx_bf16" not in open("/proc/cpuinfo").read():
        assert rows == [] and "no AMX-BF16" in p.stderr, (rows, p.stderr)
        return
    keys = {(r["k"], r["c"], r["out"]) for r in rows}
    assert keys == {(k, c, o) for k in (64, 128, 256, 576) for c in ("l2", "memory")
                    for o in ("f32", "bf16")}, keys
    for r in rows:
        assert r["gflops"] > 0 and r["threads"] == 1, r
        assert r["c_kib"] == (128 if r["c"] == "l2" else 2048) * (
            2 if r["out"] == "bf16" else 4), r
    p = subprocess.run([bench, "--only", "fma", "--quick", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert "amx_stores" not in json.loads(p.stdout)


def test_pto_bench_weight_copies(pto_bin):
    """--weight-copies N packs N copies of B that calls take in turn (the product still checked
    against the double loop, or exactly for igemm); it needs --packed b or igemm and a count of at
    least 1."""
    import json
    import subprocess

    bench = str(pto_bin.parent / "bench" / "pto_bench")
    p = subprocess.run([bench, "--only", "sgemm", "--shapes", "48x64x80", "--packed", "b",
                        "--weight-copies", "3", "--precision", "f32,bf16", "--threads", "1",
                        "--quick", "--max-time", "0.05"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["sgemm"]
    assert [r["weight_copies"] for r in rows] == [3, 3]
    assert all(r["ok"] and r["gflops"] > 0 for r in rows), rows
    p = subprocess.run([bench, "--only", "igemm", "--shapes", "48x64x80", "--weight-copies", "2",
                        "--threads", "1", "--quick", "--max-time", "0.05"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)["igemm"]
    assert row["weight_copies"] == 2 and row["ok"] and row["gops"] > 0, row
    for args, why in ((["--weight-copies", "2"], "only with --packed b or igemm"),
                      (["--packed", "b", "--weight-copies", "0"], "a count >= 1"),
                      (["--packed", "b", "--weight-copies", "1.5"], "a count >= 1")):
        p = subprocess.run([bench, "--only", "sgemm", *args], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode != 0 and why in p.stderr, (args, p.stderr)


def test_pto_bench_bf16x3_precision(pto_bin):
    """--precision bf16x3 times the split products, checked against the exact product (within
    its ~1e-5, not fp32's 1e-7 nor bf16's 1e-3); an unknown precision is rejected by name."""
    import json
    import subprocess

    bench = str(pto_bin.parent / "bench" / "pto_bench")
    p = subprocess.run([bench, "--only", "sgemm", "--shapes", "48x64x80", "--packed", "b",
                        "--precision", "f32,bf16x3", "--threads", "1", "--quick", "--max-time",
                        "0.05"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    f32, split = json.loads(p.stdout)["sgemm"]
    assert split["precision"] == "bf16x3" and split["ok"] and split["gflops"] > 0, split
    assert f32["max_rel_err"] < split["max_rel_err"] < 1e-4, (f32, split)
    assert split["plan"].startswith("bf16x3 ("), split["plan"]
    p = subprocess.run([bench, "--only", "sgemm", "--precision", "tf32"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "expected f32, bf16, f16 or bf16x3" in p.stderr, p.stderr


UNSEEN = Path(__file__).resolve().parents[2] / "bench" / "unseen_models.py"


def _unseen_models():
    """bench/unseen_models.py as a module (its model lists; nothing is built)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("unseen_models", UNSEEN)
    um = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(um)
    return um


def test_unseen_models_fourth_set_names_timm_architectures():
    """bench/unseen_models.py --set fourth: 38 architectures, each one the installed timm has
    (a misspelt name would only show as an error row deep in a 40-minute sweep), none already in
    an earlier set; an unknown set is rejected."""
    import subprocess

    timm = pytest.importorskip("timm")
    um = _unseen_models()
    fourth = um.SETS["fourth"]
    assert len(fourth) == 38 and len(set(fourth)) == 38
    assert not set(fourth) & (set(um.SETS["first"]) | set(um.SETS["third"]))
    known = set(timm.list_models())
    assert [n for n in fourth if n not in known] == []
    assert all(um.PACKAGES[n] == "timm" for n in fourth)
    p = subprocess.run([sys.executable, str(UNSEEN), "--set", "seventh"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "invalid choice: 'seventh'" in p.stderr, p.stderr


def test_unseen_models_fifth_set_names_installed_architectures():
    """bench/unseen_models.py --set fifth: 50 architectures, none in an earlier set; each timm
    name one the installed timm has, each Hugging Face class (config and model) one the installed
    transformers has."""
    import inspect

    timm = pytest.importorskip("timm")
    transformers = pytest.importorskip("transformers")
    um = _unseen_models()
    fifth = um.SETS["fifth"]
    assert len(fifth) == 50 and len(set(fifth)) == 50
    earlier = set(um.SETS["first"]) | set(um.SETS["third"]) | set(um.SETS["fourth"])
    assert not set(fifth) & earlier
    known = set(timm.list_models())
    by_package = {"timm": [], "transformers": []}
    for n in fifth:
        by_package[um.PACKAGES[n]].append(n)
    assert [n for n in by_package["timm"] if n not in known] == []
    for n in by_package["transformers"]:
        names = inspect.getclosurevars(um.MODELS[n][0]).nonlocals
        assert hasattr(transformers, names["config"]) and hasattr(transformers, names["model"]), n
    assert len(by_package["timm"]) == 33 and len(by_package["transformers"]) == 17


def test_unseen_models_sixth_set_names_installed_architectures():
    """bench/unseen_models.py --set sixth: 36 architectures, none in an earlier set, 7 of timm
    (each one the installed timm has) and 29 of transformers."""
    timm = pytest.importorskip("timm")
    um = _unseen_models()
    sixth = um.SETS["sixth"]
    assert len(sixth) == 36 and len(set(sixth)) == 36
    earlier = set().union(*(um.SETS[s] for s in ("first", "third", "fourth", "fifth")))
    assert not set(sixth) & earlier
    timm_names = [n for n in sixth if um.PACKAGES[n] == "timm"]
    assert len(timm_names) == 7 and not set(timm_names) - set(timm.list_models())
    assert sum(um.PACKAGES[n] == "transformers" for n in sixth) == 29


def test_run_models_are_zoo_models_and_the_default_is_the_peer_table():
    """bench/run.py --models: every name one the test zoo builds (a misspelt one would only fail
    minutes into a run); without --models, the five models of the README's peer table."""
    import importlib.util

    import torch_models

    spec = importlib.util.spec_from_file_location("bench_run", UNSEEN.parent / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    assert set(run.MODELS) <= set(torch_models.ZOO), set(run.MODELS) - set(torch_models.ZOO)
    assert run.DEFAULT_MODELS == ["resnet18", "resnet50", "mobilenet_v2", "bert", "gpt2"]
    assert {"shufflenet_v2_x0_5", "ghostnet_100", "levit_128s"} <= set(run.MODELS)


def test_fp16_models_checks_an_fp16_file_against_the_fp32_one(tmp_path):
    """bench/fp16_models.py's check of one file pair (here model.half() exported by torch, as the
    converter is not a dependency): both engines' errors against onnxruntime on the fp32 file,
    PyPTO's at the fp16 rounding's size and not zero (the fp16 file ran), every node on the CPU
    kernels, the three timings."""
    import fp16_models

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 8, 3, padding=1), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 12 * 12, 10)).eval()
    x = torch.randn(1, 3, 12, 12)
    f32, f16 = tmp_path / "m.onnx", tmp_path / "m16.onnx"
    torch.onnx.export(model, (x,), str(f32), dynamo=False, opset_version=17)
    torch.onnx.export(model.half(), (x.half(),), str(f16), dynamo=False, opset_version=17)
    # the torch export takes fp16 inputs: a file whose inputs are fp16 is fed fp16
    row = fp16_models.check(f32, f16, level=3, seconds=0.01, half_inputs=True)
    assert 0 < row["pto16_err"] < 5e-3, row
    assert row["ort16_err"] < 5e-3 and row["reference_nodes"] == [], row
    assert min(row["pto16_ms"], row["pto32_ms"], row["ort16_ms"]) > 0


@pytest.mark.parametrize("what,message", [("missing", "no such file or folder: "),
                                          ("empty", "no .onnx files in ")])
def test_fp16_models_rejects_paths_with_nothing_to_convert(tmp_path, what, message):
    """A path that does not exist, or a folder without .onnx files: a message and exit status 2
    (checked before the converter is imported), not a traceback or a table of errors."""
    import subprocess

    path = tmp_path / "nosuch" if what == "missing" else tmp_path
    bench = Path(__file__).resolve().parents[2] / "bench" / "fp16_models.py"
    p = subprocess.run([sys.executable, str(bench), str(path)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and message + str(path) in p.stderr, p.stderr


@pytest.mark.parametrize("level,blocked", [(2, False), (3, True)])
def test_precision_level_reaches_the_pypto_engines(level, blocked):
    """bench/precision.py --level compiles the pypto engines at that level: MobileNetV2 in bf16
    runs blocked convs (ConvBlocked, DwPwConvBlocked) at level 3 only. AMX turned off: where bf16
    products run on AMX tiles the convs stay on the implicit GEMM at every level (AssignLayouts)."""
    import json
    import os
    import subprocess

    bench = Path(__file__).resolve().parents[2] / "bench" / "precision.py"
    p = subprocess.run([sys.executable, str(bench), "--quick", "--level", str(level), "--child",
                        "--model", "mobilenet_v2", "--engine", "pypto-bf16", "--threads", "1"],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PTO_DISABLE_EXT": "amx_bf16"})
    assert p.returncode == 0, p.stderr[-2000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("@@bench-result@@"))
    result = json.loads(line[len("@@bench-result@@"):])
    assert result["status"] == "ok" and result["level"] == level, result
    assert any("ConvBlocked" in k for k in result["kernels"]) == blocked, result["kernels"]
    assert result["max_rel_err"] < 3e-2


def test_precision_rejects_an_unknown_level():
    import subprocess

    bench = Path(__file__).resolve().parents[2] / "bench" / "precision.py"
    p = subprocess.run([sys.executable, str(bench), "--level", "4"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "--level" in p.stderr and "invalid choice" in p.stderr, p.stderr


def test_generate_peer_matches_generate_and_counts_the_weights_a_step_reads(tmp_path):
    # bench/generate.py's ONNX loops (the decoder exported with its KV cache) must produce
    # what transformers' generate() does, and its bandwidth figure counts the weights a decode
    # step reads: the tied GPT-2 head yes, Llama's gathered-only embedding table no.
    import transformers

    import generate
    import generate_ort

    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=300)).eval()
    ids = torch.randint(0, 300, (1, 7))
    with torch.inference_mode():
        want = gpt2.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                             min_new_tokens=6, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=0)
    # ONNX Runtime's loop, and the same file and loop on pypto.onnx.load (the pypto-onnx engine).
    import pypto

    try:
        # Both runtimes on the TorchScript export; PyPTO on the dynamo one too (--exporter dynamo).
        for make, dynamo in ((generate_ort.ort_generator, False),
                             (generate_ort.pypto_onnx_generator, False),
                             (generate_ort.pypto_onnx_generator, True)):
            name = f"{make.__name__}-{dynamo}"
            tokens, scores = make(gpt2, ids, 1, str(tmp_path / name), dynamo=dynamo)(6)
            assert tokens == want.sequences[0, 7:].tolist(), name
            for got, ref in zip(scores, want.scores):
                finite = torch.isfinite(ref)
                assert torch.equal(finite, torch.isfinite(got))
                assert (got - ref)[finite].abs().max() <= 1e-4 * ref[finite].abs().max()
            assert not gpt2.training
    finally:
        pypto.set_num_threads(None)  # the PyPTO loop set 1 thread for this process

    params = sum(p.numel() for p in gpt2.parameters()) * 4
    assert generate.weight_bytes(gpt2) == params - gpt2.transformer.wpe.weight.numel() * 4
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        vocab_size=300))
    table = llama.model.embed_tokens.weight.numel() * 4
    assert generate.weight_bytes(llama) == sum(p.numel() for p in llama.parameters()) * 4 - table


def test_generate_rejects_an_unknown_exporter():
    import subprocess

    bench = Path(__file__).resolve().parents[2] / "bench" / "generate.py"
    p = subprocess.run([sys.executable, str(bench), "--exporter", "onnxscript"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--exporter" in p.stderr and "invalid choice" in p.stderr, p.stderr


def test_threading_alone_times_every_mode_and_rejects_unknown_ones(tmp_path):
    """bench/threading_alone.py on one small model: a median per round for each mode asked."""
    import json
    import subprocess

    out = tmp_path / "modes.json"
    r = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parents[2] / "bench" / "threading_alone.py"),
         "--models", "mobilenet_v3_small", "--modes", "own,auto", "--rounds", "2", "--calls", "3",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    results = json.loads(out.read_text())["results"]["mobilenet_v3_small"]
    assert set(results) == {"own", "auto"}
    assert all(len(v) == 2 and all(t > 0 for t in v) for v in results.values())
    assert "mobilenet_v3_small" in r.stdout and "median" in r.stdout
    r = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "bench" /
                                            "threading_alone.py"), "--modes", "gomp"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--modes: own, auto and/or omp" in r.stderr


def test_precision_tables_set_matmul_high_beside_its_peers():
    """bench/precision.py's tables: PyPTO under matmul precision "high" beside ORT, Inductor fp32
    and Inductor under torch's own "high", with its error; the GEMM table's bf16x3 column as
    fp32-equivalent GFLOP/s against fp32's and the FMA peak."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import precision

    ok = lambda ms, err=1e-6: {"status": "ok", "median": ms / 1e3, "max_rel_err": err}  # noqa: E731
    results = [{"model": "bert", "threads": 1,
                "results": {"ort": ok(150), "inductor": ok(120), "inductor-high": ok(125),
                            "pypto": ok(140, 6e-7), "pypto-high": ok(100, 9e-6)}}]
    head, _, row = precision.model_table(results)
    cells = dict(zip([c.strip() for c in head.strip("|").split("|")],
                     [c.strip() for c in row.strip("|").split("|")]))
    assert cells["PyPTO 'high' (bf16x3)"] == "100.00 ms"
    assert cells["Inductor 'high' (tf32)"] == "125.00 ms"
    assert cells["PyPTO 'high' vs ORT fp32"] == "1.50x"
    assert cells["vs Inductor 'high'"] == "1.25x"
    assert cells["'high' rel. error (PyPTO / Inductor; PyPTO fp32)"] == "9.0e-06 / 1.0e-06 / 6.0e-07"
    pb = {"fma": [{"isa": "avx512", "threads": 1, "gflops": 200.0}],
          "sgemm": [{"m": 128, "k": 768, "n": 768, "precision": p, "gflops": g, "plan": ""}
                    for p, g in (("f32", 150.0), ("bf16", 800.0), ("bf16x3", 270.0))]}
    rows = precision.gemm_table({1: pb})
    cells = [c.strip() for c in rows[2].strip("|").split("|")]
    assert cells[-3:] == ["270", "1.80x", "135%"], cells
