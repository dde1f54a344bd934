// parse_graph: reads the text form print() writes (printer.cpp) back into a Graph, one line at a
// time with a cursor: the header, inputs, constants (with inline data when printed), node lines
// "outs = Op(ins) {attrs}  # name" and the return line. A name must be defined on an earlier line.
#include <charconv>
#include <cmath>
#include <cstring>

#include "pto/graph.h"

namespace pto {
namespace {

class LineParser {
 public:
  LineParser(const std::string& line, int number) : s_(line), line_(number) {}

  [[noreturn]] void fail(const std::string& msg) const {
    throw ValueError(cat("parse_graph: line ", line_, ": ", msg, " (at column ", pos_ + 1, ")"));
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }
  bool at_end() {
    skip_space();
    return pos_ >= s_.size();
  }
  char peek() {
    skip_space();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool accept(const char* tok) {
    skip_space();
    size_t n = std::strlen(tok);
    if (s_.compare(pos_, n, tok) != 0) return false;
    pos_ += n;
    return true;
  }
  void expect(const char* tok) {
    if (!accept(tok)) fail(cat("expected '", tok, "'"));
  }
  std::string rest() {
    skip_space();
    std::string r = s_.substr(pos_);
    pos_ = s_.size();
    while (!r.empty() && (r.back() == ' ' || r.back() == '\r')) r.pop_back();
    return r;
  }

  // A run of characters satisfying `ok` (at least one).
  template <class F>
  std::string word(F ok, const char* what) {
    skip_space();
    size_t start = pos_;
    while (pos_ < s_.size() && ok(s_[pos_])) ++pos_;
    if (pos_ == start) fail(cat("expected ", what));
    return s_.substr(start, pos_ - start);
  }
  std::string identifier() {
    return word([](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; },
                "a name");
  }
  std::string quoted_string() {
    skip_space();
    if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string");
    std::string out;
    for (++pos_; pos_ < s_.size() && s_[pos_] != '"'; ++pos_) {
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) {
        ++pos_;
        out += s_[pos_] == 'n' ? '\n' : s_[pos_];
      } else {
        out += s_[pos_];
      }
    }
    if (pos_ >= s_.size()) fail("unterminated string");
    ++pos_;
    return out;
  }
  // %name or %"name" (without the %); "_" is a missing value (returns nullopt).
  std::optional<std::string> value_ref() {
    if (accept("_")) return std::nullopt;
    expect("%");
    if (pos_ < s_.size() && s_[pos_] == '"') return quoted_string();
    std::string name = word(
        [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_.:/@+-%", c);
        },
        "a value name");
    // "%x: f32[2]": the colon that starts a type is not part of the name.
    if (name.back() == ':') {
      name.pop_back();
      --pos_;
    }
    return name;
  }
  // A number as written: digits, signs, point, exponent, inf, nan.
  std::string number_token() {
    return word(
        [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '+';
        },
        "a number");
  }
  int64_t integer() {
    std::string t = number_token();
    int64_t v = 0;
    auto r = std::from_chars(t.data(), t.data() + t.size(), v);
    if (r.ec != std::errc() || r.ptr != t.data() + t.size()) fail(cat("bad integer '", t, "'"));
    return v;
  }

  TensorType type() {
    std::string dt = identifier();
    // "seq<...>" and "opt<...>" wrap the tensor type inside (TensorType::str): seq(tensor),
    // optional(tensor), optional(seq(tensor)).
    if ((dt == "seq" || dt == "opt") && accept("<")) {
      TensorType t = type();
      if (t.optional || (dt == "seq" && t.sequence))
        fail(cat("a ", dt, " of ", t.str(), " is not a type PyPTO has"));
      (dt == "seq" ? t.sequence : t.optional) = true;
      expect(">");
      return t;
    }
    TensorType t;
    try {
      t.dtype = dt == "undefined" ? DType::kUndefined : dtype_from_name(dt);
    } catch (const ValueError&) {
      fail(cat("unknown dtype '", dt, "'"));
    }
    expect("[");
    if (accept("*")) {
      expect("]");
      return t;
    }
    Shape shape;
    if (!accept("]")) {
      do {
        char c = peek();
        if (accept("?"))
          shape.push_back(Dim::unknown());
        else if (std::isdigit(static_cast<unsigned char>(c)))
          shape.push_back(Dim(integer()));
        else
          shape.push_back(Dim::sym(identifier()));
      } while (accept(","));
      expect("]");
    }
    t.shape = std::move(shape);
    return t;
  }

