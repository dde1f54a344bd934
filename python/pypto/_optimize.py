"""pypto.optimize: a torch.nn.Module in, a torch.nn.Module running the compiled graph out."""

from __future__ import annotations

import inspect
import logging
import threading
from typing import Any

import torch
import torch.utils._pytree as pytree

from . import _C, dtypes
from .frontend import torch_capture
from .amp import amp_dtype
from .runtime import CompiledGraph, PrecisionReport, output_errors

log = logging.getLogger("pypto")


class OptimizedModule(torch.nn.Module):
    """Runs a module's captured graph on PyPTO. Takes and returns what the module does (torch
    tensors, and the same output structure: tuples, dicts, transformers' ModelOutput)."""

    def __init__(self, module: torch.nn.Module, compile_fn):
        super().__init__()
        # Registered like torch.compile's OptimizedModule does: the parameters stay the
        # module's (the compiled graph shares their memory), state_dict() still works.
        self._orig_mod = module
        # (args, kwargs, output_names=True, mixed_precision=None) -> (Captured, CompiledGraph);
        # see export_graph
        self._compile_fn = compile_fn
        self._dtype: torch.dtype | None = None  # optimize(dtype=torch.bfloat16 / float16)
        self._example_args: tuple | None = None  # (args, kwargs) it was compiled from
        self._amp_compiled: dict[str, CompiledGraph] = {}  # for pypto.amp.autocast, by dtype
        self._f32_compiled: CompiledGraph | None = None  # precision_report's baseline
        self._captured: torch_capture.Captured | None = None
        self._compiled: CompiledGraph | None = None
        self._lock = threading.Lock()
        self._level: int | None = None  # the optimization level asked for (None: the option)
        self._example: list | None = None  # graph input shapes of the first call or example
        # Per-call shortcuts found at compile time (_shortcuts): the number of positional tensor
        # arguments when the graph's inputs are exactly those (-1: not so), and how the outputs
        # come back when no pytree is needed ("one": a tensor, "tuple": a flat tuple, None).
        self._flat_args = -1
        self._flat_out: str | None = None

    def _ensure_compiled(self, args=None, kwargs=None):
        """Captures and compiles on first use, from these arguments when no example was given."""
        if self._compiled is not None:
            return
        with self._lock:
            if self._compiled is None:
                if args is None:
                    raise RuntimeError("this module was optimized without example_inputs and "
                                       "has not been called yet: it compiles on its first call")
                self._captured, self._compiled = self._compile_fn(args, kwargs)
                self._example = [list(x.shape) for x in self._graph_inputs(args, kwargs or {})]
                self._example_args = (tuple(args), dict(kwargs or {}))
                self._shortcuts()

    def _shortcuts(self) -> None:
        """Finds whether calls can skip pytree: every argument a positional tensor that is a
        graph input, in order; outputs one tensor or a flat tuple of them."""
        cap = self._captured
        n = len(cap.inputs)
        if (all(kind == "tensor" for kind, _ in cap.inputs)
                and cap.in_spec == pytree.tree_structure((tuple(range(n)), {}))):
            self._flat_args = n
        k = len(self._compiled.output_names)
        if cap.out_spec == pytree.tree_structure(0):
            self._flat_out = "one"
        elif cap.out_spec == pytree.tree_structure(tuple(range(k))):
            self._flat_out = "tuple"

    @property
    def compiled(self) -> CompiledGraph:
        self._ensure_compiled()
        return self._compiled

    @property
    def graph(self):
        """The Tensor Graph (``print(fast.graph)`` shows it)."""
        return self.compiled.graph

    @property
    def dynamic_dims(self) -> dict[str, tuple[int, int]]:
        """Symbolic dimensions and their declared ranges, e.g. {"batch": (1, 2**63 - 1)}."""
        self._ensure_compiled()
        return dict(self._captured.dynamic)

    def export_graph(self, args, kwargs=None, output_names: list[str] | None = None):
        """The graph pypto.onnx.export writes: the compiled one, or with `output_names` one
        compiled again from these arguments with its outputs so named."""
        if output_names is None:
            self._ensure_compiled(args, kwargs)
            return self._compiled.graph
        if args is None:
            raise TypeError("output_names needs example arguments to capture the module with")
        return self._compile_fn(args, kwargs or {}, list(output_names))[1].graph

    def forward(self, *args, **kwargs):
        if _torch_autocast_on():
            raise RuntimeError(
                f"{type(self._orig_mod).__name__}: torch.autocast is not applied to a module "
                "optimized by PyPTO (its graph is already compiled); use "
                "pypto.optimize(model, dtype=torch.bfloat16 or torch.float16) or "
                "pypto.amp.autocast() for bf16/fp16 products, or call it outside torch.autocast")
        self._ensure_compiled(args, kwargs)
        compiled = self._compiled
        if self._dtype is None and amp_dtype() is not None:  # pypto.amp.autocast
            compiled = self._amp_variant(args, kwargs)
        inputs = self._graph_inputs(args, kwargs)
        if self._dtype is not None:  # a bf16/fp16 model: bf16/fp16 inputs in, outputs out
            # (widened where the graph takes fp32; a model.half() graph takes them as they are)
            inputs = [x.float() if x.dtype == self._dtype and t[0] == "f32" else x
                      for x, t in zip(inputs, compiled.input_types)]
        outs = compiled.run(inputs)  # a bf16 model's graph returns bf16 (capture output_dtype)
        if self._flat_out == "one":
            return outs[0]
        if self._flat_out == "tuple":
            return tuple(outs)
        return pytree.tree_unflatten(outs, self._captured.out_spec)

    def precision_report(self, *args, **kwargs) -> "PrecisionReport":
        """The error of the reduced-precision compile against a float32 compile of the same
        module, on these arguments or the example inputs: per output, the max and mean relative
        error (max |got - fp32| / max |fp32|, mean |got - fp32| / mean |fp32|). For a module
        optimized with dtype=torch.bfloat16 or torch.float16; a float32 one compiled under
        matmul_precision or conv_precision "high" ("bf16x3") or "medium" ("bf16"), itself
        against strict fp32; otherwise its pypto.amp.autocast copy (the dtype of the
        pypto.amp.autocast this is called in, else bf16)."""
        self._ensure_compiled(args or None, kwargs or None)
        if not args and not kwargs:
            if self._example_args is None:
                raise RuntimeError("precision_report: no example inputs; pass arguments")
            args, kwargs = self._example_args
        float_model = _float_model_of(self._orig_mod)
        o = self._compiled.options
        # A float32 module under matmul_precision / conv_precision "high" or "medium" (or torch's
        # settings): the report is its own split or bf16 products against strict fp32.
        own = (float_model is None and self._dtype is None and amp_dtype() is None and
               (o.matmul_precision, o.conv_precision) != ("highest", "highest"))
        precision = ("int8" if float_model is not None else
                     ("bf16x3" if "high" in (o.matmul_precision, o.conv_precision) else "bf16")
                     if own else dtypes.name(self._dtype or amp_dtype() or torch.bfloat16))
        if self._dtype is not None or float_model is not None or own:
            reduced = self._compiled
        else:
            reduced = self._amp_variant(args, kwargs, precision)
        with self._lock:
            if self._f32_compiled is None and own:
                self._f32_compiled = self._compile_fn(args, kwargs, True, False, "highest",
                                                      "highest")[1]
            elif self._f32_compiled is None and float_model is not None:
                # A quantized model's baseline is the float model it was quantized from.
                self._f32_compiled = optimize(float_model, tuple(args), self._level,
                                              example_kwargs=dict(kwargs), dynamic=False).compiled
            elif self._f32_compiled is None:
                self._f32_compiled = (self._compiled if self._dtype is None else
                                      self._compile_fn(args, kwargs, True, False)[1])
        inputs = self._graph_inputs(args, kwargs)
        inputs = [x.float() if x.dtype in (torch.bfloat16, torch.float16) else x for x in inputs]
        got, want = reduced.run(inputs), self._f32_compiled.run(inputs)
        rows = output_errors(reduced.output_names, got, want)
        return PrecisionReport(precision, rows, _C.device_info()["precision"][precision]["how"])

    def _amp_variant(self, args, kwargs, precision: str | None = None) -> CompiledGraph:
        """The module compiled again with bf16 or f16 products (`precision`, else the active
        pypto.amp.autocast's), for calls inside pypto.amp.autocast."""
        precision = precision or dtypes.name(amp_dtype())
        with self._lock:
            if precision not in self._amp_compiled:
                self._amp_compiled[precision] = self._compile_fn(args, kwargs, True, precision)[1]
        return self._amp_compiled[precision]

    def stats(self, *args, **kwargs) -> dict:
        """Kernel count and planned memory (see CompiledGraph.stats); the memory numbers are for
        these arguments, or the example inputs, or the last call."""
        self._ensure_compiled(args or None, kwargs or None)
        if args or kwargs:
            return self._compiled.stats(self._graph_inputs(args, kwargs))
        if self._example is not None:
            return self._compiled.stats(self._example)
        return self._compiled.stats()

    def profile(self, *args, **kwargs) -> list[tuple[str, str, float]]:
        """Runs once on these arguments; returns (node name, op, seconds) per graph node."""
        self._ensure_compiled(args, kwargs)
        return self._compiled.profile(self._graph_inputs(args, kwargs))

    def _graph_inputs(self, args, kwargs) -> list:
        """The graph's inputs for a call, checked against what the module was optimized with."""
        if not kwargs and len(args) == self._flat_args:
            for x in args:
                if type(x) is not torch.Tensor:
                    break
            else:
                return list(args)
        cap = self._captured
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != cap.in_spec:
            raise TypeError(self._mismatch(args, kwargs))
        inputs = []
        for i, (x, (kind, payload)) in enumerate(zip(flat, cap.inputs)):
            if kind == "const":
                if x != payload:
                    raise ValueError(f"argument {i} was {payload!r} when the module was "
                                     f"optimized and is {x!r} now; optimize again for it")
            elif kind == "int":
                if not isinstance(x, int):
                    raise TypeError(f"argument '{payload}' must be an int, got "
                                    f"{type(x).__name__}")
                inputs.append(torch.tensor([x], dtype=torch.int64))
            else:
                if not isinstance(x, torch.Tensor):
                    raise TypeError(f"argument '{payload}' must be a torch.Tensor, got "
                                    f"{type(x).__name__}")
                inputs.append(x)
        return inputs

    def _mismatch(self, args, kwargs) -> str:
        """Why the arguments do not fit the example's structure, in the user's terms."""
        name = type(self._orig_mod).__name__
        args_spec, kwargs_spec = self._captured.in_spec.children()
        if len(args) != args_spec.num_children:
            return (f"{name}: expected {args_spec.num_children} positional argument(s) like the "
                    f"example inputs, got {len(args)}")
        params = [p for p in inspect.signature(self._orig_mod.forward).parameters]
        for i, (a, sub) in enumerate(zip(args, args_spec.children())):
            if sub.is_leaf() and not isinstance(a, (torch.Tensor, int, float, bool)):
                label = f"'{params[i]}'" if i < len(params) else str(i)
                return f"argument {label} must be a torch.Tensor, got {type(a).__name__}"
        if set(kwargs) != set(kwargs_spec.context or []):
            return (f"{name}: expected keyword arguments {sorted(kwargs_spec.context or [])}, "
                    f"got {sorted(kwargs)}")
        return (f"{name}: the arguments do not have the structure of the example inputs "
                f"(nested lists, tuples or dicts differ)")

    def extra_repr(self) -> str:
        return repr(self._compiled) if self._compiled is not None else "not compiled yet"


