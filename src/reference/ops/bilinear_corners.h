// The four taps of one bilinear sample of a [height, width] map at (y, x), as onnxruntime's
// RoiAlign computes them: plane offsets and weights, all zero for a point outside the map (or
// NaN); coordinates in [-1, 0) are clamped to 0 and past the last row or column held there. Shared
// by the reference RoiAlign (image_detect.cpp) and the CPU kernel (backend/cpu/detect.cpp),
// which must sample at the same points.
#pragma once

#include <algorithm>
#include <cstdint>

namespace pto::reference {

struct BilinearCorners {
  int64_t pos[4] = {0, 0, 0, 0};
  double weight[4] = {0, 0, 0, 0};
};

inline BilinearCorners bilinear_corners(double y, double x, int64_t height, int64_t width) {
  BilinearCorners c;
  if (!(y >= -1.0 && y <= static_cast<double>(height) && x >= -1.0 &&
        x <= static_cast<double>(width)))
    return c;  // outside (or NaN)
  y = std::max(y, 0.0);
  x = std::max(x, 0.0);
  int64_t y_low = static_cast<int64_t>(y), x_low = static_cast<int64_t>(x), y_high, x_high;
  if (y_low >= height - 1) {
    y_high = y_low = height - 1;
    y = static_cast<double>(y_low);
  } else {
    y_high = y_low + 1;
  }
  if (x_low >= width - 1) {
    x_high = x_low = width - 1;
    x = static_cast<double>(x_low);
  } else {
    x_high = x_low + 1;
  }
  const double ly = y - static_cast<double>(y_low), lx = x - static_cast<double>(x_low);
  const double hy = 1 - ly, hx = 1 - lx;
  c.pos[0] = y_low * width + x_low;
  c.pos[1] = y_low * width + x_high;
  c.pos[2] = y_high * width + x_low;
  c.pos[3] = y_high * width + x_high;
  c.weight[0] = hy * hx;
  c.weight[1] = hy * lx;
  c.weight[2] = ly * hx;
  c.weight[3] = ly * lx;
  return c;
}

}  // namespace pto::reference
