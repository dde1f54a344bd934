"""Capturing a torch.nn.Module as an ATen graph with torch.export, and importing it.

``capture`` runs ``torch.export.export`` (non-strict) with the batch dimension declared dynamic,
applies torch's core-ATen decompositions, and hands the graph to ``FxImporter``. Parameters and
buffers become initializers that share memory with the module's own tensors.

Why a batch of 2 when the example has 1: torch.export specializes sizes 0 and 1 (a size-1 dim
broadcasts, so torch cannot keep it symbolic). Capturing with the example repeated to batch 2
gives the general graph; batch 1 then runs through the same graph.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from .. import _C
from . import aten_ops  # noqa: F401  (registers the converters)
from .aten_rnn import RNN_OPS, rnn_decomposed
from .fx_importer import OUTPUT_DTYPE, FxImporter, SymV, V, node_prefix, supported, target_name

log = logging.getLogger("pypto")

BATCH = "batch"
INT64_MAX = 2**63 - 1


@dataclass
class Captured:
    graph: _C.Graph
    in_spec: pytree.TreeSpec  # of (args, kwargs)
    out_spec: pytree.TreeSpec
    # One entry per flat user input (the leaves of (args, kwargs)): ("tensor", name) for a graph
    # input, ("int", name) for a symbolic int input, ("const", value) for a Python value
    # torch.export specialized on (a call with another value is an error, not a wrong result).
    inputs: list[tuple[str, Any]]
    dynamic: dict[str, tuple[int, int]]  # symbol -> declared range
    # For pypto.debug.compare_layers: graph value name -> the module calls it is the output of,
    # innermost first, as (module path, call index); and the prefix of graph node names -> the
    # innermost module path (a graph node is named "<module path>[@call]/<op>_<n>", or
    # "<FX node>/<op>_<n>" outside any submodule: see fx_importer.node_prefix). Empty when the
    # capture saw no modules.
    module_outputs: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    node_modules: dict[str, str] = field(default_factory=dict)


def _batch_spec(module, flat: list, args, kwargs, max_batch: int | None):
    """dynamic_shapes marking dim 0 of every tensor input that shares the first one's batch,
    keyed by the names of forward's parameters (the form torch.export accepts with kwargs)."""
    tensors = [x for x in flat if isinstance(x, torch.Tensor) and x.dim() > 0]
    if not tensors:
        return None, None
    b0 = tensors[0].shape[0]
    dim = Dim(BATCH, min=1, max=max_batch) if max_batch else Dim(BATCH, min=1)

    def spec(x):
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == b0:
            return {0: dim}
        return None

    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"[capture] the example inputs do not match "
                        f"{type(module).__name__}.forward: {e}") from None
    params = inspect.signature(module.forward).parameters
    out = {}
    for name, value in bound.arguments.items():
        if params[name].kind == inspect.Parameter.VAR_POSITIONAL:
            out[name] = tuple(pytree.tree_map(spec, v, is_leaf=lambda x: x is None)
                              for v in value)
        elif params[name].kind == inspect.Parameter.VAR_KEYWORD:
            out[name] = {k: pytree.tree_map(spec, v, is_leaf=lambda x: x is None)
                         for k, v in value.items()}
        else:
            out[name] = pytree.tree_map(spec, value, is_leaf=lambda x: x is None)
    return b0, out


def _repeat_batch(x, b0):
    if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == b0 == 1:
        return x.expand(2, *x.shape[1:]).clone()
    return x


def dim_names(module, args: tuple, kwargs: dict, dynamic_shapes) -> list[dict[int, str]]:
    """The name of each declared dynamic dim, per flat tensor input ((args, kwargs) leaves):
    the names of the torch.export Dims in a dynamic_shapes spec (tuple or dict form)."""
    names: list[dict[int, str]] = []

    def per_tensor(spec) -> dict[int, str]:
        items = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        return {int(d): _root_name(dim) for d, dim in items
                if dim is not None and not isinstance(dim, int)}

    def walk(value, spec):
        if isinstance(value, torch.Tensor):
            names.append(per_tensor(spec))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, spec[i] if isinstance(spec, (list, tuple)) and i < len(spec) else None)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, spec.get(k) if isinstance(spec, dict) else None)
        else:
            names.append({})

    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        params = []
    for i, a in enumerate(args):
        if isinstance(dynamic_shapes, dict):
            spec = dynamic_shapes.get(params[i]) if i < len(params) else None
        else:
            spec = dynamic_shapes[i] if dynamic_shapes and i < len(dynamic_shapes) else None
        walk(a, spec)
    for k, v in kwargs.items():
        walk(v, dynamic_shapes.get(k) if isinstance(dynamic_shapes, dict) else None)
    return names


