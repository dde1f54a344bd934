// structurally_equal: matches the values of two graphs by walking back from their outputs with a
// worklist of (value of a, value of b) pairs. Graph inputs match by position, constants by data,
// node outputs by (producer node, output index); a node pair is compared once (op, domain,
// attributes, arity, output types) and its inputs join the worklist. The node map must stay a
// bijection. Nodes no output reaches are then matched pairwise in order.
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>

#include "pto/graph.h"

namespace pto {
namespace {

bool same_tensor(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

bool same_double(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

// Empty lists compare equal whatever their element type: the text form cannot tell them apart.
bool empty_list(const Attribute& a) {
  if (auto* v = std::get_if<std::vector<int64_t>>(&a)) return v->empty();
  if (auto* v = std::get_if<std::vector<double>>(&a)) return v->empty();
  if (auto* v = std::get_if<std::vector<std::string>>(&a)) return v->empty();
  return false;
}

}  // namespace

bool same_attribute(const Attribute& a, const Attribute& b) {
  if (empty_list(a) && empty_list(b)) return true;
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        const T& y = std::get<T>(b);
        if constexpr (std::is_same_v<T, Tensor>) {
          return same_tensor(x, y);
        } else if constexpr (std::is_same_v<T, GraphAttr>) {
          return x == y || (x && y && structurally_equal(*x, *y));
        } else if constexpr (std::is_same_v<T, double>) {
          return same_double(x, y);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          if (x.size() != y.size()) return false;
          for (size_t i = 0; i < x.size(); ++i)
            if (!same_double(x[i], y[i])) return false;
          return true;
        } else {
          return x == y;
        }
      },
      a);
}

bool same_attributes(const Attributes& a, const Attributes& b) {
  if (a.all().size() != b.all().size()) return false;
  for (const auto& [k, v] : a.all()) {
    auto it = b.all().find(k);
    if (it == b.all().end() || !same_attribute(v, it->second)) return false;
  }
  return true;
}

namespace {

bool same_type(const TensorType& a, const TensorType& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.sequence == b.sequence &&
         a.optional == b.optional;
}

class Matcher {
 public:
  Matcher(const Graph& a, const Graph& b)
      : a_(a), b_(b), a_to_b_(a.nodes().size(), -1), b_to_a_(b.nodes().size(), -1) {
    for (size_t i = 0; i < a.inputs().size(); ++i) a_input_[a.inputs()[i]] = static_cast<int>(i);
    for (size_t i = 0; i < b.inputs().size(); ++i) b_input_[b.inputs()[i]] = static_cast<int>(i);
  }

  bool run(std::string& why) {
    if (a_.inputs().size() != b_.inputs().size())
      return fail(why, cat(a_.inputs().size(), " inputs vs ", b_.inputs().size()));
    for (size_t i = 0; i < a_.inputs().size(); ++i) {
      const Value& x = a_.value(a_.inputs()[i]);
      const Value& y = b_.value(b_.inputs()[i]);
      if (!same_type(x.type, y.type))
        return fail(why, cat("input ", i, " is ", x.type.str(), " vs ", y.type.str()));
      const Tensor* tx = a_.initializer(a_.inputs()[i]);
      const Tensor* ty = b_.initializer(b_.inputs()[i]);
      if ((tx != nullptr) != (ty != nullptr) || (tx && !same_tensor(*tx, *ty)))
        return fail(why, cat("input ", i, " has a different default value"));
    }
    if (a_.outputs().size() != b_.outputs().size())
      return fail(why, cat(a_.outputs().size(), " outputs vs ", b_.outputs().size()));
    for (size_t i = 0; i < a_.outputs().size(); ++i)
      work_.emplace_back(a_.outputs()[i], b_.outputs()[i]);
    if (!drain(why)) return false;
    // Nodes no output reaches: pair them in order.
    std::vector<int> rest_a, rest_b;
    for (size_t i = 0; i < a_to_b_.size(); ++i)
      if (a_to_b_[i] < 0) rest_a.push_back(static_cast<int>(i));
    for (size_t i = 0; i < b_to_a_.size(); ++i)
      if (b_to_a_[i] < 0) rest_b.push_back(static_cast<int>(i));
    if (rest_a.size() != rest_b.size())
      return fail(why, cat(a_.nodes().size(), " nodes vs ", b_.nodes().size()));
    for (size_t i = 0; i < rest_a.size(); ++i) {
      if (a_to_b_[rest_a[i]] >= 0 || b_to_a_[rest_b[i]] >= 0) continue;  // reached meanwhile
      if (!match_nodes(rest_a[i], rest_b[i], why) || !drain(why)) return false;
    }
    return true;
  }

