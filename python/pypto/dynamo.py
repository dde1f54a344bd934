"""torch.compile(model, backend="pypto").

Dynamo hands the backend an FX graph of torch-level ops; AOT autograd turns it into core ATen
ops (torch's decompositions) with parameters as inputs. The graph is then split: maximal pieces
whose ops PyPTO converts are compiled and run by PyPTO, anything else stays with PyTorch. Each
op left to PyTorch is logged once. Results are never silently different: a piece either runs
whole on PyPTO or is not taken from PyTorch at all.

A node is PyPTO's when its op has a converter and the converter accepts the node's form (tried
on the node alone, see ``conversion_problem``): an op PyPTO runs in most forms but not in this
one (elu with a scale, say) stays with PyTorch like an unknown op. Each piece is compiled once,
on its first call; where Dynamo's graph has symbolic sizes the compiled graph has them too, so a
new batch size reuses it.

    torch.compile(model, backend="pypto", options={"level": 1})
"""

from __future__ import annotations

import copy
import logging
import threading
import weakref

import numpy as np
import torch
import torch.fx

from . import runtime as _runtime
from .frontend import aten_ops  # noqa: F401  (registers the converters)
from .frontend.fx_importer import FxImporter, SymV, V, conversion_problem, target_name
from .options import compile_options
from .runtime import CompiledGraph

log = logging.getLogger("pypto")
_stats = {"graphs": 0, "pypto_pieces": 0, "pypto_runs": 0, "fallback_ops": set(),
          "fallback_nodes": 0, "frozen_weights": 0, "weight_inputs": 0, "direct_graphs": 0,
          "levels": set()}
_logged: set[tuple[str, str]] = set()
_logged_messages: set[str] = set()
_pieces: weakref.WeakSet = weakref.WeakSet()  # the PyptoPieces alive, for pieces()

OPTIONS = ("level",)  # the keys torch.compile(..., options=...) may hold


def stats() -> dict:
    """What the backend did so far: graphs received, pieces compiled by PyPTO, runs of those
    pieces, the ops left to PyTorch (fallback_ops: their names; fallback_nodes: how many nodes
    of the graphs received), weights frozen into the pieces as initializers (frozen_weights)
    and weights passed per call instead (weight_inputs: under autograd, or when freezing was not
    possible), the graphs Dynamo calls without AOT autograd's runtime wrapper (direct_graphs:
    inference graphs that mutate no input and return no alias), and the levels pieces were
    compiled at."""
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in _stats.items()}


def pieces() -> list[CompiledGraph]:
    """The compiled graphs of the pieces alive (those run at least once), in no set order:
    ``print(g.graph)``, ``g.input_names`` (the arguments it takes per call; frozen weights are
    initializers, ``g.graph.initializer_names``), ``g.stats()``."""
    return [p._compiled[0] for p in list(_pieces) if p._compiled is not None]


def _log_fallback(op: str, problem: str):
    _stats["fallback_ops"].add(op)
    if (op, problem) in _logged:
        return
    _logged.add((op, problem))
    if problem == "no conversion":
        log.warning("pypto: %s is not supported yet; that part of the graph runs in PyTorch", op)
    else:
        log.warning("pypto: %s is not supported in this form (%s); that node runs in PyTorch",
                    op, problem)


# The Python type a graph's scalar output (a size, or a constant number) is returned as.
_SCALAR_TYPES = {torch.SymInt: int, int: int, torch.SymFloat: float, float: float,
                 torch.SymBool: bool, bool: bool}