def _root_name(dim) -> str:
    """A declared Dim's name; for a derived one (32 * Dim("h")), its root's ("h")."""
    root = getattr(dim, "root", None)
    return getattr(root, "__name__", None) or getattr(dim, "__name__", None) or str(dim)


def export(module: torch.nn.Module, args: tuple, kwargs: dict | None = None, *,
           dynamic: bool = True, dynamic_shapes=None, max_batch: int | None = None,
           what: str | None = None) -> ExportedProgram:
    """torch.export with the batch dimension dynamic (see the module docstring)."""
    kwargs = kwargs or {}
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(args, tuple):
        args = (args,)
    flat, _ = pytree.tree_flatten((args, kwargs))
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            raise ValueError(f"example input {i} is on {x.device}; PyPTO runs on the CPU")
    if dynamic_shapes is None and dynamic:
        b0, spec = _batch_spec(module, flat, args, kwargs, max_batch)
        if spec is not None:
            eargs, ekwargs = pytree.tree_map(lambda x: _repeat_batch(x, b0), (args, kwargs))
            try:
                return _export(module, eargs, ekwargs, spec, what)
            except Exception as e:  # maybe the model ties the batch to a constant: try static
                ep = _export(module, args, kwargs, None, what)
                log.warning("pypto: the batch dimension cannot be dynamic for this model (%s); "
                            "compiling for batch %d only", str(e).splitlines()[0][:200], b0)
                return ep
    return _export(module, args, kwargs, dynamic_shapes, what)


class ExportError(ValueError):
    """torch.export could not capture the model."""


def _export(module, args, kwargs, dynamic_shapes, what=None) -> ExportedProgram:
    try:
        ep = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    except torch._dynamo.exc.UserError as e:
        if e.error_type != torch._dynamo.exc.UserErrorType.CONSTRAINT_VIOLATION:
            raise
        raise ValueError(f"[capture] torch.export cannot use the dynamic dims you declared for "
                         f"{what or type(module).__name__}: {e}\n{_derived_dim_hint(str(e))}") \
            from e
    except Exception as e:
        raise ExportError(f"[capture] torch.export could not capture "
                          f"{what or type(module).__name__}: {type(e).__name__}: {e}") from e
    return ep.run_decompositions(_decompositions(ep))


def _derived_dim_hint(message: str) -> str:
    """PyPTO's reading of torch's "Suggested fixes": a size a network needs to be a multiple of k
    (a stride-32 CNN's height) is declared as k times a Dim, which PyPTO keeps as the symbolic
    size "k*h"."""
    roots = dict(re.findall(r"^\s*(\w+) = (Dim\(.*\))\s*$", message, re.M))
    fixes = []
    for name, k, root in re.findall(r"^\s*(\w+) = (\d+)\*(\w+)\s*$", message, re.M):
        dim = roots.get(root, f"Dim('{root}')").replace(f"'{root}'", f"'{root.strip('_').lower()}'")
        fixes.append(f"{name} = {k} * {dim}")
    example = "; ".join(fixes) if fixes else "H = 32 * Dim('h', min=1, max=16)"
    return ("[capture] hint: declare a size the model needs to be a multiple of k (a stride-32 "
            f"network's height and width) as k times a Dim, e.g. {example}; PyPTO keeps such a "
            "derived dim symbolic as the size 'k*h'")


def capture(module: torch.nn.Module, args: tuple, kwargs: dict | None = None, *,
            dynamic: bool = True, dynamic_shapes=None, max_batch: int | None = None,
            what: str | None = None, output_names: list[str] | bool = False,
            output_dtype: torch.dtype | None = None) -> Captured:
    """torch.export, or FX tracing at the example's shapes where export cannot; then import.
    output_names: see FxImporter.set_outputs (True: "output" / "output_<i>"). output_dtype: the
    graph casts its float outputs to it (fx_importer.OUTPUT_DTYPE)."""
    token = OUTPUT_DTYPE.set(output_dtype)
    try:
        return _capture(module, args, kwargs, dynamic=dynamic, dynamic_shapes=dynamic_shapes,
                        max_batch=max_batch, what=what, output_names=output_names)
    finally:
        OUTPUT_DTYPE.reset(token)