  // "[1, 2.5, nan]" into a tensor of `type` (which must be static).
  Tensor tensor_data(const TensorType& type) {
    if (!type.shape || !is_static(*type.shape)) fail("constant data needs a static shape");
    if (type.dtype == DType::kUndefined) fail("constant data needs a dtype");
    std::vector<std::string> items;
    expect("[");
    if (!accept("]")) {
      do items.push_back(number_token());
      while (accept(","));
      expect("]");
    }
    Dims dims = to_dims(*type.shape);
    Tensor t = Tensor::empty(type.dtype, dims);
    if (static_cast<int64_t>(items.size()) != t.numel())
      fail(cat("constant ", t.str(), " needs ", t.numel(), " values, got ", items.size()));
    dispatch_with_storage(type.dtype, kAllTypes | kStorageTypes, "parse_graph", [&]<class T>() {
      T* p = t.data<T>();
      for (size_t i = 0; i < items.size(); ++i) p[i] = element<T>(items[i]);
    });
    return t;
  }

  template <class T>
  T element(const std::string& item) {
    const char* b = item.data();
    const char* e = b + item.size();
    if constexpr (std::is_same_v<T, bool>) {
      if (item == "true" || item == "1") return true;
      if (item == "false" || item == "0") return false;
      fail(cat("bad bool '", item, "'"));
    } else if constexpr (std::is_integral_v<T>) {
      T v{};
      auto r = std::from_chars(b, e, v);
      if (r.ec != std::errc() || r.ptr != e) fail(cat("bad integer '", item, "'"));
      return v;
    } else if constexpr (is_small_int_v<T>) {
      int v = element<int>(item);
      if (v < T::min || v > T::max) fail(cat("integer '", item, "' is out of range"));
      return T(v);
    } else {
      using F = std::conditional_t<std::is_same_v<T, double>, double, float>;
      F v{};
      auto r = std::from_chars(b, e, v);
      if (r.ec != std::errc() || r.ptr != e) fail(cat("bad number '", item, "'"));
      return static_cast<T>(v);
    }
  }

  // A float attribute as the printer writes it: through float, or exactly with a "d" suffix.
  double float_attribute(const std::string& t) {
    if (!t.empty() && t.back() == 'd') return element<double>(t.substr(0, t.size() - 1));
    return static_cast<double>(element<float>(t));
  }

  Attribute attribute() {
    char c = peek();
    if (c == '"') return quoted_string();
    // A subgraph: its block follows the node line (GraphParser::node_line reads it).
    if (accept("graph")) return GraphAttr{};
    if (accept("tensor<")) {
      TensorType t = type();
      Tensor data;
      if (accept("=")) {
        data = tensor_data(t);
      } else {
        if (!t.shape || !is_static(*t.shape)) fail("a tensor attribute needs a static shape");
        data = Tensor::zeros(t.dtype, to_dims(*t.shape));
      }
      expect(">");
      return data;
    }
    if (accept("[")) {
      if (accept("]")) return std::vector<int64_t>{};
      if (peek() == '"') {
        std::vector<std::string> out;
        do out.push_back(quoted_string());
        while (accept(","));
        expect("]");
        return out;
      }
      std::vector<std::string> items;
      do items.push_back(number_token());
      while (accept(","));
      expect("]");
      bool all_int = true;
      for (const std::string& it : items) all_int = all_int && is_int(it);
      if (all_int) {
        std::vector<int64_t> out;
        for (const std::string& it : items) out.push_back(element<int64_t>(it));
        return out;
      }
      std::vector<double> out;
      for (const std::string& it : items) out.push_back(float_attribute(it));
      return out;
    }
    std::string t = number_token();
    if (is_int(t)) return element<int64_t>(t);
    return float_attribute(t);
  }

