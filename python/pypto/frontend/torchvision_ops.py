"""Converters of torchvision's own ops (torch.ops.torchvision), loaded by fx_importer the first
time a captured graph holds one: deform_conv2d becomes ONNX DeformConv (the same offset and mask
layouts: per offset group, tap by tap, (dy, dx) pairs); roi_align becomes ONNX RoiAlign (as
torchvision's own ONNX export writes it)."""

from __future__ import annotations

import torch

from .. import dtypes
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


@converter(tv.roi_align.default)
def _roi_align(ctx, node, x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
               aligned):
    # rois are [K, 5] rows of (batch index, x1, y1, x2, y2); RoiAlign takes the boxes and the
    # indices apart. aligned=False is "output_half_pixel" (no half-pixel shift, boxes of at least
    # one pixel), torchvision's adaptive sampling_ratio -1 is ONNX's 0.
    rois = ctx.cast(rois, x.dtype)
    index = ctx.op("Slice", [rois, ctx.ints([0]), ctx.ints([1]), ctx.ints([1])])
    index = ctx.op("Cast", [ctx.op("Reshape", [index, ctx.ints([-1])])],
                   {"to": dtypes.onnx_code(torch.int64)})
    boxes = ctx.op("Slice", [rois, ctx.ints([1]), ctx.ints([5]), ctx.ints([1])])
    return out(ctx, node, ctx.op("RoiAlign", [x, boxes, index], {
        "coordinate_transformation_mode": "half_pixel" if aligned else "output_half_pixel",
        "mode": "avg", "output_height": pooled_height, "output_width": pooled_width,
        "sampling_ratio": max(0, sampling_ratio), "spatial_scale": float(spatial_scale)}))
