"""The fusion patterns of docs/fusion.md, each as a small module: at level 2 it must run in the
kernel count the table promises, at level 0 one kernel per node, and both must give eager
PyTorch's numbers. `python tests/python/test_fusion_patterns.py` prints the table."""

import math

import pytest
import torch
import torch.nn.functional as F

import pypto

C = 8  # channels / features of every pattern


def conv(bias=False):
    return torch.nn.Conv2d(C, C, 3, padding=1, bias=bias)


def bn():
    b = torch.nn.BatchNorm2d(C)
    b.running_mean.uniform_(-0.5, 0.5)
    b.running_var.uniform_(0.5, 2.0)
    b.weight.data.uniform_(0.5, 1.5)
    b.bias.data.uniform_(-0.2, 0.2)
    return b


class Pattern(torch.nn.Module):
    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


def image(batch=2):
    return (torch.randn(batch, C, 10, 10),)


def rows(batch=6):
    return (torch.randn(batch, C),)


def tokens(batch=2):
    return (torch.randn(batch, 5, C),)


def gelu_erf(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    d = x - mean
    var = (d * d).mean(-1, keepdim=True)
    return d / torch.sqrt(var + eps) * w + b


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def silu(x):
    return x * torch.sigmoid(x)


def hardswish(x):
    return x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


def per_channel(values):
    return torch.nn.Parameter(values.reshape(C, 1, 1))


# name -> (module factory, inputs, kernels at level 2)
PATTERNS = {
    "Conv+BN": (lambda: Pattern(lambda m, x: m.b(m.c(x)), c=conv(), b=bn()), image, 1),
    "Conv+BN+ReLU": (lambda: Pattern(lambda m, x: torch.relu(m.b(m.c(x))), c=conv(), b=bn()),
                     image, 1),
    "Conv+ReLU": (lambda: Pattern(lambda m, x: torch.relu(m.c(x)), c=conv(True)), image, 1),
    "Conv+Add+ReLU (residual)": (
        lambda: Pattern(lambda m, x: torch.relu(m.b(m.c(x)) + x), c=conv(), b=bn()), image, 1),
    "Conv+ReLU6 (Clip)": (lambda: Pattern(lambda m, x: F.relu6(m.c(x)), c=conv(True)), image, 1),
    "Conv+SiLU (x*sigmoid(x))": (
        lambda: Pattern(lambda m, x: m.c(x) * torch.sigmoid(m.c(x)), c=conv(True)), image, 1),
    "Conv+HardSwish": (lambda: Pattern(lambda m, x: F.hardswish(m.c(x)), c=conv(True)), image, 1),
    "Conv+Sigmoid": (lambda: Pattern(lambda m, x: torch.sigmoid(m.c(x)), c=conv(True)), image, 1),
    "Conv+LeakyReLU": (lambda: Pattern(lambda m, x: F.leaky_relu(m.c(x), 0.1), c=conv(True)),
                       image, 1),
    "Depthwise Conv+BN+ReLU6": (
        lambda: Pattern(lambda m, x: F.relu6(m.b(m.c(x))),
                        c=torch.nn.Conv2d(C, C, 3, padding=1, groups=C, bias=False), b=bn()),
        image, 1),
    "Conv, (y+x)*0.5, x*sigmoid(x) (spelled out)": (
        lambda: Pattern(lambda m, x: silu((m.c(x) + x) * 0.5), c=conv(True)), image, 1),
    "Conv, y*scale+shift, HardSwish (spelled out)": (
        lambda: Pattern(lambda m, x: hardswish(m.c(x) * m.scale + m.shift), c=conv(),
                        scale=per_channel(torch.rand(C) + 0.5),
                        shift=per_channel(torch.randn(C))), image, 1),
    "Linear+ReLU": (lambda: Pattern(lambda m, x: torch.relu(m.l(x)), l=torch.nn.Linear(C, C)),
                    rows, 1),
    "Linear+GELU": (lambda: Pattern(lambda m, x: F.gelu(m.l(x)), l=torch.nn.Linear(C, C)), tokens,
                    1),
    "Linear+GELU (tanh)": (
        lambda: Pattern(lambda m, x: F.gelu(m.l(x), approximate="tanh"), l=torch.nn.Linear(C, C)),
        tokens, 1),
    "Linear+Tanh": (lambda: Pattern(lambda m, x: torch.tanh(m.l(x)), l=torch.nn.Linear(C, C)),
                    rows, 1),
    "Linear+Sigmoid": (lambda: Pattern(lambda m, x: torch.sigmoid(m.l(x)),
                                       l=torch.nn.Linear(C, C)), rows, 1),
    "Linear+SiLU": (lambda: Pattern(lambda m, x: F.silu(m.l(x)), l=torch.nn.Linear(C, C)), rows,
                    1),
    "Linear+residual add": (lambda: Pattern(lambda m, x: m.l(x) + x, l=torch.nn.Linear(C, C)),
                            tokens, 1),
    "Linear+BatchNorm1d": (
        lambda: Pattern(lambda m, x: m.b(m.l(x)), l=torch.nn.Linear(C, C),
                        b=torch.nn.BatchNorm1d(C)), rows, 1),
    "MatMul+bias+GELU (erf, spelled out)": (
        lambda: Pattern(lambda m, x: gelu_erf(x @ m.w + m.bias),
                        w=torch.nn.Parameter(torch.randn(C, C)),
                        bias=torch.nn.Parameter(torch.randn(C))), tokens, 1),
    "GELU (tanh form, spelled out)": (lambda: Pattern(lambda m, x: gelu_tanh(x)), tokens, 1),
    "LayerNorm (spelled out)": (
        lambda: Pattern(lambda m, x: layer_norm(x, m.w, m.b),
                        w=torch.nn.Parameter(torch.rand(C) + 0.5),
                        b=torch.nn.Parameter(torch.randn(C))), tokens, 1),
    "RMSNorm (spelled out)": (
        lambda: Pattern(lambda m, x: rms_norm(x, m.w), w=torch.nn.Parameter(torch.rand(C) + 0.5)),
        tokens, 1),
    "Add+LayerNorm": (
        lambda: Pattern(lambda m, x, r: m.n(x + r), n=torch.nn.LayerNorm(C)),
        lambda b=2: (torch.randn(b, 5, C), torch.randn(b, 5, C)), 1),
    "embeddings sum+LayerNorm": (
        lambda: Pattern(lambda m, x, t: m.n(x + t + m.pos), n=torch.nn.LayerNorm(C),
                        pos=torch.nn.Parameter(torch.randn(5, C))),
        lambda b=2: (torch.randn(b, 5, C), torch.randn(b, 5, C)), 1),
    "Add+RMSNorm": (
        lambda: Pattern(lambda m, x, r: rms_norm(x + r, m.w),
                        w=torch.nn.Parameter(torch.rand(C) + 0.5)),
        lambda b=2: (torch.randn(b, 5, C), torch.randn(b, 5, C)), 1),
    "attention (SDPA, causal)": (
        lambda: Pattern(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        lambda b=2: (torch.randn(b, 4, 6, 8), torch.randn(b, 4, 6, 8), torch.randn(b, 4, 6, 8)), 1),
    "attention (BERT eager: /sqrt(d), +mask, softmax)": (
        lambda: Pattern(lambda m, q, k, v, mask: torch.softmax(
            q @ k.transpose(-1, -2) / math.sqrt(8) + mask, dim=-1) @ v),
        lambda b=2: (torch.randn(b, 4, 6, 8), torch.randn(b, 4, 6, 8), torch.randn(b, 4, 6, 8),
                     torch.randn(b, 1, 1, 6)), 1),
    # the scale and the mask one tile program, the Softmax its own kernel (a row op in a tile
    # program is slower than on its kernel: src/fusion/fuse_kernels.cpp, row_op)
    "scale+mask+Softmax": (
        lambda: Pattern(lambda m, x, mask: torch.softmax(x * 0.125 + mask, dim=-1)),
        lambda b=2: (torch.randn(b, 4, 6, 6), torch.randn(b, 1, 1, 6)), 2),
    "elementwise chain (Lennard-Jones)": (
        lambda: Pattern(lambda m, r: 4 * 0.1 * (((3.4 / r) ** 6) ** 2 - (3.4 / r) ** 6)),
        lambda b=2: (torch.rand(b, 100) + 1.0,), 1),
    "bias+GELU+dropout (inference)": (
        lambda: Pattern(lambda m, x: F.dropout(F.gelu(x + m.bias), 0.1, training=False),
                        bias=torch.nn.Parameter(torch.randn(C))), tokens, 1),
}


def build(name):
    torch.manual_seed(0)
    factory, inputs, want = PATTERNS[name]
    model = factory().eval()
    return model, inputs(), want


def kernels(name):
    model, x, _ = build(name)
    out = {}
    for level in (0, 2):
        fast = pypto.optimize(model, example_inputs=x, level=level)
        with torch.inference_mode():
            want = model(*x)
        torch.testing.assert_close(fast(*x), want, rtol=1e-4, atol=1e-5)
        out[level] = fast.stats()["kernels"], [s["rule"] for s in fast.compiled.steps]
    return out


@pytest.mark.parametrize("name", list(PATTERNS))
def test_pattern(name):
    _, _, want = build(name)
    k = kernels(name)
    assert k[2][0] == want, f"{name}: {k[2][0]} kernels at level 2 ({k[2][1]}), want {want}"
    assert k[0][0] > k[2][0], f"{name}: level 0 already ran it in {k[0][0]} kernel(s)"


# The conv patterns whose kernel's rule matters: the bias/residual/activation epilogue where it
# covers the chain (it is faster), else the chain as a tile program on each output block.
CONV_RULES = {
    "Conv+BN+ReLU": "Conv+Relu",
    "Conv+Add+ReLU (residual)": "Conv+Add+Relu",
    "Conv+SiLU (x*sigmoid(x))": "Conv+Silu",
    "Conv+HardSwish": "Conv+HardSwish",
    "Depthwise Conv+BN+ReLU6": "Conv+Clip",
    "Conv, (y+x)*0.5, x*sigmoid(x) (spelled out)": "Conv+Elementwise",
    # the per-channel scale and shift fold into the conv's weights and bias (FoldBatchNorm reads
    # them as a BN), leaving the HardSwish epilogue
    "Conv, y*scale+shift, HardSwish (spelled out)": "Conv+HardSwish",
}


@pytest.mark.parametrize("name", list(CONV_RULES))
def test_conv_epilogue_rule(name):
    model, x, _ = build(name)
    fast = pypto.optimize(model, example_inputs=x, level=2)
    with torch.inference_mode():
        want = model(*x)
    torch.testing.assert_close(fast(*x), want, rtol=1e-4, atol=1e-5)
    rules = [s["rule"] for s in fast.compiled.steps]
    assert rules == [CONV_RULES[name]], f"{name}: {rules}"


# The sums feeding a norm: the norm's kernel adds the operands as it loads each row
# (fusion/sum_norm.h), also with the capture's symbolic batch, and at another batch than traced.
NORM_RULES = {
    "Add+LayerNorm": "Add+LayerNormalization",
    "embeddings sum+LayerNorm": "Add+LayerNormalization",
    "Add+RMSNorm": "Add+RMSNormalization",
}


@pytest.mark.parametrize("name", list(NORM_RULES))
def test_sum_norm_rule(name):
    model, x, _ = build(name)
    fast = pypto.optimize(model, example_inputs=x, level=2)
    assert [s["rule"] for s in fast.compiled.steps] == [NORM_RULES[name]]
    for b in (1, 3):
        xs = tuple(torch.randn(b, *v.shape[1:]) for v in x)
        with torch.inference_mode():
            want = model(*xs)
        torch.testing.assert_close(fast(*xs), want, rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    print("| pattern | kernels at level 0 | kernels at level 2 | kernel (rule) |")
    print("|---|---|---|---|")
    for name in PATTERNS:
        k = kernels(name)
        rules = ", ".join(r or "-" for r in k[2][1])
        print(f"| {name} | {k[0][0]} | {k[2][0]} | {rules} |")

