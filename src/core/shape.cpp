#include "pto/shape.h"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>
#include <string_view>

#include "pto/error.h"

namespace pto {

std::string Dim::str() const {
  if (is_known()) return std::to_string(value);
  return symbol.empty() ? "?" : symbol;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + s[i].str();
  return out + "]";
}

std::string dims_str(const Dims& d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + "]";
}

bool is_static(const Shape& s) {
  return std::all_of(s.begin(), s.end(), [](const Dim& d) { return d.is_known(); });
}

Dims to_dims(const Shape& s) {
  Dims d;
  d.reserve(s.size());
  for (const Dim& x : s) {
    PTO_CHECK(x.is_known()) << "to_dims on non-static shape " << shape_str(s);
    d.push_back(x.value);
  }
  return d;
}

Shape to_shape(const Dims& d) {
  return Shape(d.begin(), d.end());
}

int64_t checked_numel(const Dims& d, const char* where) {
  int64_t n = 1;
  for (int64_t x : d) {
    if (x < 0) throw ValueError(cat(where, ": negative dimension in ", dims_str(d)));
    if (__builtin_mul_overflow(n, x, &n))
      throw ValueError(cat(where, ": element count of ", dims_str(d), " overflows int64"));
  }
  return n;
}

Dims contiguous_strides(const Dims& d) {
  Dims s(d.size());
  int64_t acc = 1;
  for (size_t i = d.size(); i-- > 0;) {
    s[i] = acc;
    // Only an empty tensor with huge other dimensions can overflow here (checked_numel rejects
    // the rest); its strides are never used to address memory, so saturate.
    if (__builtin_mul_overflow(acc, std::max<int64_t>(d[i], 1), &acc))
      acc = std::numeric_limits<int64_t>::max();
  }
  return s;
}

Dims broadcast_dims(const Dims& a, const Dims& b, const std::string& where) {
  size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t x = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t y = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (x != y && x != 1 && y != 1)
      throw ValueError(cat(where, ": shapes ", dims_str(a), " and ", dims_str(b),
                           " cannot be broadcast (dimension ", i, ": ", x, " vs ", y, ")"));
    out[i] = x == 1 ? y : x;
  }
  return out;
}

namespace {

// Whether x is min(N, y): the symbol "min(N,y)" Slice inference gives x[:y] of a dimension of
// size N (BERT's position ids, a [1, 512] buffer sliced to the sequence length).
bool is_min_with(const Dim& x, const Dim& y) {
  const std::string_view s = x.symbol;
  if (!x.is_symbolic() || !y.is_symbolic() || !s.starts_with("min(") || !s.ends_with(")"))
    return false;
  const size_t comma = s.find(',');
  return comma != std::string_view::npos && s.substr(comma + 1, s.size() - comma - 2) == y.symbol;
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& where) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    Dim x = i < r - a.size() ? Dim(1) : a[i - (r - a.size())];
    Dim y = i < r - b.size() ? Dim(1) : b[i - (r - b.size())];
    if (x.is_known() && y.is_known()) {
      if (x.value != y.value && x.value != 1 && y.value != 1)
        throw ValueError(cat(where, ": shapes ", shape_str(a), " and ", shape_str(b),
                             " cannot be broadcast (dimension ", i, ")"));
      out[i] = x.value == 1 ? y : x;
    } else if (x.is_known() && x.value == 1) {
      out[i] = y;
    } else if (y.is_known() && y.value == 1) {
      out[i] = x;
    } else if (x == y) {
      out[i] = x;
    } else if (is_min_with(x, y) || is_min_with(y, x)) {
      // min(N, s) <= s, so the two broadcast only where they are equal or both 1: s either way.
      out[i] = is_min_with(x, y) ? y : x;
    } else if (x.is_known()) {
      out[i] = x;  // the symbol must be 1 or equal to x
    } else if (y.is_known()) {
      out[i] = y;
    } else {
      out[i] = Dim::unknown();
    }
  }
  return out;
}

