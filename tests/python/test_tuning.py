"""pypto.tuning.auto_tune: tunes a compiled model into a tuning cache file, recompiles it in place
(outputs still match eager PyTorch), and later compilations take the cache's knobs unless the
tune_cache option is off. Timing decides which candidates win, so the tests check that what the
cache file holds is what the compiles use, not that anything won."""

import json
import pathlib

import numpy as np
import pytest
import torch

import pypto


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(256, 512)
        self.fc2 = torch.nn.Linear(512, 128)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))) * torch.sigmoid(x[:, :128])


def mlp():
    torch.manual_seed(0)
    return MLP().eval()


def winners(path):
    """Entries with knobs in a tuning cache file (docs/tuning.md "The file")."""
    text = pathlib.Path(path).read_text()
    body = text[:text.rindex('"checksum"')].rstrip().rstrip(",") + "}"
    return sum(1 for e in json.loads(body)["entries"] if e["knobs"])


@pytest.fixture(autouse=True)
def options():
    yield
    pypto.reset_optimization_options()


def test_auto_tune_recompiles_in_place_and_later_compiles_use_the_cache(tmp_path):
    cache = tmp_path / "tune.json"
    model, x = mlp(), torch.randn(64, 256)
    fast = pypto.optimize(model, example_inputs=(x,))
    report = pypto.tuning.auto_tune(fast, level="exhaustive", num_trials=8, cache=str(cache))
    assert report["cache"] == str(cache) and report["kernels"]
    assert report["trials"] <= 8
    for k in report["kernels"]:
        assert k["planner_seconds"] > 0 and k["tuned_seconds"] > 0
        assert not k["knobs"] or k["tuned_seconds"] < k["planner_seconds"]
    n = winners(cache)
    assert report["tuned_kernels"] == n
    torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fast(torch.randn(3, 256)).shape, torch.Size([3, 128]))

    # A new compile of the same model reads the cache; with the option off it does not.
    pypto.set_optimization_options({"tune_cache_path": str(cache)})
    again = pypto.optimize(model, example_inputs=(x,))
    assert again.compiled.stats()["tuned_kernels"] == n
    torch.testing.assert_close(again(x), model(x), rtol=1e-4, atol=1e-4)
    pypto.set_optimization_options({"tune_cache": False})
    planner = pypto.optimize(model, example_inputs=(x,))
    assert planner.compiled.stats()["tuned_kernels"] == 0
    for i in range(len(planner.compiled.steps)):
        assert "knob" not in planner.compiled.describe_step(i)

    # Tuning again finds every kernel tuned before in the cache and tunes the rest.
    report2 = pypto.tuning.auto_tune(fast, level="exhaustive", cache=str(cache))
    tuned = {k["signature"] for k in report["kernels"] if not k["capped"]}
    assert tuned
    for k2 in report2["kernels"]:
        if k2["signature"] in tuned:
            assert k2["from_cache"], k2


def test_auto_tune_a_compiled_graph(tmp_path):
    fast = pypto.optimize(mlp(), example_inputs=(torch.randn(8, 256),))
    compiled = fast.compiled
    with pytest.raises(ValueError, match="example_inputs"):
        pypto.tuning.auto_tune(compiled)
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    report = pypto.tuning.auto_tune(compiled, level="fast", num_trials=4, example_inputs=[x],
                                    cache=str(tmp_path / "t.json"))
    assert report["trials"] <= 4
    want = mlp()(torch.from_numpy(x))
    torch.testing.assert_close(compiled.run([x])[0], want, rtol=1e-4, atol=1e-4)


def test_bad_arguments():
    fast = pypto.optimize(mlp(), example_inputs=(torch.randn(2, 256),))
    with pytest.raises(ValueError, match="level"):
        pypto.tuning.auto_tune(fast, level="quick")
    with pytest.raises(ValueError, match="num_trials"):
        pypto.tuning.auto_tune(fast, num_trials=0)
    with pytest.raises(TypeError, match="auto_tune expects"):
        pypto.tuning.auto_tune(object())
    with pytest.raises(ValueError, match="example inputs"):
        pypto.tuning.auto_tune(pypto.optimize(mlp()))
    with pytest.raises(ValueError, match="level must be one of"):  # the dict is read
        pypto.tuning.auto_tune(fast, tune_config={"level": "quick"})
    with pytest.raises(ValueError, match="unknown tune_config key.*'trials'"):
        pypto.tuning.auto_tune(fast, tune_config={"trials": 3})
    with pytest.raises(ValueError, match=r"level given twice \(level='fast' and"):
        pypto.tuning.auto_tune(fast, level="fast", tune_config={"level": "exhaustive"})
    with pytest.raises(TypeError, match="tune_config must be a dict"):
        pypto.tuning.auto_tune(fast, tune_config=["fast"])


def test_auto_tune_takes_its_settings_as_one_dict(tmp_path):
    """auto_tune(model, tune_config={level, num_trials, early_stop}) as the guides write it: the
    dict's num_trials caps the trials as the keyword does."""
    model, x = mlp(), torch.randn(16, 256)
    fast = pypto.optimize(model, example_inputs=(x,))
    report = pypto.tuning.auto_tune(fast, tune_config={"level": "exhaustive", "num_trials": 3,
                                                       "early_stop": True},
                                    cache=str(tmp_path / "t.json"))
    assert 1 <= report["trials"] <= 3
    torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)


def test_auto_tune_tries_every_conv_algorithm(tmp_path):
    """A 3x3, stride-1 conv on 32 channels: the implicit GEMM, the blocked direct kernel and
    Winograd on the blocked tensors all apply, so auto_tune times three candidates for it (and, on
    more than one thread, the conv on the calling thread only: for_load tries it even when other
    processes hold the cores); whichever wins, the tuned model matches eager PyTorch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 32, 14, 14)
    fast = pypto.optimize(model, example_inputs=(x,))
    report = pypto.tuning.auto_tune(fast, level="exhaustive", cache=str(tmp_path / "tune.json"),
                                    for_load=True)
    conv = [k for k in report["kernels"] if k["name"].startswith("Conv")]
    several = pypto.get_num_threads() > 1
    expected = 3 + several  # conv.threads {1} on several threads
    assert len(conv) == 1 and conv[0]["trials"] == expected, report["kernels"]
    assert (report["pool_speedup"] > 0) == several, report["pool_speedup"]
    # The shape classes: one (the conv's plane) on several threads, unless it won on its own.
    assert len(report["classes"]) <= several, report["classes"]
    torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
