"""FX graphs of ATen ops -> Tensor Graphs.

The torch frontends (``torch.export`` in ``optimize``, ``torch.compile``'s backend, ``@jit``) all
end here: an FX graph whose call nodes are ATen ops (after torch's own decompositions), with
FakeTensor metadata on every node. ``FxImporter`` walks it once, in order, and builds a
``_C.Graph`` through the converters in ``aten_ops`` — one small function per ATen op, registered in
a table. Nothing here computes on tensor data: it only builds nodes.

Symbolic sizes (a dynamic batch) travel as int64 tensors of shape [1] computed from the inputs
(``Shape``), so one graph serves every size; static sizes stay Python ints and become constants.
"""

from __future__ import annotations

import contextvars
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from .. import _C
from .. import dtypes

OPSET = 21  # the ONNX default-domain opset of every node the torch frontends build

INT64_MAX = 2**63 - 1


class V:
    """A tensor value of the graph under construction: its id plus torch's view of its type.

    A value may be *pending*: its node is emitted on first use of ``id``. Converters use this for
    forms a consumer can absorb: a transposed weight becomes Gemm's transB, a weight expanded to
    a batch of copies becomes MatMul's own broadcasting, and the node is never built."""

    __slots__ = ("_id", "dtype", "shape", "_emit", "transpose_of", "broadcast_of")

    def __init__(self, id, dtype: torch.dtype, shape: tuple, emit=None, transpose_of=None,
                 broadcast_of=None):
        self._id, self.dtype, self.shape = id, dtype, tuple(shape)
        self._emit, self.transpose_of, self.broadcast_of = emit, transpose_of, broadcast_of

    @property
    def pending(self) -> bool:
        return self._id is None

    @property
    def id(self) -> int:
        if self._id is None:
            self._id = self._emit()
        return self._id

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __repr__(self):
        return f"V(%{self._id}: {self.dtype} {list(self.shape)})"


class SymV:
    """A symbolic integer (a SymInt such as the batch size) held as an int64 tensor of shape [1]."""

    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = id


def is_static(x) -> bool:
    return isinstance(x, (int, float, bool)) and not isinstance(x, torch.SymInt)


Converter = Callable[..., Any]
CONVERTERS: dict[Any, Converter] = {}


def converter(*targets):
    """Registers a function as the converter of the given ATen overloads (or Python callables)."""

    def register(fn):
        for t in targets:
            assert t not in CONVERTERS, f"converter for {t} registered twice"
            CONVERTERS[t] = fn
        return fn

    return register


# Converters of other libraries' custom ops, in a module imported the first time a graph holds
# one of the namespace's ops (the library is loaded then, and PyPTO does not import it itself).
LAZY_NAMESPACES = {"torchvision": "pypto.frontend.torchvision_ops"}


def _load_lazy(target) -> None:
    if target in CONVERTERS or not isinstance(target, torch._ops.OpOverload):
        return
    module = LAZY_NAMESPACES.get(target.namespace)
    if module is not None:
        import importlib

        importlib.import_module(module)


def target_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def supported(node: torch.fx.Node) -> bool:
    """Whether a call node can be converted (the torch.compile partitioner asks)."""
    if node.op != "call_function":
        return True
    _load_lazy(node.target)
    return node.target in CONVERTERS or _is_custom(node.target)


def conversion_problem(node: torch.fx.Node) -> str | None:
    """Why this call node cannot be converted in the form it has (None when it can): the
    converter is tried on the node alone, with its inputs typed from their FakeTensors. A
    converter may accept an op yet reject a form of it (elu with a scale, avg_pool with
    divisor_override); the torch.compile partitioner then leaves the node to PyTorch. Answers
    are cached by target, argument signature (dtypes, shapes, constants) and the outputs read."""
    if node.op != "call_function":
        return f"FX op {node.op}"
    if not supported(node):
        return "no conversion"
    if "val" not in node.meta:
        return "no FakeTensor metadata"
    if any(isinstance(v, torch.Tensor) and v.is_complex() for v in _leaves(node.meta["val"])):
        # A piece's inputs and outputs are real: complex values (FFTs) stay in PyTorch here.
        return "a complex output (pieces take and return real tensors)"
    try:
        # Which outputs of a multi-output op are read matters too (a converter may reject an
        # output that only a backward reads).
        used = tuple(sorted({repr(u.args[1]) for u in node.users if u.target is operator.getitem}))
        key = (node.target, _signature(node.args), _signature(node.kwargs),
               _signature(node.meta["val"]), used)
        hash(key)
    except TypeError:  # an unhashable constant argument: try without caching
        key = None
    if key is not None and key in _PROBLEMS:
        return _PROBLEMS[key]
    problem = _try_convert(node)
    if key is not None:
        _PROBLEMS[key] = problem
    return problem