@contextlib.contextmanager
def _capturable_experts(module: torch.nn.Module):
    """transformers' mixture-of-experts layers (Mixtral, Qwen-MoE, ...) run their experts by the
    implementation their config names. The default, "grouped_mm", sorts the tokens by expert and
    multiplies data-dependent row ranges (an opaque custom op, offsets from histc), and "eager"
    loops over torch.nonzero: neither has shapes torch.export can capture. "batched_mm" computes
    the same sums with static shapes (the weights of each token's chosen experts gathered, then
    one batched product), so the capture runs the layers with it and restores the config."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except Exception:  # no transformers, or one without selectable experts
        yield
        return
    if "batched_mm" not in ALL_EXPERTS_FUNCTIONS:
        yield
        return
    saved = {}
    for m in module.modules():
        cfg = getattr(m, "config", None)
        if (hasattr(m, "_is_expert_parallel") and id(cfg) not in saved
                and hasattr(cfg, "_experts_implementation_internal")
                and cfg._experts_implementation_internal != "batched_mm"):
            saved[id(cfg)] = (cfg, cfg._experts_implementation_internal)
            cfg._experts_implementation_internal = "batched_mm"
    if saved:
        log.info("pypto: capturing %d mixture-of-experts config(s) with experts_implementation="
                 "'batched_mm' (static shapes)", len(saved))
    try:
        yield
    finally:
        for cfg, impl in saved.values():
            cfg._experts_implementation_internal = impl


@contextlib.contextmanager
def _without_kv_cache(module: torch.nn.Module, kwargs: dict | None):
    """A transformers model whose config has use_cache on (decoders and encoder-decoders load
    that way) returns its KV cache, a Cache object torch.export cannot return, so the capture
    failed on it. A graph compiled for one call has no use for the cache: the capture runs with
    config.use_cache off (restored after), unless the example passes use_cache itself. The
    outputs then have no past_key_values; generate(), which needs them, is torch.compile's
    (docs/python.md)."""
    cfg = getattr(module, "config", None)
    if (getattr(cfg, "use_cache", False) is not True or "use_cache" in (kwargs or {})
            or "use_cache" not in inspect.signature(module.forward).parameters):
        yield
        return
    log.warning("pypto: compiling %s with use_cache=False (its KV cache, a transformers Cache "
                "object, cannot be a compiled graph's output): the outputs have no "
                "past_key_values. For generate(), compile the model's forward instead: "
                "model.forward = torch.compile(model.forward, backend=\"pypto\")",
                type(module).__name__)
    cfg.use_cache = False
    try:
        yield
    finally:
        cfg.use_cache = True


def _capture(module: torch.nn.Module, args: tuple, kwargs: dict | None, *, dynamic: bool,
             dynamic_shapes, max_batch: int | None, what: str | None,
             output_names: list[str] | bool) -> Captured:
    with _capturable_experts(module), _without_kv_cache(module, kwargs):
        return _capture_as_is(module, args, kwargs, dynamic=dynamic,
                              dynamic_shapes=dynamic_shapes, max_batch=max_batch, what=what,
                              output_names=output_names)


_DATA_DEPENDENT_HINT = (
    "run it with torch.compile(model, backend=\"pypto\") (the data-dependent parts stay in "
    "PyTorch), or export it with torch.onnx.export(model, args, path, dynamo=False) and run the "
    "file with pypto.onnx.load (NonMaxSuppression, TopK and the exporter's If and Loop run "
    "there; the exporter traces a Python `if` on data as the branch the example took)")


def _data_dependent(e: BaseException) -> bool:
    """Whether torch.export failed on a guard or an output size that depends on tensor values."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, \
        DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    kinds = (GuardOnDataDependentSymNode, DataDependentOutputException,
             DynamicOutputShapeException)
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, kinds):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _capture_as_is(module: torch.nn.Module, args: tuple, kwargs: dict | None, *, dynamic: bool,
                   dynamic_shapes, max_batch: int | None, what: str | None,
                   output_names: list[str] | bool) -> Captured:
    """capture() without the output cast.

    The fallback traces with fake tensors, so control flow on data still fails (no branch is
    silently baked in), and compiles for the example shapes only (the input checks enforce
    them): a shape-dependent branch cannot be taken wrongly for another size."""
    what = what or type(module).__name__
    try:
        ep = export(module, args, kwargs, dynamic=dynamic, dynamic_shapes=dynamic_shapes,
                    max_batch=max_batch, what=what)
    except ExportError as e:
        log.warning("pypto: %s; tracing %s with FX at the example's shapes instead",
                    str(e).splitlines()[0][:300], what)
        try:
            return trace_fx(module, args, kwargs or {}, what, output_names)
        except NotImplementedError:
            raise
        except Exception as e2:
            details = (f"{e}\n[capture] FX tracing failed too: {type(e2).__name__}: "
                       f"{str(e2).splitlines()[0] if str(e2) else ''}")
            if _data_dependent(e):
                raise ValueError(f"[capture] {what} has shapes or control flow that depend on "
                                 f"tensor values (a branch on data, nonzero, NMS), which one "
                                 f"captured graph cannot hold: {_DATA_DEPENDENT_HINT}\n"
                                 f"{details}") from e2
            raise ValueError(details) from e2
    missing = unsupported_ops(ep)
    if missing:
        raise NotImplementedError(f"{what} uses op(s) PyPTO cannot run yet: "
                                  f"{', '.join(missing)}")
    if dynamic_shapes is None and dynamic:
        flat = pytree.tree_flatten((args, kwargs or {}))[0]
        tensors = [x for x in flat if isinstance(x, torch.Tensor) and x.dim() > 0]
        b0 = tensors[0].shape[0] if tensors else None
        names = [{0: BATCH} if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == b0
                 else {} for x in flat]
    else:
        names = dim_names(module, args, kwargs or {}, dynamic_shapes)
    return import_program(ep, name=what, names=names, output_names=output_names)