class PyptoPiece(torch.nn.Module):
    """One partition of the graph, compiled on its first call. The graph's input types come from
    Dynamo's FakeTensors: symbolic sizes stay symbolic, so one compilation serves every size
    Dynamo's guards send here. Frozen weights are get_attr nodes of `gm` (see _freeze): they
    become initializers sharing the tensors' memory, and are not arguments."""

    def __init__(self, gm: torch.fx.GraphModule, level: int | None):
        super().__init__()
        self.gm, self.level = gm, level
        self._compiled: tuple[CompiledGraph, bool] | None = None
        self._run = None  # the per-call function (_runner), made with the compiled graph
        self._lock = threading.Lock()
        placeholders = gm.graph.find_nodes(op="placeholder")
        # The positions of the SymInt arguments (sizes), passed as int64 [1] arrays made once
        # per value; every other argument is a tensor, passed as it is.
        self._sym = [i for i, n in enumerate(placeholders)
                     if isinstance(n.meta.get("val"), torch.SymInt)]
        self._sizes: dict[int, np.ndarray] = {}
        # Whether every tensor argument is known, from the graph's metadata, to be what
        # CompiledGraph.run checks for on every call (a strided CPU tensor that needs no grad,
        # without a conjugate or negative bit): Dynamo's guards hold the graph's inputs to that
        # metadata, and the PyTorch ops between pieces produce what their FakeTensors say.
        self._trusted = all(_trusted_value(n.meta.get("val")) for n in placeholders)
        self._scalar_outs: list[tuple[int, type]] = []  # (output, int/float/bool), by _compile
        _pieces.add(self)

    def forward(self, *args):
        return self.run(args)

    def run(self, args):
        """The call itself (forward without nn.Module's hooks): `args` in placeholder order."""
        run = self._run
        if run is None:
            with self._lock:
                if self._run is None:
                    self._compiled = self._compile()
                    self._run = self._runner(*self._compiled)
            run = self._run
        _stats["pypto_runs"] += 1
        return run(args)

    def _runner(self, compiled: CompiledGraph, single: bool):
        """The function a call runs. Where the arguments are trusted (see __init__) it calls the
        Executable directly: each tensor goes over as a DLPack capsule and each output comes back
        as a tensor sharing its memory, as in CompiledGraph.run, without run()'s per-call
        checks of types, devices, grad and conjugate bits. Otherwise it is run() itself."""
        sym, size, scalars = self._sym, self._size, self._scalar_outs

        def as_scalars(outs):
            outs = list(outs)
            for i, kind in scalars:
                outs[i] = kind(outs[i].item())
            return outs

        if not self._trusted:
            def checked(args):
                if sym:
                    args = list(args)
                    for i in sym:
                        args[i] = size(args[i])
                outs = compiled.run(args)
                if scalars:
                    outs = as_scalars(outs)
                return outs[0] if single else tuple(outs)
            return checked

        exe_run = compiled._exe.run
        to_dlpack, from_numpy, from_dlpack = (torch.utils.dlpack.to_dlpack, torch.from_numpy,
                                              torch.from_dlpack)
        ndarray = np.ndarray

        def trusted(args):
            if _runtime._call_hook is not None:  # pypto.profiler.profile(with_stack=True)
                _runtime._call_hook()
            if sym:
                args = list(args)
                for i in sym:
                    args[i] = size(args[i])
            outs = exe_run([x if type(x) is ndarray else to_dlpack(x) for x in args])
            outs = [from_numpy(o) if type(o) is ndarray else from_dlpack(o) for o in outs]
            if scalars:
                outs = as_scalars(outs)
            return outs[0] if single else tuple(outs)
        return trusted

    def _size(self, value: int) -> np.ndarray:
        a = self._sizes.get(value)
        if a is None:
            if len(self._sizes) >= 256:  # sizes seen in a long run with many shapes: start over
                self._sizes.clear()
            a = self._sizes[value] = np.array([int(value)], dtype=np.int64)
        return a

    def _compile(self):
        imp = FxImporter("torch_compile")
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                imp.add_input(n)
                if not isinstance(imp.env[n], (V, SymV)):
                    raise NotImplementedError(f"[torch.compile] input '{n.name}' is not a tensor")
        result = imp.convert_body(self.gm.graph).args[0]
        single = not isinstance(result, (tuple, list))
        results = [result] if single else list(result)
        # Sizes the graph returns (a SymInt output: a length the code after a graph break
        # computes with, as transformers' mask functions do) come back as one-element tensors;
        # the caller expects Python numbers.
        self._scalar_outs = [(i, _SCALAR_TYPES[type(v)]) for i, r in enumerate(results)
                             if isinstance(r, torch.fx.Node)
                             and type(v := r.meta.get("val")) in _SCALAR_TYPES]
        outs = [imp.resolve(r) for r in results]
        imp.set_outputs(outs)
        compiled = CompiledGraph(imp.g, self.level)
        _stats["pypto_pieces"] += 1
        _stats["levels"].add(compiled.level)
        _stats["frozen_weights"] += len(self.gm.graph.find_nodes(op="get_attr"))
        return compiled, single