_PROBLEMS: dict[tuple, str | None] = {}


def _signature(a):
    """A hashable summary of an argument: what a converter can see of it."""
    if isinstance(a, torch.fx.Node):
        return ("node", _signature(a.meta.get("val")))
    if isinstance(a, torch.Tensor):
        return ("tensor", a.dtype, tuple(str(d) for d in a.shape))
    if isinstance(a, (list, tuple)):
        return (type(a).__name__,) + tuple(_signature(x) for x in a)
    if isinstance(a, dict):
        return ("dict",) + tuple((k, _signature(v)) for k, v in a.items())
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", type(a).__name__)
    return (type(a).__name__, repr(a))


def _try_convert(node: torch.fx.Node) -> str | None:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    imp = FxImporter("trial")
    # The partitioner runs under Dynamo's fake mode; constants must be real tensors.
    with unset_fake_temporarily():
        return _try_convert_with(imp, node)


def _try_convert_with(imp: FxImporter, node: torch.fx.Node) -> str | None:
    try:
        for i, a in enumerate(node.all_input_nodes):
            _bind_example(imp, a, f"in{i}")
        imp.convert(node)
        for v in _leaves(imp.env[node]):
            if isinstance(v, V):
                v.id  # a pending value is emitted now, as a consumer that cannot absorb it would
    except Exception as e:  # noqa: BLE001  (any failure means: leave the node to PyTorch)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return first.removeprefix(f"{imp.where()}: ")
    return None


def _bind_example(imp: FxImporter, a: torch.fx.Node, name: str):
    """Binds an input node of the node under trial to a graph input of its FakeTensor's type."""
    val = a.meta.get("val")
    if isinstance(val, (list, tuple)):  # a multi-output producer, read through getitem
        vals = []
        for k, x in enumerate(val):
            if isinstance(x, torch.Tensor):
                dt, shape = imp.input_type(x)
                vals.append(V(imp.g.add_input(f"{name}_{k}", dt, shape), x.dtype, x.shape))
            else:
                vals.append(x)
        imp.env[a] = type(val)(vals)
    elif "val" not in a.meta:
        raise NotImplementedError(f"input '{a.name}' has no FakeTensor metadata")
    else:
        imp.add_input(a, name)


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _leaves(y)
    else:
        yield x


def _is_custom(target) -> bool:
    from .. import custom_ops as custom_op

    return custom_op.lookup(target) is not None


# The dtype the float outputs of a graph being imported are cast to, in the graph itself (a model
# optimized with dtype=torch.bfloat16 returns bf16 without a PyTorch op after each call); None:
# as computed. Set by torch_capture.capture(output_dtype=...).
OUTPUT_DTYPE: contextvars.ContextVar = contextvars.ContextVar("pypto_output_dtype", default=None)


def node_prefix(node: torch.fx.Node) -> str:
    """What the names of the graph nodes made from `node` start with: the path of the innermost
    module whose call made it ("layer1.0.conv1", "encoder.layer.3.attention.self"; "@<i>" added
    for a module's i-th call after the first), so profiles and comparisons name the module a
    kernel came from; the FX node's name for an op the model's own forward calls."""
    stack = node.meta.get("nn_module_stack")
    if stack:
        key, (path, _) = list(stack.items())[-1]
        if path:
            call = key.rsplit("@", 1)[1] if "@" in key else ""
            return f"{path}@{call}" if call else str(path)
    return node.name


@dataclass
class ImportedGraph:
    graph: _C.Graph
    input_names: list[str]
    symbol_ranges: dict[str, tuple[int, int]]


