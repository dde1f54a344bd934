// Vectorized transcendental functions on simd.h's Vec, for per-ISA translation units only.
// Each is a range reduction plus a minimax polynomial, accurate to a few ulp over float's range,
// with IEEE special values (NaN propagates, overflow gives inf, underflow gives 0).
#pragma once

#include "backend/cpu/isa/simd.h"

namespace pto::cpu::PTO_ISA_NS {

// e^x: x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6 polynomial, times 2^n built in the
// exponent bits as two factors (each a normal float even when 2^n is not), so results underflow
// gradually through the subnormals. About 1 ulp.
inline Vec exp(Vec x) {
  const Vec hi = Vec::set1(88.7228391f), lo = Vec::set1(-103.972084f);
  Vec xc = min(max(x, lo), hi);
  Vec n = round(xc * Vec::set1(1.44269504088896341f));
  Vec r = fnma(n, Vec::set1(0.693359375f), xc);  // ln2 split in two for an exact product
  r = fnma(n, Vec::set1(-2.12194440e-4f), r);
  Vec p = Vec::set1(1.9875691500e-4f);
  p = fma(p, r, Vec::set1(1.3981999507e-3f));
  p = fma(p, r, Vec::set1(8.3334519073e-3f));
  p = fma(p, r, Vec::set1(4.1665795894e-2f));
  p = fma(p, r, Vec::set1(1.6666665459e-1f));
  p = fma(p, r, Vec::set1(5.0000001201e-1f));
  p = fma(p, r * r, r + Vec::set1(1.0f));
  VecI ni = to_int(n);
  VecI n1 = shift_right_arith<1>(ni), n2 = ni - n1;
  Vec y = p * from_bits(shift_left<23>(n1 + set1_int(127))) *
          from_bits(shift_left<23>(n2 + set1_int(127)));
  y = select(x > hi, Vec::set1(INFINITY), y);
  y = select(x < lo, Vec::zero(), y);
  return select(is_nan(x), x, y);
}

}  // namespace pto::cpu::PTO_ISA_NS