namespace {

// The first '*' of a product outside parentheses ("min(16,2*s)*b" splits after the ")"), npos
// when there is none.
size_t top_level_star(std::string_view s) {
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    if (s[i] == ')') --depth;
    if (s[i] == '*' && depth == 0) return i;
  }
  return std::string_view::npos;
}

// A dim as factor × symbols; nullopt for an unknown dim.
struct Monomial {
  int64_t factor = 1;
  std::vector<std::string> symbols;  // sorted
};

std::optional<Monomial> monomial(const Dim& d) {
  if (d.is_known()) return Monomial{d.value, {}};
  if (!d.is_symbolic()) return std::nullopt;
  Monomial m;
  std::string_view rest = d.symbol;
  while (!rest.empty()) {
    size_t star = top_level_star(rest);
    std::string_view tok = rest.substr(0, star);
    rest = star == std::string_view::npos ? std::string_view() : rest.substr(star + 1);
    const bool digits = !tok.empty() && std::all_of(tok.begin(), tok.end(),
                                                    [](char ch) { return ch >= '0' && ch <= '9'; });
    int64_t v = 0;
    if (digits && tok.size() < 18) {
      for (char ch : tok) v = v * 10 + (ch - '0');
      m.factor *= v;
    } else {
      m.symbols.emplace_back(tok);
    }
  }
  std::sort(m.symbols.begin(), m.symbols.end());
  return m;
}

Dim from_monomial(const Monomial& m) {
  if (m.symbols.empty() || m.factor == 0) return Dim(m.factor);
  std::string s = m.factor == 1 ? "" : std::to_string(m.factor);
  for (const std::string& sym : m.symbols) s += (s.empty() ? "" : "*") + sym;
  return Dim::sym(std::move(s));
}

}  // namespace

Dim dim_mul(const Dim& a, const Dim& b) {
  auto x = monomial(a), y = monomial(b);
  if (!x || !y)
    return (x && x->factor == 0 && x->symbols.empty()) ||
                   (y && y->factor == 0 && y->symbols.empty())
               ? Dim(0)
               : Dim::unknown();
  Monomial m;
  if (__builtin_mul_overflow(x->factor, y->factor, &m.factor)) return Dim::unknown();
  std::merge(x->symbols.begin(), x->symbols.end(), y->symbols.begin(), y->symbols.end(),
             std::back_inserter(m.symbols));
  return from_monomial(m);
}

namespace {

// A dim as a sum of monomials and a constant: "(past+seq)", "(2*s+1)"; nullopt for an unknown
// dim. Terms keyed by their sorted symbols.
struct Linear {
  std::map<std::vector<std::string>, int64_t> terms;
  int64_t constant = 0;
};

// The '+' of a sum outside nested parentheses, inside the outer pair: "(a+min(1,b))" splits once.
std::vector<std::string_view> top_level_terms(std::string_view s) {
  std::vector<std::string_view> out;
  int depth = 0;
  size_t begin = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    if (s[i] == ')') --depth;
    if (s[i] == '+' && depth == 0) {
      out.push_back(s.substr(begin, i - begin));
      begin = i + 1;
    }
  }
  out.push_back(s.substr(begin));
  return out;
}

// Whether s is one parenthesized group: "(a+b)", not "(a+b)*(c+d)".
bool one_group(std::string_view s) {
  if (s.size() < 2 || s.front() != '(' || s.back() != ')') return false;
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    if (s[i] == ')' && --depth == 0 && i + 1 != s.size()) return false;
  }
  return true;
}

bool add_term(Linear& l, const Monomial& m) {
  if (m.symbols.empty()) return !__builtin_add_overflow(l.constant, m.factor, &l.constant);
  int64_t& c = l.terms[m.symbols];
  return !__builtin_add_overflow(c, m.factor, &c);
}