class FxImporter:
    """Builds one ``_C.Graph`` from one FX graph."""

    def __init__(self, name: str = "main"):
        self.g = _C.Graph()
        self.g.name = name
        self.env: dict[torch.fx.Node, Any] = {}
        self.symbol_names: dict[Any, str] = {}  # sympy symbol -> symbol name in the graph
        self._consts: dict[tuple, int] = {}
        self._count = 0
        self.node: torch.fx.Node | None = None  # the node being converted (for errors)
        self._size_inputs: dict[torch.fx.Node, Any] = {}  # SymInt placeholders -> their symbol

    # ---- building blocks used by the converters ----

    def where(self) -> str:
        n = self.node
        return f"[{target_name(n.target)}] node '{n.name}'" if n is not None else "[import]"

    def unsupported(self, what: str):
        raise NotImplementedError(f"{self.where()}: {what}")

    def op(self, op: str, inputs: list, attrs: dict | None = None, num_outputs: int = 1):
        ids = [-1 if x is None else (x if isinstance(x, int) else x.id) for x in inputs]
        self._count += 1
        base = node_prefix(self.node) if self.node is not None else "n"
        outs = self.g.add_node(op, ids, num_outputs, attrs or {}, f"{base}/{op}_{self._count}",
                               OPSET)
        return outs[0] if num_outputs == 1 else outs

    def value(self, id: int, like: torch.fx.Node | None = None, dtype=None, shape=None) -> V:
        """Wraps an id as a V, typed from a node's FakeTensor unless dtype/shape are given."""
        if like is not None:
            val = like.meta["val"]
            dtype = dtype or val.dtype
            shape = val.shape if shape is None else shape
        return V(id, dtype, tuple(shape))

    def constant(self, data, dtype: torch.dtype, shape: tuple | None = None) -> int:
        """An initializer holding `data` (a scalar or a list), deduplicated."""
        t = torch.tensor(data, dtype=dtype)
        if shape is not None:
            t = t.reshape(shape)
        key = (dtype, tuple(t.shape), tuple(t.flatten().tolist()))
        if key not in self._consts:
            self._count += 1
            self._consts[key] = self.g.add_initializer(f"const_{self._count}", t)
        return self._consts[key]

    def tensor_constant(self, name: str, t: torch.Tensor) -> int:
        """An initializer sharing memory with a torch tensor (parameters, buffers)."""
        return self.g.add_initializer(name, t.detach())

    def ints(self, values) -> int:
        return self.constant([int(v) for v in values], torch.int64)

    def as_tensor(self, x, dtype: torch.dtype) -> int:
        """A tensor id for an operand: a V (cast to `dtype` if needed) or a Python scalar."""
        if isinstance(x, V):
            return self.cast(x, dtype).id
        if isinstance(x, SymV):
            t = self.op("Squeeze", [x.id, self.ints([0])])
            return t if dtype == torch.int64 else self.op("Cast", [t], {"to": dtypes.onnx_code(dtype)})
        if isinstance(x, torch.SymInt):  # a SymInt the importer has not materialized
            self.unsupported("a symbolic size was used in an unsupported position")
        return self.constant(x, dtype)

    def cast(self, x: V, dtype: torch.dtype) -> V:
        if x.dtype == dtype:
            return x
        return V(self.op("Cast", [x], {"to": dtypes.onnx_code(dtype)}), dtype, x.shape)

    def sym(self, x) -> int:
        """An int64 [1] tensor for a size: a Python int or a SymV."""
        if isinstance(x, SymV):
            return x.id
        return self.ints([x])

    def shape_tensor(self, sizes) -> int:
        """A 1-D int64 tensor of sizes that may mix Python ints and SymVs."""
        if all(is_static(s) for s in sizes):
            return self.ints(sizes)
        return self.op("Concat", [self.sym(s) for s in sizes], {"axis": 0})

    # ---- the walk ----

    def resolve(self, a):
        if isinstance(a, torch.fx.Node):
            if a not in self.env:
                raise RuntimeError(f"[import] node '{a.name}' is used before it is defined")
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.resolve(x) for x in a)
        if isinstance(a, dict):
            return {k: self.resolve(x) for k, x in a.items()}
        return a

    def input_type(self, val) -> tuple[str, list]:
        shape = []
        for d in val.shape:
            shape.append(self.dim_name(d.node.expr) if isinstance(d, torch.SymInt) else int(d))
        return dtypes.name(val.dtype), shape

    def dim_name(self, expr) -> str | None:
        """The graph's name for a size expression: a symbol's name, or a product of symbols with
        a positive integer factor in include/pto/shape.h's canonical form ("32*h", "batch*seq",
        a derived Dim such as 32 * Dim("h")); None (an unknown dim) for anything else."""
        if expr.is_Symbol:
            return self.symbol_names.get(expr, str(expr))
        coeff, rest = expr.as_coeff_Mul()
        factors = rest.as_ordered_factors() if rest.is_Mul else [rest]
        if not (coeff.is_Integer and coeff > 0 and all(f.is_Symbol for f in factors)):
            return None
        names = sorted(self.symbol_names.get(f, str(f)) for f in factors)
        return "*".join(([str(int(coeff))] if coeff != 1 else []) + names)

    def add_input(self, node: torch.fx.Node, name: str | None = None):
        val = node.meta.get("val")
        name = name or node.name
        if isinstance(val, torch.Tensor):
            dt, shape = self.input_type(val)
            self.env[node] = V(self.g.add_input(name, dt, shape), val.dtype, val.shape)
        elif isinstance(val, torch.SymInt):
            self.env[node] = SymV(self.g.add_input(name, "i64", [1]))
            if val.node.expr.is_Symbol:
                self._size_inputs[node] = val.node.expr
        elif isinstance(val, (int, float, bool)) or val is None:
            self.env[node] = val
        else:
            raise NotImplementedError(
                f"[import] input '{name}' has type {type(val).__name__}; only tensors, "
                "ints and floats can be graph inputs")

    def add_constant_input(self, node: torch.fx.Node, name: str, t: torch.Tensor):
        if not isinstance(t, torch.Tensor):
            self.env[node] = t
            return
        if t.is_complex():  # held as ONNX holds complex values: a trailing [re, im] axis
            self.env[node] = V(self.tensor_constant(name, torch.view_as_real(t)), t.dtype,
                               t.shape)
            return
        self.env[node] = V(self.tensor_constant(name, t), t.dtype, t.shape)

    def convert(self, node: torch.fx.Node):
        self.node = node
        if node.op == "get_attr":
            t = getattr(node.graph.owning_module, node.target)
            self.add_constant_input(node, node.target, t)
            return
        if node.op != "call_function":
            raise NotImplementedError(f"[import] node '{node.name}': unsupported FX op {node.op}")
        _load_lazy(node.target)
        fn = CONVERTERS.get(node.target)
        args, kwargs = self.resolve(node.args), self.resolve(node.kwargs)
        leaves = list(_leaves((args, tuple(kwargs.values()))))
        if any(isinstance(a, V) and a.dtype.is_complex for a in leaves):
            from .aten_fft import complex_converter_for

            fn = complex_converter_for(self, node, args, kwargs)
        elif any(isinstance(a, complex) for a in leaves):  # 1j * x: real in, complex out
            from .aten_fft import COMPLEX_CONVERTERS

            fn = COMPLEX_CONVERTERS.get(node.target, fn)
        if fn is None:
            from .. import custom_ops as custom_op

            body = custom_op.lookup(node.target)
            if body is None:
                raise NotImplementedError(
                    f"{self.where()}: PyPTO has no conversion for the op "
                    f"{target_name(node.target)}")
            self.env[node] = custom_op.inline(self, node, body, args, kwargs)
            return
        out = fn(self, node, *args, **kwargs)
        self.env[node] = out

    def convert_body(self, graph: torch.fx.Graph) -> torch.fx.Node:
        """Converts every call node of `graph` (placeholders must be bound already); returns its
        output node."""
        self._sizes_from_shapes()
        for n in graph.nodes:
            if n.op == "output":
                return n
            if n.op != "placeholder":
                self.convert(n)
        raise ValueError("[import] the FX graph has no output node")

    def _sizes_from_shapes(self):
        """A size Dynamo passes as an input of its own (s0, the batch of a symbolic graph) is
        read off a tensor input that has it as a dim, Shape(x)[j:j+1], instead: the graph's shape
        arithmetic then knows it is that symbol (the size input's value is opaque), so the head
        splits' Reshapes keep [s0, heads, s1, d] and attention is recognised over them. Dynamo's
        guards make the two equal; the size input stays, unread."""
        for node, expr in list(self._size_inputs.items()):
            for x, v in self.env.items():
                val = x.meta.get("val") if x.op == "placeholder" else None
                if not isinstance(v, V) or not isinstance(val, torch.Tensor):
                    continue
                dims = [d.node.expr if isinstance(d, torch.SymInt) else None for d in val.shape]
                if expr in dims:
                    j = dims.index(expr)
                    self.env[node] = SymV(self.op("Shape", [v], {"start": j, "end": j + 1}))
                    break
        self._size_inputs.clear()

    def set_outputs(self, values, names: list[str] | bool = False):
        """Declares the graph outputs. names=True names them "output" (one) or "output_<i>",
        a list names them so; False keeps the names of the nodes that make them. A named output
        is an Identity of the value (a value's name is fixed when it is made)."""
        self.node = None
        if names is True:
            names = ["output"] if len(values) == 1 else [f"output_{i}" for i in range(len(values))]
            generated = True
        else:
            generated = False
        if names is not False and len(names) != len(values):
            raise ValueError(f"[import] {len(names)} output name(s) given for {len(values)} "
                             "output(s)")
        cast_to = OUTPUT_DTYPE.get()
        for i, v in enumerate(values):
            if not isinstance(v, (V, SymV)):
                raise NotImplementedError(
                    f"[import] output {i} is a {type(v).__name__}, not a tensor; PyPTO graphs "
                    "return tensors only")
            if isinstance(v, V) and v.dtype.is_complex:
                raise NotImplementedError(
                    f"[import] output {i} is a complex tensor; PyPTO graphs return real ones: "
                    "return torch.view_as_real(...) of it (its last dim: real, imaginary)")
            id = v.id
            if cast_to is not None and isinstance(v, V) and v.dtype.is_floating_point and \
                    v.dtype != cast_to:
                id = self.op("Cast", [v], {"to": dtypes.onnx_code(cast_to)})
            if names is not False:
                id = self._named_copy(id, str(names[i]), generated)
            self.g.add_output(id)

    def _named_copy(self, id: int, name: str, generated: bool) -> int:
        """An Identity of `id` whose output is called `name` (a generated name that an input or
        weight holds already gets "_" appended until it is free)."""
        while True:
            try:
                return self.g.add_node("Identity", [id], 1, {}, name, OPSET)[0]
            except ValueError as e:
                if "defined twice" not in str(e):
                    raise
                if not generated:
                    raise ValueError(f"[import] output name '{name}' is already the name of an "
                                     "input, a weight or another output") from None
                name += "_"