def _float_model_of(module: torch.nn.Module) -> torch.nn.Module | None:
    """The float model a pypto.quantization model was made from; None for a float model. Raises
    for a quantized model whose float original is gone (inplace=True, torch.ao)."""
    from .quantization import DynamicQuantizedLinear, StaticQuantizedConv2d

    original = getattr(module, "_pypto_float_model", None)
    if original is not None:
        return original
    quantized = (DynamicQuantizedLinear, StaticQuantizedConv2d)
    if any(isinstance(m, quantized) for m in module.modules()):
        raise RuntimeError("precision_report: this model is quantized and the float model it "
                           "came from is not known (inplace=True, or a torch.ao "
                           "quantized model); compare it with the float model yourself, e.g. "
                           "pypto.debug.compare_tensors")
    return None


def _torch_autocast_on() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def optimize(model: torch.nn.Module, example_inputs: Any = None, level: int | None = None, *,
             example_kwargs: dict | None = None, dynamic: bool = True, dynamic_shapes=None,
             max_batch: int | None = None, dtype: torch.dtype | None = None,
             matmul_precision: str | None = None,
             conv_precision: str | None = None) -> OptimizedModule:
    """Compiles `model` for inference on PyPTO.

    example_inputs: a tuple of arguments (or a single tensor) the model is called with. Without
        it, the module compiles on its first call, from that call's arguments.
    level: 0..3 (default: the graph_optimization_level option, 2).
    dynamic: make the batch (dim 0 of the inputs) symbolic, so one compiled module serves every
        batch size in [1, max_batch]; False compiles for the example shapes only.
    dynamic_shapes: torch.export's dynamic_shapes spec, for full control (overrides dynamic).
    dtype: torch.bfloat16 makes a bf16 model: its matrix products (Linear, matmul) round both
        operands to bf16 and accumulate in fp32 (VDPBF16PS where the CPU has AVX512_BF16),
        everything else computes in fp32; it takes fp32 or bf16 inputs and returns bf16 outputs.
        torch.float16 the same in fp16 (on x86 the fp32 kernels on operands rounded to fp16: fp16
        results at fp32 speed). See docs/precision.md. None or torch.float32: fp32 throughout
        (unless the auto_mixed_precision option is on). Other dtypes are a ValueError.
    matmul_precision: what the float32 matrix products (Linear, matmul) compute in, as
        torch.set_float32_matmul_precision: "highest" fp32; "high" three bf16 products of the
        operands' heads and tails (bf16x3: about 1e-5 relative error, where fp32's is 1e-7 and
        bf16's 1e-2; on AMX tiles, faster than fp32), fp32 on a CPU without AMX-BF16; "medium"
        bf16 products. Everything else stays fp32. None: the matmul_precision option, else
        PyTorch's CPU setting (torch.set_float32_matmul_precision, or
        torch.backends.mkldnn.matmul.fp32_precision: "ieee", "tf32", "bf16"). See
        docs/precision.md.
    conv_precision: the same for float32 convolutions (not depthwise ones): "high" bf16x3 on
        AMX, "medium" bf16. None: the conv_precision option, else
        torch.backends.mkldnn.conv.fp32_precision ("tf32" is "high", "bf16" "medium").
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"pypto.optimize expects a torch.nn.Module, got {type(model).__name__}"
                        " (use @pypto.jit for a function)")
    if example_inputs is not None and not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    if model.training:
        log.warning("pypto.optimize: %s is in training mode; PyPTO compiles for inference "
                    "(call model.eval() first)", type(model).__name__)
    from .options import compile_options
    from .quantization import from_torch_ao

    compile_options(level, matmul=matmul_precision, conv=conv_precision)  # validates early
    reduced = {torch.bfloat16: "bf16", torch.float16: "f16"}
    if dtype is not None and dtype != torch.float32 and dtype not in reduced:
        raise ValueError(f"pypto.optimize: dtype={dtype!r} is not supported; supported: None, "
                         "torch.float32, torch.bfloat16 and torch.float16 (int8: "
                         "pypto.quantization, or an ONNX model quantized by onnxruntime; see "
                         "docs/precision.md)")
    # torch.ao.quantization.quantize_dynamic's Linear modules: their int8 equivalents.
    model = from_torch_ao(model)

    def compile_fn(args, kwargs, output_names=True, mixed_precision=reduced.get(dtype),
                   matmul=matmul_precision, conv=conv_precision):
        # On a terminal: "pypto.optimize: torch.export", then the passes and kernels.
        bar = _C.ProgressBar("pypto.optimize", 0.0)
        bar.update(0, 1, f"torch.export: {type(model).__name__}")
        with torch.no_grad():
            try:
                # A bf16/fp16 model's graph casts its outputs itself (no PyTorch op per call).
                out_dtype = dtype if (mixed_precision and dtype is not None) else None
                captured = torch_capture.capture(model, args, kwargs or None, dynamic=dynamic,
                                                 dynamic_shapes=dynamic_shapes,
                                                 max_batch=max_batch, output_names=output_names,
                                                 output_dtype=out_dtype)
            except NotImplementedError as e:
                raise NotImplementedError(f"pypto.optimize: {e}") from None
            finally:
                bar.finish()
        return captured, CompiledGraph(captured.graph, level, mixed_precision=mixed_precision,
                                       matmul_precision=matmul, conv_precision=conv,
                                       _progress="pypto.optimize")

    fast = OptimizedModule(model, compile_fn)
    fast._level = level
    if dtype in reduced:
        fast._dtype = dtype
    if example_inputs is not None or example_kwargs is not None:  # keyword inputs alone too
        fast._ensure_compiled(example_inputs or (), example_kwargs or {})
    return fast
