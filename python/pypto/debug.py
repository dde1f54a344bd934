"""pypto.debug: finding where a compiled model's numbers differ from PyTorch's.

    r = pypto.debug.compare_tensors(actual, expected, rtol=1e-3, atol=1e-5)   # prints r
    report = pypto.debug.compare_layers(model, fast, (x,))
    report.first_mismatch      # the first layer, in execution order, beyond tolerance (or None)

The tolerance rule is torch.allclose's: an element is within tolerance when
|actual - expected| <= atol + rtol * |expected|; NaN matches only NaN and an infinity only the same
infinity. See docs/debugging.md.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["TensorComparison", "LayerComparison", "LayerReport", "compare_tensors",
           "compare_layers"]


@dataclass
class TensorComparison:
    """What compare_tensors found. ``ok`` is True when no element is beyond tolerance."""
    shape: tuple
    dtype: str
    rtol: float
    atol: float
    max_abs_error: float      # over elements finite on both sides
    max_rel_error: float      # |a - b| / |b| over elements finite on both sides with b != 0
    mismatches: int           # elements beyond tolerance, NaN/Inf disagreements included
    numel: int
    nan_mismatches: int       # NaN on one side only
    inf_mismatches: int       # an infinity on one side and something else on the other
    worst_index: tuple | None  # the worst element (a disagreement first), None if identical
    worst_actual: float | None = None
    worst_expected: float | None = None

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def __str__(self) -> str:
        head = (f"{'OK' if self.ok else 'MISMATCH'}: {self.dtype}{list(self.shape)}, "
                f"{self.mismatches} of {self.numel} elements beyond tolerance "
                f"(rtol {self.rtol:g}, atol {self.atol:g})")
        lines = [head, f"  max abs error {self.max_abs_error:.4g}, "
                       f"max rel error {self.max_rel_error:.4g}"]
        if self.nan_mismatches or self.inf_mismatches:
            lines.append(f"  NaN disagreements {self.nan_mismatches}, "
                         f"Inf disagreements {self.inf_mismatches}")
        if self.worst_index is not None:
            lines.append(f"  worst at {self.worst_index}: actual {self.worst_actual!r}, "
                         f"expected {self.worst_expected!r}")
        return "\n".join(lines)


def _as_numpy(x: Any, what: str) -> tuple[np.ndarray, str]:
    """(array, dtype name) of a torch tensor or numpy array; bf16/f16 widen to float32."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        name = str(x.dtype).replace("torch.", "")
        t = x.detach().cpu()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        return t.resolve_conj().resolve_neg().numpy(), name
    if isinstance(x, (np.ndarray, np.generic)):
        a = np.asarray(x)
        return a, str(a.dtype)
    raise TypeError(f"compare_tensors: {what} must be a torch.Tensor or numpy.ndarray, "
                    f"got {type(x).__name__}")


