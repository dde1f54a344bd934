"""pypto.optimize: the module it returns, the symbolic batch, shared parameters and bad input."""

import logging

import pytest
import torch

import pypto


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class TwoInputs(torch.nn.Module):
    def forward(self, x, y, *, scale: float = 2.0):
        return {"sum": x + y, "scaled": x * scale}


def mlp():
    torch.manual_seed(0)
    return MLP().eval()


def test_returns_a_module_that_matches_eager():
    model = mlp()
    x = torch.randn(3, 16)
    fast = pypto.optimize(model, example_inputs=(x,), level=2)
    assert isinstance(fast, torch.nn.Module)
    torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    assert "Gemm" in fast.graph.ops


def test_without_example_inputs_it_compiles_on_the_first_call():
    model = mlp()
    fast = pypto.optimize(model)  # as the seeds' users write it
    assert "not compiled yet" in repr(fast)
    x = torch.randn(3, 16)
    torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    assert fast.dynamic_dims["batch"][0] == 1
    x = torch.randn(5, 16)
    torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)


def test_one_compiled_module_serves_every_batch_size():
    model = mlp()
    fast = pypto.optimize(model, example_inputs=(torch.randn(1, 16),))
    assert fast.dynamic_dims["batch"][0] == 1
    for b in (1, 2, 5, 64):
        x = torch.randn(b, 16)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    # The graph input really is symbolic: one compiled object, no recompilation per size.
    assert fast.graph.type(fast.graph.inputs[0]) == ("f32", ["batch", 16])


def test_a_batch_outside_the_declared_range_is_an_error():
    fast = pypto.optimize(mlp(), example_inputs=(torch.randn(2, 16),), max_batch=4)
    assert fast.dynamic_dims["batch"] == (1, 4)
    fast(torch.randn(4, 16))
    with pytest.raises(ValueError, match=r"input 'x': dimension 0 \('batch'\) is 5, outside "
                                         r"the declared range \[1, 4\]"):
        fast(torch.randn(5, 16))


def test_static_compilation_rejects_other_shapes():
    fast = pypto.optimize(mlp(), example_inputs=(torch.randn(2, 16),), dynamic=False)
    assert fast.dynamic_dims == {}
    with pytest.raises(ValueError, match=r"input 'x': dimension 0 should be 2, got 3"):
        fast(torch.randn(3, 16))


def test_parameters_are_shared_with_the_module_not_copied():
    model = mlp()
    fast = pypto.optimize(model, example_inputs=(torch.randn(2, 16),))
    g = fast.graph
    for name, p in model.named_parameters():
        shared = torch.from_dlpack(g.initializer(name))
        assert shared.data_ptr() == p.data_ptr(), name
    # Updating a weight in place is seen by the compiled module (same memory).
    x = torch.randn(2, 16)
    with torch.no_grad():
        model.fc2.bias.add_(1.0)
    torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)


def test_structured_inputs_and_outputs_and_keyword_arguments():
    model = TwoInputs()
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    fast = pypto.optimize(model, example_inputs=(x, y), example_kwargs={"scale": 3.0})
    got = fast(x, y, scale=3.0)
    assert set(got) == {"sum", "scaled"}
    torch.testing.assert_close(got["sum"], x + y)
    torch.testing.assert_close(got["scaled"], x * 3.0)
    with pytest.raises(ValueError, match="was 3.0 when the module was optimized and is 4.0"):
        fast(x, y, scale=4.0)


def test_levels():
    x = torch.randn(2, 16)
    for level in range(4):
        assert pypto.optimize(mlp(), (x,), level=level).compiled.level == level
    with pytest.raises(ValueError, match="level must be 0..3, got 7"):
        pypto.optimize(mlp(), (x,), level=7)
    with pytest.raises(TypeError, match="level must be an int"):
        pypto.optimize(mlp(), (x,), level="fast")


