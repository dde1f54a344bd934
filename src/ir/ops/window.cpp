#include "window.h"

#include <limits>

namespace pto::window {
namespace {

// Geometry arithmetic runs in 128 bits so that absurd attribute values give a ValueError, not
// signed overflow.
using Wide = __int128;

int64_t narrow(Wide v, const std::string& where) {
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min())
    throw ValueError(cat(where, ": window geometry overflows int64"));
  return static_cast<int64_t>(v);
}

Wide floor_div_wide(Wide a, Wide b) {
  Wide q = a / b;
  return q - ((a % b != 0) && ((a < 0) != (b < 0)));
}

// No real model comes near this; the cap keeps index arithmetic like k * dilation far from int64
// overflow in the kernels.
constexpr int64_t kMaxValue = int64_t{1} << 24;

Dims read_list(const Attributes& a, const char* name, size_t n, int64_t fallback, int64_t min,
               const std::string& where) {
  Dims v = a.get_ints(name, Dims(n, fallback));
  if (v.empty() && n > 0) v.assign(n, fallback);  // an empty list means "the default"
  if (v.size() != n)
    throw ValueError(
        cat(where, ": attribute '", name, "' has ", v.size(), " values, expected ", n));
  for (int64_t x : v)
    if (x < min || x > kMaxValue)
      throw ValueError(cat(where, ": attribute '", name, "' values must be in [", min, ", ",
                           kMaxValue, "], got ", dims_str(v)));
  return v;
}

}  // namespace

AttrSchema window_attrs() {
  return {{"auto_pad", "NOTSET", "NOTSET, SAME_UPPER, SAME_LOWER or VALID"},
          optional_attr("dilations", AttrKind::kInts, "absent: 1 per spatial axis"),
          optional_attr("kernel_shape", AttrKind::kInts, "absent: the weights' spatial dims"),
          optional_attr("pads", AttrKind::kInts, "begins then ends; absent: 0"),
          optional_attr("strides", AttrKind::kInts, "absent: 1 per spatial axis")};
}

AttrSchema pool_attrs() {
  return {{"auto_pad", "NOTSET", "NOTSET, SAME_UPPER, SAME_LOWER or VALID"},
          bool_attr("ceil_mode", false, "opset 10+: 1 rounds output sizes up"),
          optional_attr("dilations", AttrKind::kInts, "opset 10+; absent: 1 per spatial axis"),
          required_attr("kernel_shape", AttrKind::kInts),
          optional_attr("pads", AttrKind::kInts, "begins then ends; absent: 0"),
          optional_attr("strides", AttrKind::kInts, "absent: 1 per spatial axis")};
}

Params read_params(const Attributes& a, Dims kernel, bool pooling, const std::string& where) {
  Params p;
  for (int64_t k : kernel)
    if (k < 1 || k > kMaxValue)
      throw ValueError(
          cat(where, ": kernel sizes must be in [1, ", kMaxValue, "], got ", dims_str(kernel)));
  const size_t n = kernel.size();
  p.kernel = std::move(kernel);
  p.strides = read_list(a, "strides", n, 1, 1, where);
  p.dilations = read_list(a, "dilations", n, 1, 1, where);
  p.pads = read_list(a, "pads", 2 * n, 0, 0, where);
  std::string mode = a.get_string("auto_pad", "NOTSET");
  if (mode == "NOTSET" || mode.empty())
    p.auto_pad = AutoPad::kNotSet;
  else if (mode == "SAME_UPPER")
    p.auto_pad = AutoPad::kSameUpper;
  else if (mode == "SAME_LOWER")
    p.auto_pad = AutoPad::kSameLower;
  else if (mode == "VALID")
    p.auto_pad = AutoPad::kValid;
  else
    throw ValueError(
        cat(where, ": auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got '", mode, "'"));
  p.pooling = pooling;
  if (pooling) p.ceil_mode = a.get_int("ceil_mode", 0) != 0;
  return p;
}

Axis forward_axis(const Params& p, size_t i, int64_t in, const std::string& where) {
  const Wide s = p.strides[i];
  const Wide ext = Wide(p.kernel[i] - 1) * p.dilations[i] + 1;
  Wide out = 0, pb = 0, pe = 0;
  switch (p.auto_pad) {
    case AutoPad::kSameUpper:
    case AutoPad::kSameLower: {
      out = floor_div_wide(Wide(in) + s - 1, s);
      Wide total = (out - 1) * s + ext - in;
      if (total < 0) total = 0;
      pb = p.auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
      pe = total - pb;
      break;
    }
    case AutoPad::kValid:
      out = floor_div_wide(Wide(in) - ext, s) + 1;
      break;
    case AutoPad::kNotSet: {
      pb = p.pads[i];
      pe = p.pads[i + p.rank()];
      const Wide span = Wide(in) + pb + pe - ext;
      if (p.ceil_mode) {
        out = -floor_div_wide(-span, s) + 1;
        // The last window must start inside the input or its leading pad.
        if (out > 0 && (out - 1) * s >= Wide(in) + pb) out -= 1;
      } else {
        out = floor_div_wide(span, s) + 1;
      }
      break;
    }
  }
  if (out < 1 && in > 0 && !p.pooling)
    throw ValueError(cat(where, ": a window of extent ", narrow(ext, where), " (kernel ",
                         p.kernel[i], ", dilation ", p.dilations[i], ") does not fit axis ", i,
                         " of size ", in, " with pads ", narrow(pb, where), "+",
                         narrow(pe, where)));
  if (out < 0) out = 0;
  return {narrow(out, where), narrow(pb, where), narrow(pe, where)};
}

Axis transpose_axis(const Params& p, size_t i, int64_t in, int64_t output_padding,
                    int64_t output_shape, const std::string& where) {
  const Wide s = p.strides[i];
  const Wide ext = Wide(p.kernel[i] - 1) * p.dilations[i] + 1;
  const Wide full = s * (Wide(in) - 1) + output_padding + ext;  // output size before cropping
  Wide out = 0, pb = 0, pe = 0;
  const bool same = p.auto_pad == AutoPad::kSameUpper || p.auto_pad == AutoPad::kSameLower;
  if (output_shape >= 0 || same) {
    // Pads are derived from the requested size: total = full - out, split as the spec says.
    out = output_shape >= 0 ? Wide(output_shape) : Wide(in) * s;
    const Wide total = full - out;
    const Wide half = floor_div_wide(total, 2);
    if (p.auto_pad == AutoPad::kSameUpper) {
      pb = half;
      pe = total - half;
    } else {
      pb = total - half;
      pe = half;
    }
  } else {
    if (p.auto_pad == AutoPad::kNotSet) {
      pb = p.pads[i];
      pe = p.pads[i + p.rank()];
    }
    out = full - pb - pe;
  }
  if (out < 0 || (out == 0 && in > 0))
    throw ValueError(cat(where, ": output size ", narrow(out, where), " of spatial axis ", i,
                         " is not positive"));
  return {narrow(out, where), narrow(pb, where), narrow(pe, where)};
}

}  // namespace pto::window