 private:
  static bool is_int(const std::string& t) {
    return t.find_first_of(".eEnNiI") == std::string::npos;
  }

  const std::string& s_;
  int line_;
  size_t pos_ = 0;
};

class GraphParser {
 public:
  GraphParser(const std::vector<std::string>& lines, size_t& cursor)
      : lines_(lines), cursor_(cursor) {}

  // The graph whose header is the next non-blank line; a subgraph's header starts with the name
  // of its attribute (`label`), and it ends at its return line.
  Graph parse(const std::string& label = "") {
    bool header = false, done = false;
    int number = 0;
    while (cursor_ < lines_.size() && !(done && !label.empty())) {
      const std::string& line = lines_[cursor_++];
      number = static_cast<int>(cursor_);
      LineParser p(line, number);
      if (p.at_end() || p.accept("//")) continue;
      if (done) p.fail("text after the return line");
      if (!header) {
        if (!label.empty()) {
          if (!p.accept(label.c_str()) || !p.accept(":"))
            p.fail(cat("expected the subgraph '", label, ": graph NAME (opset N)'"));
        }
        p.expect("graph");
        header_line(p, number);
        header = true;
        continue;
      }
      try {
        if (p.accept("input ")) {
          if (g_.num_captures) p.fail("an input after a capture (captures are the last inputs)");
          input_line(p);
        } else if (p.accept("capture ")) {
          input_line(p);
          ++g_.num_captures;
        } else if (p.accept("const ")) {
          const_line(p);
        } else if (p.accept("return")) {
          return_line(p);
          done = true;
        } else {
          node_line(p);
        }
      } catch (const ValueError& e) {
        if (std::strncmp(e.what(), "parse_graph:", 12) == 0) throw;
        p.fail(e.what());
      } catch (const Error& e) {
        p.fail(e.what());
      }
    }
    if (!header)
      throw ValueError(
          label.empty() ? std::string("parse_graph: no 'graph' line")
                        : cat("parse_graph: line ", number, ": subgraph '", label, "' is missing"));
    if (!done) throw ValueError(cat("parse_graph: line ", number, ": no 'return' line"));
    if (untyped_) {
      try {
        infer_types(g_);
      } catch (const Error& e) {
        throw ValueError(cat("parse_graph: inferring the types left out: ", e.what()));
      }
    }
    return std::move(g_);
  }

 private:
  // The header after "graph": "NAME (opset N)".
  void header_line(LineParser& p, int number) {
    const std::string line = p.rest();
    size_t at = line.rfind("(opset ");
    if (at == std::string::npos) p.fail("expected 'graph NAME (opset N)'");
    std::string name = line.substr(0, at);
    while (!name.empty() && name.back() == ' ') name.pop_back();
    g_.name = name == "main" ? "" : name;
    const std::string tail = line.substr(at + 7);
    LineParser q(tail, number);
    g_.opset = static_cast<int>(q.integer());
    q.expect(")");
    if (!q.at_end()) q.fail("unexpected text after the header");
  }

  ValueId lookup(LineParser& p, const std::optional<std::string>& name) {
    if (!name) return kNoValue;
    std::optional<ValueId> v = g_.find_value(*name);
    if (!v) p.fail(cat("value '%", *name, "' is not defined on an earlier line"));
    return *v;
  }

  std::string declared_name(LineParser& p) {
    std::optional<std::string> name = p.value_ref();
    if (!name) p.fail("expected a value name, got '_'");
    return *name;
  }

  void input_line(LineParser& p) {
    std::string name = declared_name(p);
    p.expect(":");
    TensorType t = p.type();
    if (!p.at_end()) p.fail("unexpected text after the input");
    g_.add_input(name, t);
  }