def test_wrong_inputs_are_clear_errors():
    fast = pypto.optimize(mlp(), example_inputs=(torch.randn(2, 16),))
    with pytest.raises(ValueError, match=r"input 'x': expected rank 2"):
        fast(torch.randn(2, 16, 1))
    with pytest.raises(TypeError, match=r"input 'x': expected dtype f32, got f64"):
        fast(torch.randn(2, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"input 'x': dimension 1 should be 16, got 8"):
        fast(torch.randn(2, 8))
    with pytest.raises(TypeError, match=r"argument 'x' must be a torch.Tensor, got list"):
        fast([[0.0] * 16])
    with pytest.raises(ValueError, match=r"input 'x' is on meta"):
        fast(torch.randn(2, 16, device="meta"))
    with pytest.raises(TypeError, match=r"MLP: expected 1 positional argument\(s\) like the "
                                        r"example inputs, got 2"):
        fast(torch.randn(2, 16), torch.randn(2, 16))


def test_bad_calls_to_optimize():
    with pytest.raises(TypeError, match="expects a torch.nn.Module, got function"):
        pypto.optimize(lambda x: x, (torch.randn(2),))
    with pytest.raises(TypeError, match="do not match MLP.forward"):
        pypto.optimize(mlp(), (torch.randn(2, 16), torch.randn(2, 16)))


class UsesUnsupportedOp(torch.nn.Module):
    def forward(self, x):
        return torch.special.i0(x) + 1


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # control flow on data: torch.export cannot capture this
            return x * 2
        return x - 1


def test_an_unsupported_op_is_named():
    with pytest.raises(NotImplementedError, match=r"UsesUnsupportedOp uses op\(s\) PyPTO cannot "
                                                  r"run yet: aten\.i0\.default"):
        pypto.optimize(UsesUnsupportedOp(), (torch.randn(3),))


def test_a_model_that_cannot_be_captured_is_a_value_error():
    with pytest.raises(ValueError) as info:
        pypto.optimize(DataDependent(), (torch.randn(3),), dynamic=False)
    message = str(info.value)
    # The first line says what is wrong and what to do (torchvision's detectors fail this way:
    # NMS keeps a data-dependent number of boxes); torch's own account follows.
    assert message.startswith("[capture] DataDependent has shapes or control flow that depend "
                              "on tensor values"), message
    assert 'torch.compile(model, backend="pypto")' in message.splitlines()[0]
    assert "pypto.onnx.load" in message.splitlines()[0]
    assert "[capture] torch.export could not capture DataDependent" in message


def test_the_advice_for_data_dependent_models_holds():
    """What the error above recommends runs the model: torch.compile with the pypto backend
    (the branch on data stays in PyTorch), compared with eager on both branches."""
    compiled = torch.compile(DataDependent(), backend="pypto")
    for x in (torch.rand(5) + 0.1, -torch.rand(5) - 0.1):
        torch.testing.assert_close(compiled(x), DataDependent()(x))


class TakesAConfigObject(torch.nn.Module):
    def forward(self, x, cfg):
        return x * cfg.scale + cfg.shift


def test_fx_tracing_takes_over_where_export_cannot(caplog):
    import types

    cfg = types.SimpleNamespace(scale=2.0, shift=1.0)  # torch.export rejects this input type
    x = torch.randn(3, 4)
    with caplog.at_level(logging.WARNING, logger="pypto"):
        fast = pypto.optimize(TakesAConfigObject().eval(), (x, cfg))
    assert "tracing TakesAConfigObject with FX" in caplog.text
    torch.testing.assert_close(fast(x, cfg), x * 2 + 1)
    with pytest.raises(ValueError, match=r"input 'input_0': dimension 0 should be 3, got 5"):
        fast(torch.randn(5, 4), cfg)  # FX tracing compiles for the example's shapes only
    with pytest.raises(ValueError, match="when the module was optimized"):
        fast(x, types.SimpleNamespace(scale=3.0, shift=1.0))


def test_training_mode_warns(caplog):
    model = MLP()  # training mode
    with caplog.at_level(logging.WARNING, logger="pypto"):
        pypto.optimize(model, (torch.randn(2, 16),))
    assert "training mode" in caplog.text


def test_integer_and_bool_inputs():
    class Select(torch.nn.Module):
        def forward(self, ids, mask):
            return torch.where(mask, ids * 2, ids - 1)

    ids = torch.arange(12).reshape(3, 4)
    mask = ids % 3 == 0
    fast = pypto.optimize(Select(), (ids, mask))
    assert torch.equal(fast(ids, mask), Select()(ids, mask))


def test_declared_sequence_dimension_is_symbolic_too():
    import transformers
    from torch.export import Dim

    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 1000, (2, 12))
    fast = pypto.optimize(model, (ids,), dynamic_shapes={
        "input_ids": {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=2, max=64)}})
    assert fast.graph.type(fast.graph.inputs[0]) == ("i64", ["batch", "seq"])
    assert fast.dynamic_dims["seq"] == (2, 64)
    for shape in ((2, 12), (1, 7), (3, 30)):
        x = torch.randint(0, 1000, shape)
        with torch.inference_mode():
            want = model(x).last_hidden_state
        got = fast(x).last_hidden_state
        assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-4, shape


def test_a_dim_without_min_starts_at_1():
    from torch.export import Dim

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU()).eval()
    fast = pypto.optimize(model, (torch.randn(3, 6),),
                          dynamic_shapes={"input": {0: Dim("batch")}})
    assert fast.dynamic_dims["batch"][0] == 1
    for b in (1, 2, 7):
        x = torch.randn(b, 6)
        with torch.no_grad():
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"outside the declared range \[1, "):
        fast(torch.randn(0, 6))