def _trusted_value(val) -> bool:
    """Whether a placeholder's FakeTensor (or SymInt) describes an argument CompiledGraph.run
    would pass unchanged: a size, or a strided CPU tensor that needs no grad, without conjugate
    or negative bit."""
    if isinstance(val, torch.SymInt):
        return True
    return (isinstance(val, torch.Tensor) and val.device.type == "cpu"
            and val.layout == torch.strided and not val.requires_grad and not val.is_conj()
            and not val.is_neg())


def _copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `gm`'s graph and modules that shares their tensors (constants the graph reads,
    such as a rotary embedding's inv_freq). Copying those would clone their storage, which under
    AOT autograd's fake tensor mode fails for a real tensor ("Attempted to set the storage of a
    tensor on device meta ..."), and they are not changed by freezing anyway."""
    memo = {}
    for mod in gm.modules():
        for t in (*mod._parameters.values(), *mod._buffers.values(), *vars(mod).values()):
            if isinstance(t, torch.Tensor):
                memo[id(t)] = t
    return copy.deepcopy(gm, memo)


def _to_constants(gm: torch.fx.GraphModule, consts: dict[torch.fx.Node, tuple[str, torch.Tensor]]):
    """Turns placeholders of `gm` into get_attr nodes of these (name, tensor) attributes (the
    tensors detached: they share memory with the originals); the FakeTensor metadata stays."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if not consts:
        return
    first_op = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for node, (name, t) in consts.items():
        with unset_fake_temporarily():  # the backend runs under Dynamo's fake mode
            t = t.detach()
        gm.register_buffer(name, t, persistent=False)
        with gm.graph.inserting_before(first_op):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        gm.graph.erase_node(node)
    gm.recompile()


def _inline_piece_constants(fused: torch.fx.GraphModule):
    """After partitioning, a frozen weight a piece uses is an argument of its call: moves it into
    the piece as a get_attr of its own, so it is an initializer there too."""
    for call in fused.graph.find_nodes(op="call_module"):
        if not call.target.startswith("pypto_piece_"):
            continue
        sub = getattr(fused, call.target)
        placeholders = sub.graph.find_nodes(op="placeholder")
        consts = {p: (a.target, getattr(fused, a.target)) for p, a in zip(placeholders, call.args)
                  if isinstance(a, torch.fx.Node) and a.op == "get_attr"}
        if consts:
            _to_constants(sub, consts)
            call.args = tuple(a for a in call.args
                              if not (isinstance(a, torch.fx.Node) and a.op == "get_attr"))
    fused.graph.eliminate_dead_code()
    fused.recompile()


def _node_supported(node: torch.fx.Node) -> bool:
    problem = conversion_problem(node)
    if problem is not None and node.op == "call_function":
        _log_fallback(target_name(node.target), problem)
    return problem is None


class _Support(torch.fx.passes.operator_support.OperatorSupportBase):
    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return _node_supported(node)


def _compile_graph(gm: torch.fx.GraphModule, level=None):
    """The callable that runs `gm` on a list of its placeholders' arguments: one PyptoPiece when
    PyPTO converts every op, else `gm` partitioned into PyPTO pieces and PyTorch ops."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    _stats["graphs"] += 1
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    supported = [_node_supported(n) for n in calls]  # a list: log every fallback
    _stats["fallback_nodes"] += supported.count(False)
    if calls and all(supported):
        return PyptoPiece(gm, level).run
    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    fused = partitioner.partition_and_fuse("pypto_piece_")
    _inline_piece_constants(fused)
    for name, sub in list(fused.named_children()):
        if name.startswith("pypto_piece_"):
            setattr(fused, name, PyptoPiece(sub, level))
    return lambda args: fused(*args)


