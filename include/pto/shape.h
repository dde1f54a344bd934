// Shapes. A graph value's shape may hold symbolic dimensions ("batch", "seq") or unknown ones; a
// tensor's shape is always concrete (std::vector<int64_t>).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pto {

// One dimension of a graph value: a known size, a named symbol, or unknown (neither).
struct Dim {
  int64_t value = -1;  // >= 0 when known
  std::string symbol;  // non-empty when symbolic

  Dim() = default;
  Dim(int64_t v) : value(v) {}  // NOLINT: implicit on purpose, `Shape s = {1, 3, 224, 224}`
  static Dim sym(std::string name) {
    Dim d;
    d.symbol = std::move(name);
    return d;
  }
  static Dim unknown() { return Dim(); }

  bool is_known() const { return value >= 0; }
  bool is_symbolic() const { return value < 0 && !symbol.empty(); }
  bool operator==(const Dim& o) const { return value == o.value && symbol == o.symbol; }
  std::string str() const;
};

using Shape = std::vector<Dim>;
using Dims = std::vector<int64_t>;  // a concrete shape

std::string shape_str(const Shape& s);  // "[batch, 3, 224, 224]", unknown dims print as "?"
std::string dims_str(const Dims& d);    // "[1, 3, 224, 224]"
bool is_static(const Shape& s);
Dims to_dims(const Shape& s);  // requires is_static
Shape to_shape(const Dims& d);

// Element count with an overflow check; throws ValueError naming `where` on overflow or negatives.
int64_t checked_numel(const Dims& d, const char* where = "shape");

// Contiguous row-major strides, in elements.
Dims contiguous_strides(const Dims& d);

// Numpy broadcasting of two concrete shapes; throws ValueError naming `where` when incompatible.
Dims broadcast_dims(const Dims& a, const Dims& b, const std::string& where);
// The same on symbolic shapes: equal symbols broadcast, 1 broadcasts, unknown stays unknown.
Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& where);

// Whether two shapes can be the same at run time: the same rank, and each pair of dimensions
// equal, or one of them unknown or a sum. (A symbol never equals a different symbol or a known
// size; a sum, a computed length such as a cache's "(past+seq)", is taken as an unknown.)
bool may_equal(const Shape& a, const Shape& b);

// Arithmetic on dims. A symbolic dim may be a product, written in a canonical form: an integer
// factor first (when not 1), then the symbols in sorted order, "16*batch", "batch*seq", so two
// equal products are equal Dims. dim_mul is unknown when either side is; dim_div gives the exact
// quotient when the divisor's symbols all appear in the dividend and its factor divides.
Dim dim_mul(const Dim& a, const Dim& b);
std::optional<Dim> dim_div(const Dim& a, const Dim& b);
// Sums: a sum of monomials is written "(t1+t2+c)", the terms in a canonical order with like terms
// merged and the constant last, "(past+seq)", "(2*s+1)", so two equal sums are equal Dims; one
// term alone is itself (s + s = "2*s"). dim_add is unknown when either side is; dim_sub gives
// the difference when no coefficient (nor the constant) goes negative.
Dim dim_add(const Dim& a, const Dim& b);
std::optional<Dim> dim_sub(const Dim& a, const Dim& b);

// Normalizes a possibly negative axis into [0, rank); throws ValueError when out of range.
int64_t normalize_axis(int64_t axis, int64_t rank, const std::string& where);

}  // namespace pto
