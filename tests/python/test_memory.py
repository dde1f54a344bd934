"""The memory compiled models allocate from: each model's own caching pool by default, one
process-wide pool after pypto.enable_memory_pool(), and pypto.memory_stats() over all of them."""

from __future__ import annotations

import gc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import pypto
import pypto.onnx


def _model(path, rows: int, cols: int):
    """x -> Exp -> Transpose -> Neg: the Exp result is an intermediate (the transpose keeps the two
    elementwise ops apart), so a run takes an arena block and an output block from its pool."""
    nodes = [helper.make_node("Exp", ["x"], ["e"]),
             helper.make_node("Transpose", ["e"], ["t"], perm=[1, 0]),
             helper.make_node("Neg", ["t"], ["y"])]
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, cols])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [cols, rows])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def no_shared_pool():
    yield
    pypto.enable_memory_pool(False)
    gc.collect()


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("by", ["enable_memory_pool", "set_memory_allocator"])
def test_a_shared_pool_serves_the_next_model_from_the_blocks_the_first_gave_back(
        tmp_path, no_shared_pool, shared, by):
    if by == "enable_memory_pool":
        pypto.enable_memory_pool(shared)
    else:  # the name some guides use: "unified" is the process-wide pool
        pypto.enable_memory_pool(not shared)
        pypto.set_memory_allocator("unified" if shared else "per_model")
    assert pypto.memory.pool_enabled() == shared
    x = np.random.default_rng(0).standard_normal((256, 384)).astype(np.float32)
    a = pypto.onnx.load(_model(tmp_path / "a.onnx", 256, 384))
    b = pypto.onnx.load(_model(tmp_path / "b.onnx", 256, 384))
    ya = a(x)
    np.testing.assert_allclose(ya, -np.exp(x).T, rtol=1e-6)
    del ya  # its block goes back to a's pool
    before = b._compiled.memory_stats
    yb = b(x)
    after = b._compiled.memory_stats
    np.testing.assert_allclose(yb, -np.exp(x).T, rtol=1e-6)
    taken = after["system_allocations"] - before["system_allocations"]
    if shared:
        # b's arena and output come from the blocks a's run gave back: nothing new from the system
        assert taken == 0, (before, after)
        assert a._compiled.memory_stats == after  # one pool
    else:
        assert taken >= 2, (before, after)  # its own empty pool: arena and output
        assert a._compiled.memory_stats["system_allocations"] >= 2


def test_memory_stats_sum_the_live_pools(tmp_path, no_shared_pool):
    gc.collect()
    start = pypto.memory_stats()
    assert set(start) == {"reserved_bytes", "in_use_bytes", "peak_in_use_bytes",
                          "system_allocations", "pool_hits"}
    x = np.ones((64, 96), np.float32)
    models = [pypto.onnx.load(_model(tmp_path / f"m{i}.onnx", 64, 96)) for i in range(2)]
    outs = [m(x) for m in models]
    now = pypto.memory_stats()
    own = [m._compiled.memory_stats for m in models]
    for key in ("reserved_bytes", "in_use_bytes", "system_allocations"):
        assert now[key] - start[key] == sum(s[key] for s in own), key
    assert now["in_use_bytes"] - start["in_use_bytes"] >= 2 * x.nbytes  # the two outputs
    del outs, models
    gc.collect()
    assert pypto.memory_stats()["reserved_bytes"] <= now["reserved_bytes"]


def test_set_memory_allocator_rejects_other_allocators(no_shared_pool):
    with pytest.raises(ValueError, match="unknown allocator 'npu'.*'unified'.*'per_model'"):
        pypto.set_memory_allocator("npu")
    with pytest.raises(TypeError, match="kind must be a str"):
        pypto.set_memory_allocator(True)
    assert not pypto.memory.pool_enabled()


def test_enable_memory_pool_takes_a_bool():
    with pytest.raises(TypeError, match="must be a bool"):
        pypto.enable_memory_pool("yes")


@pytest.fixture
def default_policy():
    pypto.memory.reset_policy()
    yield
    pypto.memory.reset_policy()


def test_policy_set_get_and_reset_round_trip(default_policy):
    assert pypto.memory.get_policy() == {"prefetch_distance": -1, "reuse_distance": 0,
                                         "nontemporal": "auto"}
    pypto.memory.set_policy(prefetch_distance=8, nontemporal="never")
    pypto.memory.set_policy(reuse_distance=2)  # None keeps the others
    assert pypto.memory.get_policy() == {"prefetch_distance": 8, "reuse_distance": 2,
                                         "nontemporal": "never"}
    pypto.memory.set_policy(prefetch_distance=0, reuse_distance=64, nontemporal="always")
    assert pypto.memory.get_policy() == {"prefetch_distance": 0, "reuse_distance": 64,
                                         "nontemporal": "always"}
    pypto.memory.reset_policy()
    assert pypto.memory.get_policy()["nontemporal"] == "auto"
    assert pypto.memory.get_policy()["prefetch_distance"] == -1