def _freeze(gm: torch.fx.GraphModule, real_inputs: list, names: list[str]) -> list[int] | None:
    """Makes the parameters and buffers among `gm`'s inputs initializers, as Inductor's freezing
    does: AOT autograd's TracingContext tells which of its inputs are static (the module's
    parameters and buffers Dynamo lifted to inputs, after the ones AOT lifted itself,
    params_flat), and which of those the graph mutates or returns a view of (they stay
    inputs). Their placeholders become get_attr nodes of the real tensors (`real_inputs`:
    Dynamo's inputs, named `names`). Returns the indices of the inputs that remain, or None (with
    one warning) when there is no context to tell the weights by."""
    from torch._functorch._aot_autograd.input_output_analysis import INPUT_ALIAS_TYPES
    from torch._functorch._aot_autograd.schemas import MutationType
    from torch._subclasses.fake_tensor import FakeTensor

    placeholders = gm.graph.find_nodes(op="placeholder")
    tc = _tracing_context()
    meta = tc.fw_metadata if tc is not None else None
    lifted = list(tc.params_flat or []) if tc is not None else []
    real = lifted + list(real_inputs)
    if meta is None or len(real) != len(placeholders):
        why = ("no TracingContext" if meta is None else
               f"{len(placeholders)} graph inputs for {len(real)} arguments")
        _warn_once(f"pypto: torch.compile could not tell the weights among the graph's inputs "
                   f"({why}); they are passed on every call, not packed at compile time "
                   f"(slower; pypto.optimize(model) packs them)")
        return None
    names = [f"param_{i}" for i in range(len(lifted))] + list(names)
    keep_as_input = {i for i, m in enumerate(meta.input_info)
                     if m.mutation_type in (MutationType.MUTATED_IN_GRAPH,
                                            MutationType.MUTATED_OUT_GRAPH)}
    keep_as_input |= {o.base_idx for o in meta.output_info
                      if o.base_idx is not None and o.output_type in INPUT_ALIAS_TYPES}
    static = set(range(len(lifted))) | set(meta.static_input_indices or ())
    consts, keep = {}, []
    for i, (node, t) in enumerate(zip(placeholders, real)):
        val = node.meta.get("val")
        if (i in static and i not in keep_as_input and type(t) in (torch.Tensor, torch.nn.Parameter)
                and not isinstance(t, FakeTensor) and isinstance(val, torch.Tensor)
                and tuple(val.shape) == tuple(t.shape) and val.dtype == t.dtype):
            consts[node] = (f"_frozen_{names[i]}", t)
        else:
            keep.append(i)
    _to_constants(gm, consts)
    return keep


def _tracing_context():
    """AOT autograd's TracingContext of the compilation under way (None outside one)."""
    return torch._guards.TracingContext.try_get()


def _warn_once(message: str):
    if message not in _logged_messages:
        _logged_messages.add(message)
        log.warning("%s", message)


def _boxed(fn, keep: list[int] | None = None, weights: _FrozenWeights | None = None):
    """AOT autograd's calling convention: one list of arguments (cleared, so the inputs can be
    freed early); `keep` selects those the compiled graph still takes; `weights` picks the
    compiled graph frozen to the weights in the others."""
    if keep is None:
        def call(args):
            a = list(args)
            args.clear()
            return fn(a)
    else:
        def call(args):
            f = weights.pick(args.__getitem__) if weights is not None else fn
            a = [args[i] for i in keep]
            args.clear()
            return f(a)
    call._boxed_call = True
    return call