 private:
  static bool fail(std::string& why, std::string msg) {
    why = std::move(msg);
    return false;
  }

  std::string name_a(ValueId v) const { return v == kNoValue ? "_" : "%" + a_.value(v).name; }
  std::string name_b(ValueId v) const { return v == kNoValue ? "_" : "%" + b_.value(v).name; }

  bool drain(std::string& why) {
    while (!work_.empty()) {
      auto [x, y] = work_.front();
      work_.pop_front();
      if (!match_values(x, y, why)) return false;
    }
    return true;
  }

  bool match_values(ValueId x, ValueId y, std::string& why) {
    auto differ = [&](const std::string& what) {
      return fail(why, cat("value ", name_a(x), " vs ", name_b(y), ": ", what));
    };
    if ((x == kNoValue) != (y == kNoValue)) return differ("one is missing");
    if (x == kNoValue) return true;
    auto ia = a_input_.find(x), ib = b_input_.find(y);
    if ((ia != a_input_.end()) != (ib != b_input_.end()))
      return differ("one is a graph input, the other is not");
    if (ia != a_input_.end())
      return ia->second == ib->second ? true : differ("different graph inputs");
    const Tensor* tx = a_.initializer(x);
    const Tensor* ty = b_.initializer(y);
    if ((tx != nullptr) != (ty != nullptr)) return differ("one is a constant, the other is not");
    if (tx) return same_tensor(*tx, *ty) ? true : differ("different constant data");
    int px = a_.value(x).producer, py = b_.value(y).producer;
    if (px < 0 || py < 0) return differ("no producer");
    size_t ox = 0, oy = 0;
    while (a_.nodes()[px].outputs[ox] != x) ++ox;
    while (b_.nodes()[py].outputs[oy] != y) ++oy;
    if (ox != oy) return differ(cat("output ", ox, " vs output ", oy, " of their nodes"));
    return match_nodes(px, py, why);
  }

  bool match_nodes(int x, int y, std::string& why) {
    if (a_to_b_[x] == y && b_to_a_[y] == x) return true;
    const Node& n = a_.nodes()[x];
    const Node& m = b_.nodes()[y];
    auto differ = [&](const std::string& what) {
      return fail(why, cat("node ", n.where(), " vs ", m.where(), ": ", what));
    };
    if (a_to_b_[x] >= 0 || b_to_a_[y] >= 0)
      return differ("one node would match two (the graphs share differently)");
    a_to_b_[x] = y;
    b_to_a_[y] = x;
    if (n.op != m.op || n.domain != m.domain) return differ("different ops");
    if (!same_attributes(n.attrs, m.attrs)) return differ("different attributes");
    if (n.inputs.size() != m.inputs.size()) return differ("different input counts");
    if (n.outputs.size() != m.outputs.size()) return differ("different output counts");
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      ValueId p = n.outputs[i], q = m.outputs[i];
      if ((p == kNoValue) != (q == kNoValue)) return differ(cat("output ", i, " missing in one"));
      if (p != kNoValue && !same_type(a_.value(p).type, b_.value(q).type))
        return differ(
            cat("output ", i, " is ", a_.value(p).type.str(), " vs ", b_.value(q).type.str()));
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) work_.emplace_back(n.inputs[i], m.inputs[i]);
    return true;
  }

  const Graph& a_;
  const Graph& b_;
  std::vector<int> a_to_b_, b_to_a_;
  std::unordered_map<ValueId, int> a_input_, b_input_;
  std::deque<std::pair<ValueId, ValueId>> work_;
};

}  // namespace

bool structurally_equal(const Graph& a, const Graph& b, std::string* why) {
  std::string reason;
  bool same = a.num_captures == b.num_captures;
  if (!same) reason = cat("captures: ", a.num_captures, " vs ", b.num_captures);
  same = same && Matcher(a, b).run(reason);
  if (why) *why = same ? "" : reason;
  return same;
}

}  // namespace pto