@pytest.mark.parametrize("kwargs, error, match", [
    ({"prefetch_distance": 1.5}, TypeError, "prefetch_distance must be an int"),
    ({"prefetch_distance": True}, TypeError, "prefetch_distance must be an int"),
    ({"prefetch_distance": -2}, ValueError, r"prefetch_distance must be in -1\.\.1024, got -2"),
    ({"prefetch_distance": 1025}, ValueError, "prefetch_distance must be in"),
    ({"reuse_distance": "2"}, TypeError, "reuse_distance must be an int, not str"),
    ({"reuse_distance": -1}, ValueError, r"reuse_distance must be in 0\.\.64"),
    ({"reuse_distance": 65}, ValueError, "reuse_distance must be in"),
    ({"nontemporal": 1}, TypeError, "nontemporal must be a str"),
    ({"nontemporal": "sometimes"}, ValueError, "nontemporal must be one of auto, never, always"),
])
def test_policy_rejects_bad_values_and_keeps_the_old_policy(default_policy, kwargs, error, match):
    pypto.memory.set_policy(reuse_distance=3)
    with pytest.raises(error, match=match):
        pypto.memory.set_policy(**kwargs)
    assert pypto.memory.get_policy()["reuse_distance"] == 3
    assert pypto.memory.get_policy()["prefetch_distance"] == -1


def _graph_model(path, nodes, inputs, output_shape, inits=()):
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
        initializer=list(inits))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def _policy_cases(tmp_path):
    """(name, model path, inputs): an elementwise chain over two inputs (one broadcast),
    LayerNorm and Softmax with odd rows, so streamed rows start at every alignment."""
    rng = np.random.default_rng(0)
    r, c = 37, 1003
    a = rng.standard_normal((r, c)).astype(np.float32)
    b = rng.standard_normal((1, c)).astype(np.float32)
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    chain = _graph_model(tmp_path / "chain.onnx",
                         [helper.make_node("Sigmoid", ["a"], ["s"]),
                          helper.make_node("Mul", ["s", "b"], ["t"]),
                          helper.make_node("Add", ["t", "one"], ["y"])],
                         [("a", [r, c]), ("b", [1, c])], [r, c], [one])
    g = helper.make_tensor("g", TensorProto.FLOAT, [c], rng.standard_normal(c))
    beta = helper.make_tensor("beta", TensorProto.FLOAT, [c], rng.standard_normal(c))
    ln = _graph_model(tmp_path / "ln.onnx",
                      [helper.make_node("LayerNormalization", ["x", "g", "beta"], ["y"], axis=-1)],
                      [("x", [r, c])], [r, c], [g, beta])
    sm = _graph_model(tmp_path / "sm.onnx", [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                      [("x", [r, c])], [r, c])
    lsm = _graph_model(tmp_path / "lsm.onnx",
                       [helper.make_node("LogSoftmax", ["x"], ["y"], axis=-1)], [("x", [r, c])],
                       [r, c])
    return [("chain", chain, [a, b]), ("layernorm", ln, [a]), ("softmax", sm, [a]),
            ("logsoftmax", lsm, [a])]


POLICY_SETTINGS = [dict(nontemporal=nt) for nt in ("never", "always")] + [
    dict(prefetch_distance=pf) for pf in (0, 8, 32)] + [dict(reuse_distance=k) for k in (1, 2, 8)]


def test_outputs_are_bit_identical_under_every_policy(tmp_path, default_policy):
    import onnxruntime as ort

    for name, path, xs in _policy_cases(tmp_path):
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        want = sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), xs)})[0]
        base = pypto.onnx.load(path)(*xs)
        np.testing.assert_allclose(base, want, rtol=1e-5, atol=1e-5, err_msg=name)
        for setting in POLICY_SETTINGS:
            pypto.memory.set_policy(**setting)
            got = pypto.onnx.load(path)(*xs)
            pypto.memory.reset_policy()
            assert np.array_equal(got, base), (name, setting)


def test_a_small_bert_is_bit_identical_under_every_policy(default_policy):
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=128, vocab_size=1000)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 1000, (2, 16))
    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state
    base = pypto.optimize(model, example_inputs=(ids,))(ids).last_hidden_state
    torch.testing.assert_close(base, want, rtol=1e-4, atol=1e-4)
    for setting in POLICY_SETTINGS:
        pypto.memory.set_policy(**setting)
        got = pypto.optimize(model, example_inputs=(ids,))(ids).last_hidden_state
        pypto.memory.reset_policy()
        assert torch.equal(got, base), setting