class Stride32(torch.nn.Module):
    """Five stride-2 convolutions: torch.export needs the height and width to be multiples of 32."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.Sequential(*[torch.nn.Conv2d(3 if i == 0 else 4, 4, 3, stride=2,
                                                           padding=1) for i in range(5)])

    def forward(self, x):
        return self.convs(x)


def test_dynamic_spatial_dims_torch_cannot_use_are_a_capture_error_with_a_hint():
    from torch.export import Dim

    hw = Dim("H", min=32, max=512)
    with pytest.raises(ValueError, match=r"^\[capture\] torch.export cannot use the dynamic dims "
                                         r"you declared for Stride32: (.|\n)*Not all values of H"
                                         r"(.|\n)*\[capture\] hint: (.|\n)*32 \* Dim\("):
        pypto.optimize(Stride32().eval(), (torch.randn(2, 3, 64, 96),),
                       dynamic_shapes={"x": {2: hw, 3: Dim("W", min=32, max=512)}})


class Stride32Skip(Stride32):
    """Upsampled back and added to the input: the size must equal 32 * (size // 32)."""

    def forward(self, x):
        return torch.nn.functional.interpolate(self.convs(x), scale_factor=32) + x[:, :1]


def test_torchs_suggested_fixes_become_the_hint():
    from torch.export import Dim

    with pytest.raises(ValueError, match=r"\[capture\] hint: (.|\n)*H = 32 \* Dim\('h', min=1, "
                                         r"max=16\); W = 32 \* Dim\('w', min=1, max=16\)"):
        pypto.optimize(Stride32Skip().eval(), (torch.randn(2, 3, 64, 96),),
                       dynamic_shapes={"x": {2: Dim("H", min=32, max=512),
                                             3: Dim("W", min=32, max=512)}})


def test_derived_spatial_dims_stay_symbolic_as_products():
    from torch.export import Dim

    torch.manual_seed(0)
    model = Stride32().eval()
    h, w = Dim("h", min=1, max=16), Dim("w", min=1, max=16)
    fast = pypto.optimize(model, (torch.randn(2, 3, 64, 96),), dynamic_shapes={
        "x": {0: Dim("batch", min=1, max=8), 2: 32 * h, 3: 32 * w}})
    assert fast.graph.type(fast.graph.inputs[0]) == ("f32", ["batch", 3, "32*h", "32*w"])
    assert fast.dynamic_dims["32*h"] == (32, 512) and fast.dynamic_dims["w"][1] == 16
    for shape in ((1, 3, 64, 96), (3, 3, 128, 64)):
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"dimension 2 \('32\*h'\) is 70, not a multiple of 32"):
        fast(torch.randn(1, 3, 70, 64))


def test_mixture_of_experts_captured_with_static_shapes():
    """transformers' default experts implementation (grouped_mm: data-dependent row ranges, an
    opaque custom op) cannot be exported; the capture runs the experts as "batched_mm" and puts
    the config back."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=96, vocab_size=500,
                                     num_local_experts=4, num_experts_per_tok=2, use_cache=False)
    torch.manual_seed(0)
    model = transformers.MixtralModel(cfg).eval()
    before = model.config._experts_implementation
    assert before != "batched_mm"
    fast = pypto.optimize(model, example_inputs=(torch.randint(0, 500, (1, 12)),))
    assert model.config._experts_implementation == before
    assert {b for _, b in fast.compiled.node_backends} == {"cpu"}
    for batch in (1, 3):
        ids = torch.randint(0, 500, (batch, 12))
        with torch.inference_mode():
            want = model(ids).last_hidden_state
        torch.testing.assert_close(fast(ids).last_hidden_state, want, rtol=1e-4, atol=1e-5)


def test_arange_of_types_onnx_range_lacks():
    """torch.arange in uint8, int8 and float16 (transformers' chunked delta rule builds a uint8
    one): Range counts in int64 or float32 and is cast, as eager gives."""

    class Ranges(torch.nn.Module):
        def forward(self, x):
            n = x.shape[-1]
            a = torch.arange(n, dtype=torch.uint8)
            b = torch.arange(2, n + 2, dtype=torch.int8)
            c = torch.arange(n, dtype=torch.float16) * 0.5
            return x + a.float() + b.float() + c.float()

    x = torch.randn(3, 7)
    fast = pypto.optimize(Ranges(), (x,))
    torch.testing.assert_close(fast(x), Ranges()(x))


def test_a_decoder_with_its_kv_cache_on_compiles_without_it(caplog):
    # transformers' decoders load with config.use_cache on and return a Cache object that no
    # compiled graph can return: the capture failed on it. Now it runs with the cache off, says
    # so, and leaves the model's config as it was.
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=500, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 500, (1, 16))
    with caplog.at_level(logging.WARNING, logger="pypto"):
        fast = pypto.optimize(model, example_inputs=(ids,))
    assert "compiling LlamaForCausalLM with use_cache=False" in caplog.text
    assert "torch.compile(model.forward" in caplog.text
    assert model.config.use_cache is True
    for batch in (1, 3):
        x = torch.randint(0, 500, (batch, 16))
        with torch.inference_mode():
            want = model(x).logits
        got = fast(x)
        assert got.past_key_values is None
        err = (got.logits - want).abs().max().item() / want.abs().max().item()
        assert err <= 1e-5, f"batch {batch}: relative error {err:.2e}"