def compare_tensors(actual: Any, expected: Any, rtol: float = 1e-3, atol: float = 1e-5,
                    verbose: bool = True) -> TensorComparison:
    """Compares `actual` with `expected` (torch tensors or numpy arrays of the same shape and
    dtype) element by element; prints the result when `verbose`. Raises TypeError for other
    objects or different dtypes, ValueError for different shapes or negative tolerances."""
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"compare_tensors: rtol and atol must be >= 0, got {rtol}, {atol}")
    a, adt = _as_numpy(actual, "actual")
    b, bdt = _as_numpy(expected, "expected")
    if adt != bdt:
        raise TypeError(f"compare_tensors: dtypes differ: actual is {adt}, expected is {bdt}")
    if a.shape != b.shape:
        raise ValueError(f"compare_tensors: shapes differ: actual is {list(a.shape)}, "
                         f"expected is {list(b.shape)}")
    if a.dtype.kind == "c":
        raise TypeError("compare_tensors: complex tensors are not supported")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    finite = np.isfinite(a64) & np.isfinite(b64)
    nan_mis = nan_a != nan_b
    inf_mis = ~finite & ~nan_a & ~nan_b & (a64 != b64)
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.where(finite, np.abs(a64 - b64), 0.0)
        rel = np.where(finite & (b64 != 0), diff / np.abs(b64), 0.0)
        beyond = finite & (diff > atol + rtol * np.abs(b64))
    disagree = nan_mis | inf_mis
    worst = None
    if disagree.any():
        worst = np.unravel_index(int(np.argmax(disagree)), a.shape)
    elif diff.size and diff.max() > 0:
        worst = np.unravel_index(int(np.argmax(diff)), a.shape)
    result = TensorComparison(
        shape=tuple(a.shape), dtype=adt, rtol=rtol, atol=atol,
        max_abs_error=float(diff.max()) if diff.size else 0.0,
        max_rel_error=float(rel.max()) if rel.size else 0.0,
        mismatches=int(beyond.sum() + disagree.sum()), numel=int(a.size),
        nan_mismatches=int(nan_mis.sum()), inf_mismatches=int(inf_mis.sum()),
        worst_index=tuple(int(i) for i in worst) if worst is not None else None,
        worst_actual=a64[worst].item() if worst is not None else None,
        worst_expected=b64[worst].item() if worst is not None else None)
    if verbose:
        print(result)
    return result


@dataclass
class LayerComparison:
    """One module call whose output both runs have."""
    name: str                  # the module path ("layer2.0.conv2"; "" is the model itself)
    call: int                  # which call of the module (a module used twice has calls 0, 1)
    module_type: str
    value: str                 # the compiled graph's value compared
    kernel: str                # the kernel that wrote it: its fusion rule or op
    covers: list[str]          # the modules whose nodes that kernel runs, in order
    comparison: TensorComparison

    @property
    def label(self) -> str:
        name = self.name or "(model)"
        return name if self.call == 0 else f"{name}@{self.call}"


@dataclass
class LayerReport:
    """compare_layers' result: every matched layer in execution order, the first beyond
    tolerance, and the layers whose output the compiled model never materialized."""
    layers: list[LayerComparison]
    first_mismatch: LayerComparison | None
    unmatched: list[str] = field(default_factory=list)
    rtol: float = 0.0
    atol: float = 0.0

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None

    def __str__(self) -> str:
        w = max([len(x.label) for x in self.layers] + [5])
        k = max([len(x.kernel) for x in self.layers] + [6])
        lines = [f"{'layer':<{w}}  {'kernel':<{k}}  {'max abs':>9}  {'max rel':>9}  mismatches"]
        for x in self.layers:
            c = x.comparison
            mark = "" if c.ok else "  <- beyond tolerance"
            lines.append(f"{x.label:<{w}}  {x.kernel:<{k}}  {c.max_abs_error:9.2e}  "
                         f"{c.max_rel_error:9.2e}  {c.mismatches}{mark}")
        lines.append(f"{len(self.layers)} layer outputs compared (rtol {self.rtol:g}, atol "
                     f"{self.atol:g}); {len(self.unmatched)} inside fused kernels or not "
                     f"tensors, not compared")
        f = self.first_mismatch
        if f is None:
            lines.append("every compared layer is within tolerance")
        else:
            fused = [m for m in f.covers if m != f.name]
            lines.append(f"first layer beyond tolerance: {f.label} ({f.module_type}), value "
                         f"'{f.value}', kernel {f.kernel}"
                         + (f" covering {', '.join(fused)}" if fused else ""))
            lines.append("  " + str(f.comparison).replace("\n", "\n  "))
        return "\n".join(lines)


