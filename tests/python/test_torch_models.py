"""The zoo: whole PyTorch models through pypto.optimize, compared with PyTorch eager (fp32).

Each model (tests/python/torch_models.py: torchvision, timm and transformers architectures with
random weights, redrawn by randomize_ so no head is zero and no output a bias) is optimized once
with a batch-1 example and then run at batch 1 and batch 2 through the same compiled module (the
batch is symbolic: no recompilation). Eager's output must be worth comparing (check_nontrivial),
and every output tensor must match it to max|got - want| / max|want| <= 1e-4. Every node must run
on a CPU backend kernel, not the reference interpreter's.

PTO_ZOO selects the models: unset, torch_models.ALWAYS_ON (about two minutes on two cores);
"full", every model of the zoo; or a comma-separated list of names.
"""

import os

import pytest
import torch

import pypto
import torch_models as tm

TOLERANCE = 1e-4

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a model that wanted a download fails loudly


def selected() -> list[str]:
    choice = os.environ.get("PTO_ZOO", "")
    if not choice:
        return tm.ALWAYS_ON
    if choice == "full":
        return list(tm.ZOO)
    names = choice.split(",")
    unknown = [n for n in names if n not in tm.ZOO]
    if unknown:
        raise ValueError(f"PTO_ZOO: no zoo model {unknown}; the zoo: {', '.join(tm.ZOO)}")
    return names


@pytest.mark.parametrize("name", selected())
def test_model_matches_eager_at_two_batch_sizes(name):
    model = tm.randomize_(tm.build(name), tm.inputs(name, 16))
    with torch.inference_mode():
        tm.check_nontrivial(tm.first_tensor(model(*tm.inputs(name, 2))), name)
    fast = pypto.optimize(model, example_inputs=tm.inputs(name, 1))
    assert isinstance(fast, torch.nn.Module)
    assert fast.dynamic_dims.get("batch", (None,))[0] == 1, fast.dynamic_dims
    tm.check_at_batch_sizes(model, fast, name, TOLERANCE)
    assert fast.compiled.level == 2
    # The shape arithmetic of a symbolic batch (int64 Add/Mul on sizes, position ids, masks)
    # included; bench/zoo_census.py lists what any zoo model still leaves to the reference.
    on_reference = sorted({op for op, b in fast.compiled.node_backends if b != "cpu"})
    assert not on_reference, f"on the reference kernels: {on_reference}"