std::optional<Linear> linear(const Dim& d) {
  Linear l;
  if (d.is_known()) {
    l.constant = d.value;
    return l;
  }
  if (!d.is_symbolic()) return std::nullopt;
  const std::string_view s = d.symbol;
  std::vector<std::string_view> parts;
  if (one_group(s)) parts = top_level_terms(s.substr(1, s.size() - 2));
  if (parts.size() < 2) parts = {s};  // a product, a plain symbol, or "(...)" that is no sum
  for (std::string_view part : parts) {
    auto m = monomial(Dim::sym(std::string(part)));
    if (!m || !add_term(l, *m)) return std::nullopt;
  }
  return l;
}

// The canonical spelling: terms in key order, the constant last, "(...)" around a sum; a single
// monomial or a constant as itself.
std::optional<Dim> from_linear(const Linear& l) {
  std::vector<std::string> terms;
  for (const auto& [symbols, factor] : l.terms) {
    if (factor < 0) return std::nullopt;  // a difference: not a size we can write
    if (factor > 0) terms.push_back(from_monomial(Monomial{factor, symbols}).symbol);
  }
  if (l.constant < 0) return std::nullopt;
  if (terms.empty()) return Dim(l.constant);
  if (terms.size() == 1 && l.constant == 0) return Dim::sym(terms[0]);
  if (l.constant != 0) terms.push_back(std::to_string(l.constant));
  std::string s(1, '(');
  for (size_t i = 0; i < terms.size(); ++i) {
    if (i) s.push_back('+');
    s.append(terms[i]);
  }
  s.push_back(')');
  return Dim::sym(std::move(s));
}

}  // namespace

Dim dim_add(const Dim& a, const Dim& b) {
  auto x = linear(a), y = linear(b);
  if (!x || !y) return Dim::unknown();
  if (__builtin_add_overflow(x->constant, y->constant, &x->constant)) return Dim::unknown();
  for (const auto& [symbols, factor] : y->terms)
    if (!add_term(*x, Monomial{factor, symbols})) return Dim::unknown();
  return from_linear(*x).value_or(Dim::unknown());
}

std::optional<Dim> dim_sub(const Dim& a, const Dim& b) {
  auto x = linear(a), y = linear(b);
  if (!x || !y) return std::nullopt;
  if (__builtin_sub_overflow(x->constant, y->constant, &x->constant)) return std::nullopt;
  for (const auto& [symbols, factor] : y->terms)
    if (!add_term(*x, Monomial{-factor, symbols})) return std::nullopt;
  return from_linear(*x);
}

namespace {

// A sum of symbols ("(past+seq)"): the length of a Concat of symbolic parts. Distinct input
// symbols are taken to differ where shapes are compared for fusion; a sum is a computed size
// that may equal any other, as an unknown dim may.
bool is_sum(const Dim& d) {
  if (!d.is_symbolic() || d.symbol.front() != '(') return false;
  const auto l = linear(d);
  return l && l->terms.size() + (l->constant != 0 ? 1 : 0) > 1;
}

}  // namespace

std::optional<Dim> dim_div(const Dim& a, const Dim& b) {
  auto x = monomial(a), y = monomial(b);
  if (!x || !y || y->factor <= 0 || x->factor % y->factor != 0) return std::nullopt;
  Monomial m{x->factor / y->factor, x->symbols};
  for (const std::string& sym : y->symbols) {
    auto it = std::find(m.symbols.begin(), m.symbols.end(), sym);
    if (it == m.symbols.end()) return std::nullopt;
    m.symbols.erase(it);
  }
  return from_monomial(m);
}

int64_t normalize_axis(int64_t axis, int64_t rank, const std::string& where) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    throw ValueError(cat(where, ": axis ", axis, " is out of range for rank ", rank));
  return a;
}

bool may_equal(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool unknown = (!a[i].is_known() && !a[i].is_symbolic()) ||
                         (!b[i].is_known() && !b[i].is_symbolic()) || is_sum(a[i]) || is_sum(b[i]);
    if (!unknown && !(a[i] == b[i])) return false;
  }
  return true;
}

}  // namespace pto
