// The shared pieces of the local-rewrite passes (rewrite_util.h).
#include "passes/rewrite_util.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/ops/op_params.h"
#include "pto/device_info.h"

namespace pto::passes {

const Node* producer(const Graph& g, ValueId v) {
  if (v == kNoValue) return nullptr;
  int32_t p = g.value(v).producer;
  return p >= 0 && static_cast<size_t>(p) < g.nodes().size() ? &g.nodes()[p] : nullptr;
}

// A Constant node's `value` (the importer keeps Constant nodes; FoldConstants may not have run).
const Node* constant_node(const Graph& g, ValueId v) {
  const Node* p = producer(g, v);
  return p && p->op == "Constant" && p->outputs.size() == 1 ? p : nullptr;
}

const Tensor* constant(const Graph& g, ValueId v) {
  if (v == kNoValue) return nullptr;
  if (const Node* c = constant_node(g, v)) {
    if (!c->attrs.has("value") || !std::holds_alternative<Tensor>(c->attrs.all().at("value")))
      return nullptr;
    const Tensor& t = c->attrs.get_tensor("value");
    return t.defined() ? &t : nullptr;
  }
  const Tensor* t = g.initializer(v);
  if (!t || !t->defined()) return nullptr;
  if (std::find(g.inputs().begin(), g.inputs().end(), v) != g.inputs().end()) return nullptr;
  return t;
}

std::optional<double> scalar_constant(const Graph& g, ValueId v) {
  if (const Node* c = constant_node(g, v)) {
    const auto& a = c->attrs.all();
    if (auto it = a.find("value_float");
        it != a.end() && std::holds_alternative<double>(it->second))
      return std::get<double>(it->second);
    if (auto it = a.find("value_int"); it != a.end() && std::holds_alternative<int64_t>(it->second))
      return static_cast<double>(std::get<int64_t>(it->second));
  }
  const Tensor* t = constant(g, v);
  if (!t || t->numel() != 1 || t->dtype() == DType::kBool) return std::nullopt;
  return t->item_as_double(0);
}

std::optional<std::pair<double, double>> clamp_bounds(const Graph& g, const Node& n) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (!n.domain.empty() || n.inputs.empty()) return std::nullopt;
  if (n.op == "Relu") return std::pair{0.0, kInf};
  if (n.op != "Clip") return std::nullopt;
  double lo = n.attrs.get_float("min", -kInf), hi = n.attrs.get_float("max", kInf);
  for (size_t i = 1; i < n.inputs.size() && i < 3; ++i) {
    if (n.inputs[i] == kNoValue) continue;
    const Tensor* t = constant(g, n.inputs[i]);
    if (!t || t->numel() != 1) return std::nullopt;
    (i == 1 ? lo : hi) = t->item_as_double();
  }
  return std::pair{lo, hi};
}

std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = t.item_as_double(i);
  return out;
}

std::optional<Tensor> float_tensor(DType dt, const Dims& shape, const std::vector<double>& v) {
  if (!is_floating(dt)) return std::nullopt;
  Tensor t = Tensor::empty(dt, shape);
  if (static_cast<size_t>(t.numel()) != v.size()) return std::nullopt;
  dispatch(dt, kFloatTypes, "[rewrite]", [&]<class T>() {
    T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) {
      if constexpr (std::is_same_v<T, double>)
        p[i] = v[i];
      else
        p[i] = T(static_cast<float>(v[i]));
    }
  });
  return t;
}

bool same_shape(const Graph& g, ValueId a, ValueId b) {
  const auto &sa = g.value(a).type.shape, &sb = g.value(b).type.shape;
  if (!sa || !sb || *sa != *sb) return false;
  for (const Dim& d : *sa)
    if (!d.is_known() && !d.is_symbolic()) return false;
  return true;
}

void retarget(Node& n, const std::string& op, std::vector<ValueId> inputs, Attributes attrs,
              int opset) {
  const OpDef* def = OpRegistry::global().find(op);
  PTO_CHECK(def) << "retarget: op '" << op << "' is not registered";
  n.op = op;
  n.def = def;
  n.opset = opset;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.attrs.where = n.where();
}

Attributes without(const Attributes& a, const std::string& name) {
  Attributes out;
  for (const auto& [k, v] : a.all())
    if (k != name) out.set(k, v);
  out.where = a.where;
  return out;
}

void Rewrite::move_output(size_t node, size_t slot, ValueId v) {
  Node& n = g_.mutable_nodes()[node];
  ValueId old = n.outputs.at(slot);
  n.outputs[slot] = v;
  g_.value(v).producer = static_cast<int32_t>(node);
  if (old != kNoValue) g_.value(old).producer = -1;
}

const std::vector<int>& Rewrite::uses() {
  if (!uses_valid_) uses_ = g_.use_counts();
  uses_valid_ = true;
  return uses_;
}

const ReaderIndex& Rewrite::readers() {
  if (!readers_) readers_.emplace(g_);
  return *readers_;
}

Node& Rewrite::insert(size_t pos, const std::string& op, std::vector<ValueId> inputs,
                      std::vector<ValueId> outputs, Attributes attrs, std::string name, int opset) {
  Node& n = g_.insert_node(pos, op, std::move(inputs), std::move(outputs), std::move(attrs),
                           std::move(name));
  n.opset = opset;
  uses_valid_ = false;
  readers_.reset();
  doomed_.insert(doomed_.begin() + static_cast<std::ptrdiff_t>(pos), false);
  return n;
}

