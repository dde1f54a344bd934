// Shape values (include/pto/shape_value.h): evaluation of shape arithmetic on symbolic dims.
#include "pto/shape_value.h"

#include <algorithm>

namespace pto {
namespace {

// Input i's one element as a literal integer (-1 included), when it came from a constant.
std::optional<int64_t> literal(const std::vector<const ShapeValue*>& in, size_t i) {
  if (i >= in.size() || !in[i] || !in[i]->is_exact(0) || in[i]->dims.size() != 1)
    return std::nullopt;
  return in[i]->dims[0].value;
}

// A value whose elements are exact where known (a computed -1 is an unknown, never a literal);
// size[i] says element i is never negative (all of them when size has one entry).
ShapeValue computed(Shape dims, bool scalar, const std::vector<bool>& size) {
  ShapeValue out{std::move(dims), scalar, {}};
  for (size_t i = 0; i < out.dims.size(); ++i)
    out.elements.push_back({out.dims[i].is_known(), size[size.size() == 1 ? 0 : i]});
  return out;
}

// Appends element i of v to out.
void append(ShapeValue& out, const ShapeValue& v, size_t i) {
  out.dims.push_back(v.dims[i]);
  out.elements.push_back(i < v.elements.size() ? v.elements[i] : ShapeValue::Element{});
}

// Elements [begin, end) of v (bounds already clamped).
ShapeValue elements(const ShapeValue& v, size_t begin, size_t end, bool scalar) {
  ShapeValue out{{}, scalar, {}};
  for (size_t i = begin; i < end; ++i) append(out, v, i);
  return out;
}

std::optional<int64_t> int_attr_or_input(const Node& n, const std::vector<const ShapeValue*>& in,
                                         size_t i, const char* attr, int64_t fallback) {
  if (i < n.inputs.size() && n.inputs[i] != kNoValue) return literal(in, i);
  if (n.attrs.has(attr)) {
    auto v = n.attrs.get_ints(attr, {});
    if (v.size() == 1) return v[0];
    return std::nullopt;
  }
  return fallback;
}

// One element of Add/Sub/Mul/Div: products and exact quotients of symbolic dims, sums of any
// ("(past+seq)"), differences that stay sizes.
Dim arithmetic(const std::string& op, const Dim& a, const Dim& b) {
  if (op == "Mul") return dim_mul(a, b);
  if (op == "Div") {
    if (a.is_known() && b.is_known()) return b.value > 0 ? Dim(a.value / b.value) : Dim();
    return dim_div(a, b).value_or(Dim::unknown());
  }
  if (op == "Add") return dim_add(a, b);
  return dim_sub(a, b).value_or(Dim::unknown());  // Sub
}

}  // namespace

bool ShapeValue::never_negative(size_t i) const {
  if (i >= dims.size() || i >= elements.size()) return false;
  return elements[i].size || dims[i].is_symbolic() || (elements[i].exact && dims[i].value >= 0);
}

bool ShapeValue::literal() const {
  return elements.size() == dims.size() &&
         std::all_of(elements.begin(), elements.end(), [](const Element& e) { return e.exact; });
}

std::optional<ShapeValue> shape_value_of_constant(const Tensor& t) {
  const bool integral = is_integral(t.dtype()) && !is_storage_only(t.dtype());
  if (!(integral || t.dtype() == DType::kBool) || t.rank() > 1 || t.numel() > 64)
    return std::nullopt;
  ShapeValue out{{}, t.rank() == 0, {}};
  // Read as integers: a double loses the exporters' INT64_MAX / INT64_MIN slice bounds (and
  // turns them into INT64_MIN, an empty slice).
  const Tensor c = t.contiguous();
  dispatch(c.dtype(), kIntTypes | kBoolType, "shape value", [&]<class T>() {
    for (int64_t i = 0; i < c.numel(); ++i)
      out.dims.push_back(Dim(static_cast<int64_t>(c.data<T>()[i])));
  });
  out.elements.assign(out.dims.size(), {.exact = true});
  return out;
}

std::optional<ShapeValue> evaluate_shape_value(const Node& n,
                                               const std::vector<TensorType>& input_types,
                                               const std::vector<const ShapeValue*>& in) {
  auto value = [&](size_t i) -> const ShapeValue* { return i < in.size() ? in[i] : nullptr; };
  if (n.op == "Shape") {
    if (input_types.empty() || !input_types[0].shape) return std::nullopt;
    const Shape& s = *input_types[0].shape;
    const auto rank = static_cast<int64_t>(s.size());
    int64_t start = n.attrs.get_int("start", 0), end = n.attrs.get_int("end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    ShapeValue out = computed({s.begin() + start, s.begin() + end}, false, {true});
    for (int64_t i = start; i < end; ++i) {
      out.elements[i - start].tensor = n.inputs[0];
      out.elements[i - start].axis = i;
    }
    return out;
  }
  if (n.op == "Size") {
    if (input_types.empty() || !input_types[0].shape) return std::nullopt;
    Dim total(1);
    for (const Dim& d : *input_types[0].shape) total = arithmetic("Mul", total, d);
    return computed({total}, true, {true});
  }
  if (n.op == "Identity" || n.op == "Cast") {
    if (!value(0) || (n.op == "Cast" && !is_integral(n.attrs.get_dtype("to")))) return std::nullopt;
    return *value(0);
  }
  if (n.op == "Gather" && value(0) && value(1) && value(1)->literal() &&
      n.attrs.get_int("axis", 0) == 0) {
    ShapeValue out{{}, value(1)->scalar, {}};
    const auto size = static_cast<int64_t>(value(0)->dims.size());
    for (const Dim& d : value(1)->dims) {
      int64_t i = d.value < 0 ? d.value + size : d.value;
      if (i < 0 || i >= size) return std::nullopt;
      append(out, *value(0), static_cast<size_t>(i));
    }
    return out;
  }
  if (n.op == "Slice" && value(0) && !value(0)->scalar) {
    auto start = int_attr_or_input(n, in, 1, "starts", 0);
    auto end = int_attr_or_input(n, in, 2, "ends", 0);
    auto axis = int_attr_or_input(n, in, 3, "axes", 0);
    auto step = int_attr_or_input(n, in, 4, "steps", 1);
    if (!start || !end || !axis || *axis != 0 || !step || *step != 1) return std::nullopt;
    const auto size = static_cast<int64_t>(value(0)->dims.size());
    int64_t s = *start < 0 ? *start + size : *start, e = *end < 0 ? *end + size : *end;
    s = std::clamp<int64_t>(s, 0, size);
    e = std::clamp<int64_t>(e, s, size);
    return elements(*value(0), static_cast<size_t>(s), static_cast<size_t>(e), false);
  }
  if (n.op == "Concat" && n.attrs.get_int("axis", 0) == 0) {
    ShapeValue out{{}, false, {}};
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (!value(i) || value(i)->scalar) return std::nullopt;
      for (size_t j = 0; j < value(i)->dims.size(); ++j) append(out, *value(i), j);
    }
    return out;
  }
  if (n.op == "Unsqueeze" && value(0) && value(0)->scalar) {
    std::optional<int64_t> axis;
    if (n.inputs.size() > 1)
      axis = literal(in, 1);
    else if (n.attrs.has("axes") && n.attrs.get_ints("axes").size() == 1)
      axis = n.attrs.get_ints("axes")[0];
    if (!axis || (*axis != 0 && *axis != -1)) return std::nullopt;
    return elements(*value(0), 0, 1, false);
  }
  if (n.op == "Squeeze" && value(0) && !value(0)->scalar && value(0)->dims.size() == 1)
    return elements(*value(0), 0, 1, true);
  if (n.op == "Reshape" && value(0) && value(1) && value(1)->literal() && !value(1)->scalar) {
    // A size between scalar and [1] (the dynamo exporter's Reshape(floordiv, [-1])).
    const ShapeValue& x = *value(0);
    const Shape& to = value(1)->dims;
    if (to.empty() && x.dims.size() == 1) return elements(x, 0, 1, true);
    if (to.size() == 1 && (to[0].value == -1 || to[0].value == static_cast<int64_t>(x.dims.size())))
      return elements(x, 0, x.dims.size(), false);
    return std::nullopt;
  }
  if (n.op == "Equal" && value(0) && value(1)) {
    // The legacy ONNX exporter's Expand target, Where(Equal(shape, -1), 1, shape): a size is
    // never negative, so a symbolic dim differs from any negative literal.
    const ShapeValue &a = *value(0), &b = *value(1);
    const size_t na = a.dims.size(), nb = b.dims.size();
    if (na != nb && na != 1 && nb != 1) return std::nullopt;
    Shape out;
    for (size_t i = 0; i < std::max(na, nb); ++i) {
      const size_t ia = na == 1 ? 0 : i, ib = nb == 1 ? 0 : i;
      const Dim &x = a.dims[ia], &y = b.dims[ib];
      const bool xe = a.is_exact(ia), ye = b.is_exact(ib);
      Dim r;
      if (xe && ye)
        r = Dim(x.value == y.value ? 1 : 0);
      else if ((a.never_negative(ia) && ye && y.value < 0) ||
               (b.never_negative(ib) && xe && x.value < 0))
        r = Dim(0);
      else if (x.is_symbolic() && x == y)
        r = Dim(1);
      out.push_back(r);
    }
    return computed(std::move(out), a.scalar && b.scalar, {false});
  }
  if (n.op == "Where" && value(0) && value(1) && value(2)) {
    const ShapeValue &c = *value(0), &a = *value(1), &b = *value(2);
    const size_t nc = c.dims.size(), na = a.dims.size(), nb = b.dims.size();
    const size_t size = std::max({nc, na, nb});
    for (size_t s : {nc, na, nb})
      if (s != size && s != 1) return std::nullopt;
    ShapeValue out{{}, c.scalar && a.scalar && b.scalar, {}};
    for (size_t i = 0; i < size; ++i) {
      const Dim& pick = c.dims[nc == 1 ? 0 : i];
      if (!pick.is_known()) return std::nullopt;
      const ShapeValue& from = pick.value != 0 ? a : b;
      append(out, from, from.dims.size() == 1 ? 0 : i);
    }
    return out;
  }
  if ((n.op == "Add" || n.op == "Sub" || n.op == "Mul" || n.op == "Div") && value(0) && value(1)) {
    const ShapeValue &a = *value(0), &b = *value(1);
    const size_t na = a.dims.size(), nb = b.dims.size();
    if (na != nb && na != 1 && nb != 1) return std::nullopt;
    Shape out;
    std::vector<bool> sizes;
    for (size_t i = 0; i < std::max(na, nb); ++i) {
      const size_t ia = na == 1 ? 0 : i, ib = nb == 1 ? 0 : i;
      out.push_back(arithmetic(n.op, a.dims[ia], b.dims[ib]));
      // Sums, products and quotients of sizes stay sizes (Div truncates toward zero).
      sizes.push_back(n.op != "Sub" && a.never_negative(ia) && b.never_negative(ib));
    }
    return computed(std::move(out), a.scalar && b.scalar, std::move(sizes));
  }
  return std::nullopt;
}

}  // namespace pto