class _FrozenWeights:
    """A compiled graph's weights as frozen, and the graphs compiled for other weights passed in
    their places. Dynamo compiles a frame once for every module that runs its code and passes
    each module's parameters as inputs: the layers of a model whose layer has a graph break (BART
    in fp16 branches on isfinite inside each layer) all call the graph compiled for the first
    layer, whose weights _freeze made constants, so the others ran with the first's weights. A
    call whose weight arguments are not the tensors frozen compiles (once) the graph again with
    those frozen, from the graph as it was before freezing."""

    def __init__(self, pristine: torch.fx.GraphModule, frozen: list[int], names: list[str],
                 tensors: list, fn, level):
        self.pristine, self.frozen, self.names, self.level = pristine, frozen, names, level
        self.first = (tensors, fn)
        self.others: dict[tuple, tuple] = {}  # ids of the weights -> (compiled, the weights)

    def pick(self, arg):
        """The compiled graph for the weights at the frozen positions of AOT's arguments, `arg(i)`
        being argument i. The first and the last frozen weight tell modules apart (another
        module sharing the code passes other tensors in every position): two identity checks a
        call, where checking all of MobileNetV3-small's 211 took 11 us."""
        tensors, fn = self.first
        if not tensors or (arg(self.frozen[0]) is tensors[0] and
                           arg(self.frozen[-1]) is tensors[-1]):
            return fn
        current = [arg(i) for i in self.frozen]
        key = tuple(map(id, current))
        hit = self.others.get(key)
        if hit is None:
            log.info("pypto: a compiled graph called with other weights (a module sharing its "
                     "code); compiling it for those")
            gm = _copy_graph(self.pristine)
            placeholders = gm.graph.find_nodes(op="placeholder")
            _to_constants(gm, {placeholders[i]: (f"_frozen_{self.names[i]}", t)
                               for i, t in zip(self.frozen, current)})
            hit = self.others[key] = (_compile_graph(gm, self.level), current)
        return hit[0]


def _level(options) -> int | None:
    """The level from torch.compile's options; unknown keys and bad levels are errors."""
    if options is None:
        return None
    if not isinstance(options, dict):
        raise TypeError(f"torch.compile(backend='pypto'): options must be a dict, got "
                        f"{type(options).__name__}")
    unknown = sorted(str(k) for k in options if k not in OPTIONS)
    if unknown:
        raise ValueError(f"torch.compile(backend='pypto'): unknown option(s) "
                         f"{', '.join(repr(k) for k in unknown)} (known: {', '.join(OPTIONS)})")
    level = options.get("level")
    try:
        compile_options(level)
    except (TypeError, ValueError) as e:
        raise type(e)(f"torch.compile(backend='pypto'): options['level']: {e}") from None
    return level


def backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None):
    """The torch.compile backend (registered as "pypto"). `options` is torch.compile's
    options dict; its one key is "level" (0..3, default: the graph_optimization_level option).

    For inference (no input requires grad, or grad mode off: AOT autograd's inference graph) the
    weights are frozen: the parameters and buffers become initializers sharing their memory, so
    GEMM and Conv weights are packed and BatchNorms and constants folded at compile time, as in
    pypto.optimize. Like there, later changes to the weights are not seen: an in-place update
    reaches the ops that read the weight's memory but not the packed copies, and a replaced
    parameter (model.fc.weight = ...) is not seen at all; compile again (torch._dynamo.reset())
    after changing weights. Under autograd (grad mode on and parameters that require grad) the
    forward runs on PyPTO with the weights passed per call and the backward in PyTorch."""
    from torch._dynamo.backends.common import aot_autograd

    level = _level(options)
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]

    direct = []  # the call without AOT autograd's runtime wrapper, where it has nothing to do

    def inference_compiler(fx_gm, inputs):
        arity = len(fx_gm.graph.find_nodes(op="placeholder"))
        pristine = _copy_graph(fx_gm)
        keep = _freeze(fx_gm, example_inputs, names)
        fn = _compile_graph(fx_gm, level)
        if keep is None:
            _stats["weight_inputs"] += _weight_count(example_inputs)
            return _boxed(fn, keep)
        tc = _tracing_context()
        real = list(tc.params_flat or []) + list(example_inputs)
        lifted = len(real) - len(example_inputs)
        kept = set(keep)
        frozen = [i for i in range(arity) if i not in kept]
        weights = _FrozenWeights(pristine, frozen,
                                 [f"param_{i}" for i in range(lifted)] + list(names),
                                 [real[i] for i in frozen], fn, level)
        direct.append(_direct_call(fn, keep, arity, example_inputs, weights))
        return _boxed(fn, keep, weights)

    def fw_compiler(fx_gm, inputs):  # autograd: the forward of the training graph
        _warn_once("pypto: torch.compile runs under autograd here (grad mode on and parameters "
                   "that require grad): the forward runs on PyPTO with the weights passed on "
                   "every call, the backward in PyTorch. For inference, call the model under "
                   "torch.no_grad() or torch.inference_mode(): the weights are then packed at "
                   "compile time")
        _stats["weight_inputs"] += _weight_count(example_inputs)
        return _boxed(_compile_graph(fx_gm, level))

    def bw_compiler(fx_gm, inputs):  # training runs its backward in PyTorch for now
        return _boxed(lambda args: fx_gm(*args))

    compiled = aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                            inference_compiler=inference_compiler,
                            decompositions=_decompositions())(gm, example_inputs)
    if len(direct) == 1 and direct[0] is not None:
        _stats["direct_graphs"] += 1
        return direct[0]
    return compiled