  void const_line(LineParser& p) {
    std::string name = declared_name(p);
    p.expect(":");
    TensorType t = p.type();
    Tensor data;
    if (p.accept("=")) {
      data = p.tensor_data(t);
    } else {
      if (!t.shape || !is_static(*t.shape)) p.fail("a constant needs a static shape");
      data = Tensor::zeros(t.dtype, to_dims(*t.shape));
    }
    if (!p.at_end()) p.fail("unexpected text after the constant");
    // A graph input with a default value: the const line names the input again.
    std::optional<ValueId> v = g_.find_value(name);
    if (v) {
      bool is_input = false;
      for (ValueId in : g_.inputs()) is_input = is_input || in == *v;
      if (!is_input || g_.initializer(*v)) p.fail(cat("value '%", name, "' is defined twice"));
    }
    g_.set_initializer(v ? *v : g_.add_value(name), std::move(data));
  }

  void return_line(LineParser& p) {
    if (p.at_end()) return;
    do {
      ValueId v = lookup(p, p.value_ref());
      if (v == kNoValue) p.fail("a graph output cannot be '_'");
      g_.add_output(v);
    } while (p.accept(","));
    if (!p.at_end()) p.fail("unexpected text after the outputs");
  }

  void node_line(LineParser& p) {
    std::vector<std::pair<std::optional<std::string>, std::optional<TensorType>>> outs;
    do {
      std::optional<std::string> name = p.value_ref();
      std::optional<TensorType> t;
      if (name && p.accept(":")) t = p.type();
      if (name && !t) untyped_ = true;
      outs.emplace_back(std::move(name), std::move(t));
    } while (p.accept(","));
    p.expect("=");
    std::string op = p.word(
        [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; },
        "an op name");
    std::string domain;
    if (size_t dot = op.rfind('.'); dot != std::string::npos) {
      domain = op.substr(0, dot);
      op = op.substr(dot + 1);
    }
    p.expect("(");
    std::vector<ValueId> inputs;
    if (!p.accept(")")) {
      do inputs.push_back(lookup(p, p.value_ref()));
      while (p.accept(","));
      p.expect(")");
    }
    Attributes attrs;
    if (p.accept("{")) {
      if (!p.accept("}")) {
        do {
          std::string key = p.identifier();
          p.expect("=");
          attrs.set(key, p.attribute());
        } while (p.accept(","));
        p.expect("}");
      }
    }
    std::string node_name;
    if (p.accept("#")) node_name = p.rest();
    if (!p.at_end()) p.fail("unexpected text after the node");
    // The blocks of the graph attributes follow, in attribute order.
    std::vector<std::string> subgraphs;
    for (const auto& [key, a] : attrs.all())
      if (std::holds_alternative<GraphAttr>(a)) subgraphs.push_back(key);
    for (const std::string& key : subgraphs)
      attrs.set(key, std::make_shared<const Graph>(GraphParser(lines_, cursor_).parse(key)));
    std::vector<ValueId> outputs;
    for (auto& [name, t] : outs) {
      if (!name) {
        outputs.push_back(kNoValue);
        continue;
      }
      if (g_.find_value(*name)) p.fail(cat("value '%", *name, "' is defined twice"));
      outputs.push_back(g_.add_value(*name, t.value_or(TensorType{})));
    }
    Node& n = g_.add_node(op, std::move(inputs), std::move(outputs), std::move(attrs), node_name);
    n.domain = domain;
  }

  const std::vector<std::string>& lines_;
  size_t& cursor_;
  Graph g_;
  bool untyped_ = false;
};

}  // namespace

Graph parse_graph(const std::string& text) {
  std::vector<std::string> lines;
  for (size_t start = 0; start <= text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  size_t cursor = 0;
  return GraphParser(lines, cursor).parse();
}

TensorType parse_type(const std::string& text) {
  LineParser p(text, 1);
  TensorType t = p.type();
  if (!p.at_end()) p.fail(cat("'", text, "' is not one type"));
  return t;
}

}  // namespace pto
