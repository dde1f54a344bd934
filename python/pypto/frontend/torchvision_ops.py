"""Converters of torchvision's own ops (torch.ops.torchvision), loaded by fx_importer the first
time a captured graph holds one: deform_conv2d becomes ONNX DeformConv (the same offset and mask
layouts: per offset group, tap by tap, (dy, dx) pairs)."""

from __future__ import annotations

import torch

from .aten_ops import out
from .fx_importer import converter

tv = torch.ops.torchvision


@converter(tv.deform_conv2d.default)
def _deform_conv2d(ctx, node, x, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                   dil_h, dil_w, groups, offset_groups, use_mask):
    # torchvision passes a zero-size bias and mask when there are none.
    b = bias if bias is not None and bias.shape and bias.shape[0] else None
    m = mask if use_mask else None
    inputs = [x, ctx.cast(weight, x.dtype), ctx.cast(offset, x.dtype),
              None if b is None else ctx.cast(b, x.dtype),
              None if m is None else ctx.cast(m, x.dtype)]
    while inputs[-1] is None:
        inputs.pop()
    return out(ctx, node, ctx.op("DeformConv", inputs, {
        "strides": [stride_h, stride_w], "pads": [pad_h, pad_w, pad_h, pad_w],
        "dilations": [dil_h, dil_w], "group": groups, "offset_group": offset_groups}))