def _direct_call(fn, keep: list[int], arity: int, example_inputs,
                 weights: _FrozenWeights | None = None):
    """The function Dynamo can call instead of AOT autograd's (its `forward` and runtime
    wrapper, which build lists of every argument, weights included: 13-40 µs a call on
    MobileNetV3-small's 211), or None where that wrapper has work to do. For an inference graph
    that mutates no input, returns no alias, and whose arguments AOT neither deduplicated nor
    regrouped, the wrapper only turns grad mode off around the call, which changes nothing
    here: no argument requires grad (Dynamo guards that), PyPTO records no autograd graph, and
    the ops left to PyTorch then record none either. The call takes Dynamo's arguments as they
    come and passes on those the compiled graph still takes (`keep`, less the weights AOT
    lifted itself, all frozen)."""
    from torch._functorch._aot_autograd.schemas import OutputType, PlainTensorMeta

    tc = _tracing_context()
    meta = tc.fw_metadata if tc is not None else None
    lifted = len(tc.params_flat or []) if tc is not None else 0
    if (meta is None or arity != lifted + len(example_inputs) or min(keep, default=lifted) < lifted
            or any(isinstance(x, (list, tuple, dict)) for x in example_inputs)
            or torch._C._is_any_autocast_enabled()  # the wrapper would turn autocast off
            or any(m.mutates_data or m.mutates_metadata for m in meta.input_info)
            or any(o.output_type != OutputType.non_alias for o in meta.output_info)
            or meta.num_intermediate_bases or meta.tokens or meta.is_rng_op_functionalized
            or not all(isinstance(m, (int, PlainTensorMeta)) for m in meta.subclass_inp_meta)):
        return None
    picks = [i - lifted for i in keep]
    first = weights.first[0] if weights is not None else []
    position = {i: k for k, i in enumerate(weights.frozen)} if weights is not None else {}

    def arg(args, i):  # AOT's argument i: AOT's own lifted weights are not Dynamo's arguments
        return args[i - lifted] if i >= lifted else first[position[i]]

    def call(*args):
        f = weights.pick(lambda i: arg(args, i)) if weights is not None else fn
        return f([args[i] for i in picks])
    # Dynamo must not trace into it (it wraps what a backend returns the same way, once: no cost)
    return torch._dynamo.disable(call, reason="PyPTO's compiled graph")


def _decompositions() -> dict:
    """torch's core-ATen decompositions, minus attention's: scaled_dot_product_attention then
    reaches the graph as what it dispatches to on the CPU (_scaled_dot_product_flash_attention_
    for_cpu), which PyPTO converts whole, as pypto.optimize does sdpa (one Attention kernel)."""
    from torch._decomp import core_aten_decompositions

    keep = {torch.ops.aten.scaled_dot_product_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    return {op: fn for op, fn in core_aten_decompositions().items() if op not in keep}


def _weight_count(inputs) -> int:
    return sum(1 for x in inputs if isinstance(x, torch.nn.Parameter) or
               getattr(x, "_dynamo_static_input_type", None) is not None)


def register():
    from torch._dynamo import list_backends, register_backend

    if "pypto" not in list_backends(exclude_tags=()):
        register_backend(name="pypto")(backend)


register()  # importing this module (pypto does when torch is loaded) makes the backend known

__all__ = ["backend", "pieces", "register", "stats"]