def trace_fx(module, args: tuple, kwargs: dict, what: str,
             output_names: list[str] | bool = False) -> Captured:
    """Captures with make_fx (fake tensors, core-ATen decompositions) at the example's shapes."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    flat, in_spec = pytree.tree_flatten((args, kwargs))
    where = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]

    def run(*tensors):
        leaves = list(flat)
        for i, t in zip(where, tensors):
            leaves[i] = t
        a, k = pytree.tree_unflatten(leaves, in_spec)
        return module(*a, **k)

    table = {op: fn for op, fn in core_aten_decompositions().items() if op not in KEEP_WHOLE}
    gm = make_fx(run, decomposition_table=table, tracing_mode="fake")(*[flat[i] for i in where])
    unsupported = sorted({target_name(n.target) for n in gm.graph.nodes
                          if n.op == "call_function" and not supported(n)})
    if unsupported:
        raise NotImplementedError(f"{what} uses op(s) PyPTO cannot run yet: "
                                  f"{', '.join(unsupported)}")
    imp = FxImporter(what)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = {i: f"input_{k}" for k, i in enumerate(where)}
    for n, i in zip(placeholders, where):
        imp.add_input(n, names[i])
    out_node = imp.convert_body(gm.graph)
    outs, out_spec = pytree.tree_flatten(out_node.args[0])
    imp.set_outputs([imp.resolve(o) for o in outs], output_names)
    inputs = [("tensor", names[i]) if i in names else ("const", x) for i, x in enumerate(flat)]
    return Captured(imp.g, in_spec, out_spec, inputs, {})


def _decompositions(ep: ExportedProgram | None = None):
    """torch's core-ATen decompositions, minus the ops PyPTO converts whole: attention stays one
    node (its decomposition also trips a torch bug with a symbolic batch, in GPT-2), and the
    recurrent layers one ONNX LSTM/GRU/RNN per layer, unless `ep` has one of a form the
    converters do not take (aten_rnn.rnn_decomposed), which torch then unrolls."""
    table = torch.export.default_decompositions()
    unrolled = set()
    if ep is not None:
        unrolled = {n.target for n in ep.graph.nodes
                    if n.op == "call_function" and n.target in RNN_OPS and rnn_decomposed(n)}
    for op in KEEP_WHOLE:
        if op not in unrolled:
            table.pop(op, None)
    return table


KEEP_WHOLE = [torch.ops.aten.scaled_dot_product_attention.default, *RNN_OPS]


def import_program(ep: ExportedProgram, name: str = "main",
                   names: list[dict[int, str]] | None = None,
                   output_names: list[str] | bool = False) -> Captured:
    """Converts an ExportedProgram (core ATen) into a Tensor Graph. `names` gives the declared
    names of dynamic dims per user input (see dim_names); other symbols keep torch's names."""
    imp = FxImporter(name)
    sig = ep.graph_signature
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    user_inputs = []
    users = [node for spec, node in zip(sig.input_specs, placeholders)
             if spec.kind == InputKind.USER_INPUT]
    for node, declared in zip(users, names or []):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for d, n in declared.items():
            size = val.shape[d] if d < val.dim() else None
            # A declared Dim, or one derived from it (32*s0): its one symbol takes the name.
            syms = size.node.expr.free_symbols if isinstance(size, torch.SymInt) else ()
            if len(syms) == 1:
                imp.symbol_names.setdefault(next(iter(syms)), n)
    for spec, node in zip(sig.input_specs, placeholders):
        imp.node = None
        if spec.kind == InputKind.USER_INPUT:
            imp.add_input(node, spec.arg.name)
            v = imp.env[node]
            kind = "tensor" if isinstance(v, V) else "int" if isinstance(v, SymV) else "const"
            user_inputs.append((kind, v if kind == "const" else spec.arg.name))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            t = ep.state_dict[spec.target] if spec.target in ep.state_dict else \
                ep.constants[spec.target]
            imp.add_constant_input(node, spec.target, t)
        elif spec.kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            imp.add_constant_input(node, spec.target, ep.constants[spec.target])
        else:
            raise NotImplementedError(f"[capture] input '{node.name}' of kind {spec.kind.name}")
    output_node = imp.convert_body(ep.graph)
    # Only the user's outputs: buffer updates (a train-mode BatchNorm's running stats) are
    # dropped, as compiling for inference means.
    outs = [imp.resolve(a) for a, spec in zip(output_node.args[0], sig.output_specs)
            if spec.kind == OutputKind.USER_OUTPUT]
    imp.set_outputs(outs, output_names)

    # A size of an input is at least 1, as the default batch is: torch.export's Dim has min=0
    # unless told otherwise (and cannot say whether it was told), and a dimension that may be 0
    # is rarely what a model means.
    input_sizes = {d.node.expr for node in users for d in _tensor_shape(node)
                   if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol}
    ranges = {}
    for sym, vr in ep.range_constraints.items():
        n = imp.dim_name(sym) or str(sym)
        lo, hi = _bound(vr.lower, 0), _bound(vr.upper, INT64_MAX)
        ranges[n] = (max(lo, 1 if sym in input_sizes else 0), hi)
    for n, (lo, hi) in ranges.items():
        imp.g.set_symbol_range(n, lo, hi)
    return Captured(imp.g, ep.call_spec.in_spec, ep.call_spec.out_spec, user_inputs, ranges,
                    *_module_outputs(ep, imp, outs))