# ---- Python-level operators on sizes (SymInt arithmetic in exported graphs) ----


def _sym_binary(onnx_op: str, py: Callable):
    def convert(ctx: FxImporter, node, a, b):
        if is_static(a) and is_static(b):
            return py(a, b)
        return SymV(ctx.op(onnx_op, [ctx.sym(a), ctx.sym(b)]))

    return convert


converter(operator.add)(_sym_binary("Add", operator.add))
converter(operator.sub)(_sym_binary("Sub", operator.sub))
converter(operator.mul)(_sym_binary("Mul", operator.mul))
# Sizes are non-negative, so ONNX's truncating integer Div is Python's floor division here.
converter(operator.floordiv)(_sym_binary("Div", operator.floordiv))


converter(torch.sym_max)(_sym_binary("Max", max))  # Gemma-2/3's sliding-window cache lengths
converter(torch.sym_min)(_sym_binary("Min", min))


@converter(torch.sym_sum)
def _sym_sum(ctx, node, terms):
    """torch.sym_sum (Dynamo writes it for a sum of several sizes: transformers' cache lengths):
    the known terms folded, the others added in turn."""
    known = sum(t for t in terms if is_static(t))
    unknown = [t for t in terms if not is_static(t)]
    if not unknown:
        return known
    total = ctx.sym(unknown[0])
    for t in unknown[1:] + ([known] if known else []):
        total = ctx.op("Add", [total, ctx.sym(t)])
    return SymV(total)


@converter(operator.getitem)
def _getitem(ctx, node, seq, i):
    return seq[i]