int Rewrite::finish() {
  int count = 0;
  for (size_t i = 0; i < doomed_.size(); ++i) {
    if (!doomed_[i]) continue;
    ++count;
    // An output another node has taken over (move_output) must keep its new producer.
    for (ValueId& o : g_.mutable_nodes()[i].outputs)
      if (o != kNoValue && g_.value(o).producer != static_cast<int32_t>(i)) o = kNoValue;
  }
  if (count) {
    g_.remove_nodes(doomed_);
    changed();  // node indices moved: uses() and readers() are rebuilt when next asked
  }
  doomed_.assign(g_.nodes().size(), false);
  return count;
}

void apply_rules(Graph& g, const std::vector<Rule>& rules, const PassContext& ctx, int max_sweeps) {
  for (int sweep = 0; sweep < max_sweeps; ++sweep) {
    Rewrite rw(g);
    bool changed = false;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      if (rw.removed(i)) continue;
      for (const Rule& rule : rules) {
        bool fired = false;
        try {
          fired = rule.apply(rw, i, ctx);
        } catch (const Error&) {
          // A malformed attribute (a float where an int belongs, ...): no match. Rules read
          // everything they need before they change the graph, so nothing is half done.
          fired = false;
        }
        if (fired) {
          rw.changed();
          if (rule.name) ctx.note(rule.name);
          changed = true;
          break;
        }
      }
    }
    rw.finish();
    if (!changed) return;
  }
}

std::optional<BnAffine> bn_affine(const Graph& g, const Node& bn) {
  if (bn.op != "BatchNormalization" || bn.inputs.size() != 5 || bn.outputs.empty() ||
      bn.outputs[0] == kNoValue)
    return {};
  // The reference's rule for training mode: the attribute from opset 14, the output count before.
  const bool latest = bn.opset == 0 || bn.opset >= 14;
  if (latest ? bn.attrs.get_int("training_mode", 0) != 0 : bn.outputs.size() > 1) return {};
  for (size_t k = 1; k < bn.outputs.size(); ++k)
    if (bn.outputs[k] != kNoValue) return {};
  if (bn.attrs.get_int("spatial", 1) == 0) return {};
  std::vector<std::vector<double>> p;
  for (size_t k = 1; k <= 4; ++k) {
    const Tensor* t = constant(g, bn.inputs[k]);
    if (!t || !is_floating(t->dtype()) || t->rank() != 1) return {};
    p.push_back(to_doubles(*t));
    if (p.back().size() != p[0].size()) return {};
  }
  const double eps = bn.attrs.get_float("epsilon", 1e-5);
  BnAffine a;
  a.scale.resize(p[0].size());
  for (size_t c = 0; c < p[0].size(); ++c) a.scale[c] = p[0][c] / std::sqrt(p[3][c] + eps);
  a.shift = p[1];
  a.mean = p[2];
  return a;
}

bool takes_reduced_products(const Graph& g, const Node& n) {
  if (!n.domain.empty() || !params::has_precision_attr(n.op) || n.inputs.size() < 2) return false;
  if (n.op != "Conv" || n.attrs.get_int("group", 1) == 1) return true;
  const std::optional<Dims> w = static_dims(g, n.inputs[1]);
  return w && w->size() >= 2 && (*w)[1] > 1;  // not one input channel per group (depthwise)
}

bool machine_has_amx_bf16() {
  const DeviceInfo& d = device_info();
  return d.isa == "avx512" && d.amx_bf16 && d.avx512_bf16 && !ext_turned_off("amx_bf16") &&
         !ext_turned_off("avx512_bf16");
}

bool machine_has_avx512_bf16() {
  const DeviceInfo& d = device_info();
  return d.isa == "avx512" && d.avx512_bf16 && !ext_turned_off("avx512_bf16");
}

void mark_float32_products(Graph& g, const PassContext& ctx, const std::string& setting,
                           const ProductMarking& m) {
  const bool split = setting == "high";
  if (!split && setting != "medium") return;
  const bool fast = split ? machine_has_amx_bf16() : machine_has_avx512_bf16();
  const std::string precision = split ? params::kSplitBf16 : "bf16";
  int marked = 0, kept = 0, few = 0;
  for (Node& n : g.mutable_nodes()) {
    if (!n.domain.empty() || n.inputs.size() < 2 || n.attrs.has("precision") || !m.takes(g, n))
      continue;
    if (dtype_of_value(g, n.inputs[0]) != DType::kF32 ||
        dtype_of_value(g, n.inputs[1]) != DType::kF32)
      continue;
    if (!fast) {
      ++kept;
      continue;
    }
    if (split && !m.pays(g, n)) {
      ++few;
      continue;
    }
    n.attrs.set("precision", precision);
    ++marked;
  }
  if (marked) ctx.note(cat(m.pass, "/", precision, " ", m.what), marked);
  if (few) ctx.note(cat(m.pass, "/float32: ", m.few), few);
  if (kept)
    ctx.note(cat(m.pass, split ? "/float32: no AMX-BF16" : "/float32: no AVX512_BF16"), kept);
}

int remove_unread_shape_arithmetic(Graph& g) {
  std::vector<int> readers = g.use_counts();  // a graph output counts as read
  std::vector<bool> dead(g.nodes().size(), false);
  int removed = 0;
  for (size_t i = g.nodes().size(); i-- > 0;) {
    const Node& n = g.nodes()[i];
    if (n.outputs.size() != 1 || n.outputs[0] == kNoValue || readers[n.outputs[0]] != 0 ||
        !n.domain.empty())
      continue;
    const TensorType& t = g.value(n.outputs[0]).type;
    const bool shape_like =
        n.op == "Shape" || (is_integral(t.dtype) && t.shape && t.shape->size() <= 1);
    if (!shape_like) continue;
    dead[i] = true;
    ++removed;
    for (ValueId v : n.inputs)
      if (v != kNoValue) --readers[v];
  }
  if (removed) g.remove_nodes(dead);
  return removed;
}

}  // namespace pto::passes