def _module_outputs(ep: ExportedProgram, imp: FxImporter, outs: list):
    """Which graph value each module call returned: the value of the last FX node inside the
    call (torch.export's nn_module_stack names a module's second call "path@1"), and each FX
    node's innermost module. See Captured.module_outputs. A value that is a graph output is also
    listed under the output's name, which it takes once the passes drop the naming Identity."""
    last: dict[str, tuple[str, int, str]] = {}  # call key -> (path, call index, value name)
    node_modules = {}
    for n in ep.graph.nodes:
        stack = n.meta.get("nn_module_stack") if n.op == "call_function" else None
        if not stack:
            continue
        path = list(stack.values())[-1][0]
        if path:
            node_modules[node_prefix(n)] = path
        v = imp.env.get(n)
        if not isinstance(v, V):
            continue
        name = imp.g.value_name(v.id)
        for key, (path, _) in stack.items():
            call = key.rsplit("@", 1)[1] if "@" in key else "0"
            last[key] = (path, int(call) if call.isdigit() else 0, name)
    outputs: dict[str, list[tuple[str, int]]] = {}
    for path, call, name in reversed(list(last.values())):  # innermost first
        outputs.setdefault(name, []).append((path, call))
    for v, out in zip(outs, imp.g.outputs):
        if isinstance(v, V) and imp.g.value_name(v.id) in outputs:
            outputs.setdefault(imp.g.value_name(out), outputs[imp.g.value_name(v.id)])
    return outputs, node_modules


def _tensor_shape(node: torch.fx.Node) -> tuple:
    val = node.meta.get("val")
    return tuple(val.shape) if isinstance(val, torch.Tensor) else ()


def _bound(x, infinite: int) -> int:
    """A range bound as an int; torch's int_oo and sympy's oo are `infinite`."""
    try:
        v = int(x)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return infinite
    return v if abs(v) < INT64_MAX else infinite


def unsupported_ops(ep: ExportedProgram) -> list[str]:
    return sorted({target_name(n.target) for n in ep.graph.nodes
                   if n.op == "call_function" and not supported(n)})
