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

import logging
import threading

import torch
import torch.fx

from .frontend import aten_ops  # noqa: F401  (registers the converters)
from .frontend.fx_importer import FxImporter, SymV, V, conversion_problem, target_name
from .options import compile_options
from .runtime import CompiledGraph

log = logging.getLogger("pypto")
_stats = {"graphs": 0, "pypto_pieces": 0, "pypto_runs": 0, "fallback_ops": set(),
          "levels": set()}
_logged: set[tuple[str, str]] = set()

OPTIONS = ("level",)  # the keys torch.compile(..., options=...) may hold


def stats() -> dict:
    """What the backend did so far: graphs received, pieces compiled by PyPTO, runs of those
    pieces, the ops left to PyTorch, and the levels pieces were compiled at."""
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in _stats.items()}


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


class PyptoPiece(torch.nn.Module):
    """One partition of the graph, compiled on its first call. The graph's input types come from
    Dynamo's FakeTensors: symbolic sizes stay symbolic, so one compilation serves every size
    Dynamo's guards send here."""

    def __init__(self, gm: torch.fx.GraphModule, level: int | None):
        super().__init__()
        self.gm, self.level = gm, level
        self._compiled: tuple[CompiledGraph, bool] | None = None
        self._lock = threading.Lock()

    def forward(self, *args):
        if self._compiled is None:
            with self._lock:
                if self._compiled is None:
                    self._compiled = self._compile()
        compiled, single = self._compiled
        _stats["pypto_runs"] += 1
        inputs = [a if isinstance(a, torch.Tensor) else torch.tensor([a], dtype=torch.int64)
                  for a in args]
        outs = compiled.run(inputs)
        return outs[0] if single else tuple(outs)

    def _compile(self):
        imp = FxImporter("torch_compile")
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                imp.add_input(n)
                if not isinstance(imp.env[n], (V, SymV)):
                    raise NotImplementedError(f"[torch.compile] input '{n.name}' is not a tensor")
        result = imp.convert_body(self.gm.graph).args[0]
        single = not isinstance(result, (tuple, list))
        outs = [imp.resolve(r) for r in ([result] if single else result)]
        imp.set_outputs(outs)
        compiled = CompiledGraph(imp.g, self.level)
        _stats["pypto_pieces"] += 1
        _stats["levels"].add(compiled.level)
        return compiled, single


def _node_supported(node: torch.fx.Node) -> bool:
    problem = conversion_problem(node)
    if problem is not None and node.op == "call_function":
        _log_fallback(target_name(node.target), problem)
    return problem is None


class _Support(torch.fx.passes.operator_support.OperatorSupportBase):
    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return _node_supported(node)


def _compile_graph(gm: torch.fx.GraphModule, example_inputs, level=None):
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    _stats["graphs"] += 1
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    if calls and all([_node_supported(n) for n in calls]):  # a list: log every fallback
        return PyptoPiece(gm, level)
    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    fused = partitioner.partition_and_fuse("pypto_piece_")
    for name, sub in list(fused.named_children()):
        if name.startswith("pypto_piece_"):
            setattr(fused, name, PyptoPiece(sub, level))
    return fused


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
    options dict; its one key is "level" (0..3, default: the graph_optimization_level option)."""
    from functorch.compile import make_boxed_func
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    level = _level(options)

    def fw_compiler(fx_gm, inputs):
        return make_boxed_func(_compile_graph(fx_gm, inputs, level))

    def bw_compiler(fx_gm, inputs):  # training runs its backward in PyTorch for now
        return make_boxed_func(fx_gm)

    return aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                        decompositions=core_aten_decompositions())(gm, example_inputs)


def register():
    from torch._dynamo import list_backends, register_backend

    if "pypto" not in list_backends(exclude_tags=()):
        register_backend(name="pypto")(backend)


register()  # importing this module (pypto does when torch is loaded) makes the backend known

__all__ = ["backend", "register", "stats"]