def _unblocked(t, like):
    """A level 3 value in the channel-blocked layout [N, C/c, H, W, c] as the NCHW tensor `like`
    has, or None when `t` is not that."""
    if t.dim() != 5 or like.dim() != 4:
        return None
    n, cb, h, w, c = t.shape
    if (n, h, w) != (like.shape[0], like.shape[2], like.shape[3]) or cb != -(-like.shape[1] // c):
        return None
    return t.permute(0, 1, 4, 2, 3).reshape(n, cb * c, h, w)[:, :like.shape[1]]


def compare_layers(model, compiled, inputs, rtol: float = 1e-3, atol: float = 1e-4,
                   verbose: bool = False, kwargs: dict | None = None) -> LayerReport:
    """Runs `model` eagerly with forward hooks on every module and `compiled` (what
    pypto.optimize returned for it; None compiles it here at the default level) with every
    kernel's output kept, matches module calls by their torch module path, and returns a
    LayerReport naming the first layer, in execution order, whose output differs beyond
    tolerance. `inputs`: a tensor or a tuple of positional arguments; `kwargs`: keyword
    arguments (input_ids=..., attention_mask=...). A fused kernel (Conv+BN+ReLU) has one output:
    it is compared as the output of the last module it covers, and the report lists the modules
    the kernel covers. Level 3's blocked values are compared in the model's NCHW layout.
    `verbose` prints the report."""
    import torch

    from ._optimize import OptimizedModule, optimize

    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"compare_layers: rtol and atol must be >= 0, got {rtol}, {atol}")
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    kwargs = dict(kwargs or {})
    if compiled is None:
        compiled = optimize(model, example_inputs=args, example_kwargs=kwargs)
    if not isinstance(compiled, OptimizedModule):
        raise TypeError("compare_layers: `compiled` must be what pypto.optimize returned (or "
                        f"None), got {type(compiled).__name__}")

    # Eager: each module call's output, in the order calls finish.
    eager: dict[str, list[tuple[int, Any]]] = {}
    types = {}
    order = [0]
    handles = []
    for path, mod in model.named_modules():
        types[path] = type(mod).__name__

        def hook(mod, inp, out, path=path):
            eager.setdefault(path, []).append(
                (order[0], out.detach().clone() if isinstance(out, torch.Tensor) else None))
            order[0] += 1

        handles.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()

    compiled._ensure_compiled(args, kwargs)
    cap, cg = compiled._captured, compiled.compiled
    if not cap.module_outputs:
        raise ValueError("compare_layers: the compiled model carries no module paths (it was "
                         "not captured from a torch.nn.Module by pypto.optimize)")
    steps = cg.steps

    def modules_of(step: int) -> list[str]:
        out = []
        for node in steps[step]["nodes"]:
            m = cap.node_modules.get(node.split("/", 1)[0])
            if m is not None and m not in out:
                out.append(m)
        return out

    layers = []
    seen = set()
    for step, name, value in cg.run_values(compiled._graph_inputs(args, kwargs)):
        # Level 3 renames a value it keeps in the blocked layout "<value>_blocked".
        base = name[:-len("_blocked")] if name.endswith("_blocked") else name
        for path, call in cap.module_outputs.get(name, cap.module_outputs.get(base, [])):
            calls = eager.get(path, [])
            if call >= len(calls) or calls[call][1] is None:
                continue
            when, want = calls[call]
            got = value
            if got.shape != want.shape:
                got = _unblocked(got, want)
                if got is None:
                    continue
            c = compare_tensors(got.to(want.dtype), want, rtol, atol, verbose=False)
            s = steps[step]
            layers.append((when, LayerComparison(path, call, types.get(path, "?"), name,
                                                 s["rule"] or s["op"], modules_of(step), c)))
            seen.add((path, call))
    layers.sort(key=lambda x: x[0])
    matched = [x for _, x in layers]
    unmatched = sorted(f"{p}@{i}" if i else p for p, calls in eager.items()
                       for i in range(len(calls)) if (p, i) not in seen)
    first = next((x for x in matched if not x.comparison.ok), None)
    report = LayerReport(matched, first, unmatched, rtol, atol)
    if verbose:
        print(report)
    return report
