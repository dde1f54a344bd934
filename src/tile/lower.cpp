// Lowering elementwise kernel groups to tile programs.
//
// The nodes are walked in order, each value becoming a virtual register (or an immediate, for
// scalar float32 initializers): a group input is loaded at its first use, an op becomes one or a
// few instructions from the table below (Pow with a constant integer exponent becomes
// square-and-multiply, 0.5 a square root; Softmax a row max, exp and row sum; LayerNorm and
// RMSNorm row sums of the values and of the squared deviations), and the group
// outputs are stored at the end. A last
// step maps the virtual registers onto as few registers as the live values need (a register is
// free after its last read, so an instruction may overwrite its own source). A node without a
// tile form makes the whole group decline, with the reason.
#include "tile/lower.h"

#include <cfloat>
#include <cmath>
#include <functional>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "pto/error.h"
#include "pto/op_registry.h"

namespace pto {
namespace {

// A value inside the program: a virtual register or an immediate.
struct Val {
  int reg = -1;
  float imm = 0.0f;
  bool is_imm() const { return reg < 0; }
};

struct Unsupported {
  std::string why;
};

// The value of a one-element constant of any real dtype, if it is one.
std::optional<double> scalar_constant(const Graph& g, ValueId v) {
  const Tensor* t = g.initializer(v);
  if (!t || t->numel() != 1) return std::nullopt;
  switch (t->dtype()) {
    case DType::kF32:
      return *t->data<float>();
    case DType::kF64:
      return *t->data<double>();
    case DType::kBF16:
      return static_cast<float>(*t->data<BFloat16>());
    case DType::kF16:
      return Float16::to_float(t->data<Float16>()->bits);
    case DType::kI32:
      return *t->data<int32_t>();
    case DType::kU8:
      return *t->data<uint8_t>();
    case DType::kI8:
      return *t->data<int8_t>();
    case DType::kI64:
      return static_cast<double>(*t->data<int64_t>());
    default:
      return std::nullopt;
  }
}

class Lowering {
 public:
  Lowering(const Graph& g, const KernelGroup& group) : g_(g), group_(group) {}

  // Throws Unsupported.
  TileProgram run(ValueId accumulator, int32_t skip_node) {
    if (group_.outputs.empty()) throw Unsupported{"the group has no outputs"};
    const std::optional<Shape>& shape = g_.value(group_.outputs[0]).type.shape;
    space_ = shape;
    if (accumulator != kNoValue) value(accumulator);  // input 0
    for (int32_t n : group_.nodes) {
      if (n == skip_node) continue;
      lower(g_.nodes()[static_cast<size_t>(n)]);
    }
    if (!shape)
      throw Unsupported{cat("output '", g_.value(group_.outputs[0]).name, "' has no shape")};
    for (ValueId v : group_.outputs) {
      const Value& val = g_.value(v);
      if (!val.type.shape || *val.type.shape != *shape)
        throw Unsupported{cat("outputs '", g_.value(group_.outputs[0]).name, "' ",
                              shape_str(*shape), " and '", val.name, "' ",
                              val.type.shape ? shape_str(*val.type.shape) : "[*]",
                              " differ in shape")};
      if (!env_.count(v))
        throw Unsupported{cat("output '", val.name, "' is not computed in the group")};
      prog_.outputs.push_back({v, val.name, dtype_of_value(v), val.type.shape});
      TileInstr st{.op = TileOpcode::kStore, .a = static_cast<int16_t>(reg(env_.at(v)))};
      st.operand = static_cast<int32_t>(prog_.outputs.size() - 1);
      code_.push_back(st);
    }
    prog_.shape = shape;
    allocate_registers();
    return std::move(prog_);
  }

 private:
  TileDType dtype_of_value(ValueId v) const {
    const Value& val = g_.value(v);
    const DType d = val.type.dtype;
    if (is_real(d) || d == DType::kBool || d == DType::kU8 || d == DType::kI8)
      return *tile_dtype_of(d);
    throw Unsupported{cat("value '", val.name, "' is ", dtype_name(d),
                          ", tile programs take f32, bf16, f16, u8, i8 and bool")};
  }

  // The float dtypes registers compute: f32, and the halves widened exactly on load.
  static bool is_real(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

  // The program value of a graph value: computed, an immediate, or a load of a new input.
  Val value(ValueId v) {
    if (auto it = env_.find(v); it != env_.end()) return it->second;
    if (is_real(g_.value(v).type.dtype))
      if (std::optional<double> c = scalar_constant(g_, v))
        return env_[v] = Val{.imm = static_cast<float>(*c)};
    return env_[v] = load(v, dtype_of_value(v));
  }

  // A new input of the program holding v, read as `dt`.
  Val load(ValueId v, TileDType dt) {
    const Value& val = g_.value(v);
    prog_.inputs.push_back({v, val.name, dt, val.type.shape});
    Val r{.reg = fresh()};
    TileInstr ld{.op = TileOpcode::kLoad, .dst = static_cast<int16_t>(r.reg)};
    ld.operand = static_cast<int32_t>(prog_.inputs.size() - 1);
    code_.push_back(ld);
    return r;
  }

  // Instructions name virtual registers in int16_t: a group of 131072 Relus overflowed them
  // and corrupted memory; past the limit the group is not one tile program.
  int fresh() {
    if (next_reg_ == std::numeric_limits<int16_t>::max())
      throw Unsupported{cat("more than ", next_reg_, " values in one tile program")};
    return next_reg_++;
  }

  // A register holding v (an immediate is materialized).
  int reg(Val v) {
    if (!v.is_imm()) return v.reg;
    return emit({.op = TileOpcode::kConst, .imm0 = v.imm}).reg;
  }

  Val emit(TileInstr in) {
    in.dst = static_cast<int16_t>(fresh());
    code_.push_back(in);
    return Val{.reg = in.dst};
  }

  Val unary(TileUnary op, Val x, float p0 = 0.0f, float p1 = 0.0f) {
    return emit({.op = TileOpcode::kUnary,
                 .fn = static_cast<uint8_t>(op),
                 .a = static_cast<int16_t>(reg(x)),
                 .imm0 = p0,
                 .imm1 = p1});
  }

  Val binary(TileBinary op, Val a, Val b) {
    TileInstr in{.op = TileOpcode::kBinary, .fn = static_cast<uint8_t>(op)};
    if (a.is_imm() && !b.is_imm()) {
      in.op = TileOpcode::kBinaryImm, in.imm_left = true, in.a = static_cast<int16_t>(b.reg);
      in.imm0 = a.imm;
    } else if (b.is_imm()) {
      in.op = TileOpcode::kBinaryImm, in.a = static_cast<int16_t>(reg(a)), in.imm0 = b.imm;
    } else {
      in.a = static_cast<int16_t>(a.reg), in.b = static_cast<int16_t>(b.reg);
    }
    return emit(in);
  }

  Val compare(TileCompare op, Val a, Val b) {
    TileInstr in{.op = TileOpcode::kCompare, .fn = static_cast<uint8_t>(op)};
    if (a.is_imm() && !b.is_imm()) {
      in.op = TileOpcode::kCompareImm, in.imm_left = true, in.a = static_cast<int16_t>(b.reg);
      in.imm0 = a.imm;
    } else if (b.is_imm()) {
      in.op = TileOpcode::kCompareImm, in.a = static_cast<int16_t>(reg(a)), in.imm0 = b.imm;
    } else {
      in.a = static_cast<int16_t>(a.reg), in.b = static_cast<int16_t>(b.reg);
    }
    return emit(in);
  }

  Val select(Val c, Val a, Val b) {
    return emit({.op = TileOpcode::kSelect,
                 .a = static_cast<int16_t>(reg(c)),
                 .b = static_cast<int16_t>(reg(a)),
                 .c = static_cast<int16_t>(reg(b))});
  }

  // x^n by square-and-multiply (left to right), 1 / x^-n for negative n.
  Val power(Val x, int64_t n) {
    if (n == 0) return Val{.imm = 1.0f};
    uint64_t e = static_cast<uint64_t>(n < 0 ? -n : n);
    int top = 63;
    while (!((e >> top) & 1)) --top;
    Val r = x;
    for (int bit = top - 1; bit >= 0; --bit) {
      r = binary(TileBinary::kMul, r, r);
      if ((e >> bit) & 1) r = binary(TileBinary::kMul, r, x);
    }
    return n < 0 ? unary(TileUnary::kReciprocal, r) : r;
  }

  void require_float(const Node& n, size_t i) {
    if (!is_real(g_.value(n.inputs[i]).type.dtype))
      throw Unsupported{cat(n.where(), ": input ", i, " is ",
                            dtype_name(g_.value(n.inputs[i]).type.dtype),
                            ", expected f32, bf16 or f16")};
  }

  // Whether n's result is one of its inputs' values, unchanged (so already of the output's dtype
  // when every real input has it): no rounding to a half output is needed.
  bool passes_values_through(const Node& n) const {
    static const std::unordered_set<std::string> kSelecting = {"Identity", "Relu", "Neg",  "Abs",
                                                               "Max",      "Min",  "Where"};
    const DType out = g_.value(n.outputs[0]).type.dtype;
    bool same = true;
    for (ValueId v : n.inputs)
      if (v != kNoValue && is_real(g_.value(v).type.dtype))
        same = same && g_.value(v).type.dtype == out;
    return same && (kSelecting.count(n.op) || n.op == "Cast");
  }

  void lower(const Node& n) {
    if (!n.def || !(n.def->is_elementwise() || n.def->is_reduction()))
      throw Unsupported{cat(n.where(), ": not an elementwise op")};
    if (n.outputs.size() != 1) throw Unsupported{cat(n.where(), ": more than one output")};
    if (n.opset > 0 && n.opset < 7 && n.attrs.has("axis"))
      throw Unsupported{cat(n.where(), ": legacy broadcast with axis")};
    const TileDType dt = dtype_of_value(n.outputs[0]);
    std::optional<Val> out = lower_op(n);
    if (!out) throw Unsupported{cat(n.where(), ": no tile form of ", n.op)};
    // A half result is the float one rounded, as the reference computes it: the registers then
    // hold exactly what a load of the stored value gives back.
    if ((dt == TileDType::kBF16 || dt == TileDType::kF16) && !passes_values_through(n))
      out = unary(dt == TileDType::kBF16 ? TileUnary::kRoundBf16 : TileUnary::kRoundF16, *out);
    env_[n.outputs[0]] = *out;
  }

  Val in(const Node& n, size_t i) {
    if (i >= n.inputs.size() || n.inputs[i] == kNoValue)
      throw Unsupported{cat(n.where(), ": input ", i, " is missing")};
    return value(n.inputs[i]);
  }

  float attr(const Node& n, const char* name, float fallback) {
    return static_cast<float>(n.attrs.get_float(name, fallback));
  }

  std::optional<Val> lower_op(const Node& n) {
    const std::string& op = n.op;
    using enum TileUnary;
    static const std::unordered_map<std::string, TileUnary> kPlain = {{"Abs", kAbs},
                                                                      {"Neg", kNeg},
                                                                      {"Exp", kExp},
                                                                      {"Log", kLog},
                                                                      {"Sqrt", kSqrt},
                                                                      {"Reciprocal", kReciprocal},
                                                                      {"Floor", kFloor},
                                                                      {"Ceil", kCeil},
                                                                      {"Round", kRound},
                                                                      {"Sign", kSign},
                                                                      {"Erf", kErf},
                                                                      {"Sin", kSin},
                                                                      {"Cos", kCos},
                                                                      {"Relu", kRelu},
                                                                      {"Sigmoid", kSigmoid},
                                                                      {"Tanh", kTanh},
                                                                      {"Softplus", kSoftplus},
                                                                      {"Softsign", kSoftsign},
                                                                      {"HardSwish", kHardSwish},
                                                                      {"Mish", kMish}};
    if (auto it = kPlain.find(op); it != kPlain.end()) {
      require_float(n, 0);
      return unary(it->second, in(n, 0));
    }
    if (op == "Identity") return in(n, 0);
    if (op == "LeakyRelu") return unary(kLeakyRelu, float_in(n, 0), attr(n, "alpha", 0.01f));
    if (op == "ThresholdedRelu")
      return unary(kThresholdedRelu, float_in(n, 0), attr(n, "alpha", 1.0f));
    if (op == "Elu") return unary(kElu, float_in(n, 0), attr(n, "alpha", 1.0f));
    if (op == "Celu") {
      if (attr(n, "alpha", 1.0f) == 0.0f) return std::nullopt;
      return unary(kCelu, float_in(n, 0), attr(n, "alpha", 1.0f));
    }
    if (op == "Selu")
      return unary(kSelu, float_in(n, 0), attr(n, "alpha", 1.67326319217681884765625f),
                   attr(n, "gamma", 1.05070102214813232421875f));
    if (op == "HardSigmoid")
      return unary(kHardSigmoid, float_in(n, 0), attr(n, "alpha", 0.2f), attr(n, "beta", 0.5f));
    if (op == "Swish") return unary(kSwish, float_in(n, 0), attr(n, "alpha", 1.0f));
    if (op == "SwiGLU") {  // a * sigmoid(alpha a) * b, a and b of one shape (no broadcasting)
      const TensorType &ta = g_.value(n.inputs[0]).type, &tb = g_.value(n.inputs[1]).type;
      if (!ta.shape || !tb.shape || !is_static(*ta.shape) || !is_static(*tb.shape) ||
          to_dims(*ta.shape) != to_dims(*tb.shape))
        return std::nullopt;
      return binary(TileBinary::kMul, unary(kSwish, float_in(n, 0), attr(n, "alpha", 1.0f)),
                    float_in(n, 1));
    }
    if (op == "Shrink")
      return unary(kShrink, float_in(n, 0), attr(n, "lambd", 0.5f), attr(n, "bias", 0.0f));
    if (op == "Gelu") {
      std::string form = n.attrs.get_string("approximate", "none");
      if (form != "none" && form != "tanh") return std::nullopt;
      return unary(form == "tanh" ? kGeluTanh : kGelu, float_in(n, 0));
    }
    if (op == "Not") return unary(kNot, in(n, 0));
    if (op == "IsNaN") return unary(kIsNaN, float_in(n, 0));
    if (op == "IsInf") {
      if (n.attrs.get_int("detect_negative", 1) != 1 || n.attrs.get_int("detect_positive", 1) != 1)
        return std::nullopt;
      return unary(kIsInf, float_in(n, 0));
    }
    if (op == "Cast") return lower_cast(n);
    if (op == "QuantizeLinear") return lower_quantize(n);
    if (op == "DequantizeLinear") return lower_dequantize(n);
    if (op == "Clip") return lower_clip(n);
    if (op == "Pow") return lower_pow(n);
    if (op == "PRelu") {  // x < 0 ? slope * x : x
      Val x = float_in(n, 0), s = float_in(n, 1);
      return select(compare(TileCompare::kLt, x, Val{.imm = 0.0f}), binary(TileBinary::kMul, s, x),
                    x);
    }
    static const std::unordered_map<std::string, TileBinary> kBinary = {{"Add", TileBinary::kAdd},
                                                                        {"Sub", TileBinary::kSub},
                                                                        {"Mul", TileBinary::kMul},
                                                                        {"Div", TileBinary::kDiv}};
    if (auto it = kBinary.find(op); it != kBinary.end())
      return binary(it->second, float_in(n, 0), float_in(n, 1));
    static const std::unordered_map<std::string, TileBinary> kLogic = {
        {"And", TileBinary::kAnd}, {"Or", TileBinary::kOr}, {"Xor", TileBinary::kXor}};
    if (auto it = kLogic.find(op); it != kLogic.end())
      return binary(it->second, in(n, 0), in(n, 1));
    static const std::unordered_map<std::string, TileCompare> kCompare = {
        {"Equal", TileCompare::kEq},
        {"Less", TileCompare::kLt},
        {"LessOrEqual", TileCompare::kLe},
        {"Greater", TileCompare::kGt},
        {"GreaterOrEqual", TileCompare::kGe}};
    if (auto it = kCompare.find(op); it != kCompare.end()) {
      DType a = g_.value(n.inputs[0]).type.dtype, b = g_.value(n.inputs[1]).type.dtype;
      if (a != b || (!is_real(a) && a != DType::kBool)) return std::nullopt;
      return compare(it->second, in(n, 0), in(n, 1));
    }
    if (op == "Max" || op == "Min" || op == "Sum" || op == "Mean") {
      TileBinary f = op == "Max"   ? TileBinary::kMax
                     : op == "Min" ? TileBinary::kMin
                                   : TileBinary::kAdd;
      Val r = float_in(n, 0);
      for (size_t i = 1; i < n.inputs.size(); ++i) r = binary(f, r, float_in(n, i));
      if (op == "Mean" && n.inputs.size() > 1)
        r = binary(TileBinary::kDiv, r, Val{.imm = static_cast<float>(n.inputs.size())});
      return r;
    }
    if (op == "ReduceSum" || op == "ReduceMax" || op == "ReduceMin" || op == "ReduceMean")
      return lower_reduce(n);
    if (op == "Softmax" || op == "LogSoftmax") {
      Val x = row_input(n, n.attrs.get_int("axis", n.opset > 0 && n.opset < 13 ? 1 : -1));
      Val d = binary(TileBinary::kSub, x, row_reduce(TileReduce::kMax, x));
      Val e = unary(TileUnary::kExp, d), sum = row_reduce(TileReduce::kSum, e);
      if (op == "Softmax") return binary(TileBinary::kDiv, e, sum);
      return binary(TileBinary::kSub, d, unary(TileUnary::kLog, sum));
    }
    if (op == "LayerNormalization" || op == "RMSNormalization") return lower_norm(n);
    if (op == "Where") {
      if (g_.value(n.inputs[0]).type.dtype != DType::kBool) return std::nullopt;
      return select(in(n, 0), in(n, 1), in(n, 2));
    }
    return std::nullopt;
  }

  Val row_reduce(TileReduce fn, Val x) {
    return emit({.op = TileOpcode::kRowReduce,
                 .fn = static_cast<uint8_t>(fn),
                 .a = static_cast<int16_t>(reg(x))});
  }

  // Input 0 of a node reducing along `axis`, which must be the last axis of both the input and
  // the index space (tiles hold whole rows of it).
  Val row_input(const Node& n, int64_t axis) {
    const std::optional<Shape>& s = g_.value(n.inputs[0]).type.shape;
    if (!s || s->empty() || !space_ || space_->empty())
      throw Unsupported{cat(n.where(), ": a row reduction needs known ranks")};
    const int64_t rank = static_cast<int64_t>(s->size());
    if (axis != -1 && axis != rank - 1)
      throw Unsupported{cat(n.where(), ": reduces axis ", axis, ", tiles reduce the last only")};
    if (!(s->back() == space_->back()) || !(s->back().is_known() || s->back().is_symbolic()))
      throw Unsupported{cat(n.where(), ": the reduced axis is not the index space's last")};
    return float_in(n, 0);
  }

  // ReduceSum/Max/Min/Mean over the last axis with keepdims: a row reduction, broadcast back.
  std::optional<Val> lower_reduce(const Node& n) {
    if (n.attrs.get_int("keepdims", 1) != 1) return std::nullopt;
    std::vector<int64_t> axes;
    if (n.attrs.has("axes")) {
      axes = n.attrs.get_ints("axes");
    } else if (n.inputs.size() > 1 && n.inputs[1] != kNoValue) {
      const Tensor* t = g_.initializer(n.inputs[1]);
      if (!t || t->dtype() != DType::kI64) return std::nullopt;
      axes.assign(t->data<int64_t>(), t->data<int64_t>() + t->numel());
    }
    if (axes.size() != 1) return std::nullopt;
    Val x = row_input(n, axes[0]);
    if (n.op == "ReduceMax") return row_reduce(TileReduce::kMax, x);
    if (n.op == "ReduceMin") return row_reduce(TileReduce::kMin, x);
    Val sum = row_reduce(TileReduce::kSum, x);
    if (n.op == "ReduceSum") return sum;
    const Dim& len = g_.value(n.inputs[0]).type.shape->back();
    if (!len.is_known()) return std::nullopt;
    return binary(TileBinary::kDiv, sum, Val{.imm = static_cast<float>(len.value)});
  }

  // LayerNormalization and RMSNormalization over the last axis, as row reductions: the mean, the
  // variance of the deviations (two passes over the row in registers, as stable as the
  // reference's), then (x - mean) * rsqrt(var + eps) * scale + bias; RMS: x * rsqrt(mean(x^2) +
  // eps) * scale. Only the normalized output: the optional mean and inverse-deviation outputs of
  // LayerNormalization decline.
  std::optional<Val> lower_norm(const Node& n) {
    for (size_t i = 1; i < n.outputs.size(); ++i)
      if (n.outputs[i] != kNoValue) return std::nullopt;
    if (n.attrs.get_int("stash_type", 1) != 1) return std::nullopt;
    Val x = row_input(n, n.attrs.get_int("axis", -1));
    const Dim& len = g_.value(n.inputs[0]).type.shape->back();
    if (!len.is_known() || len.value == 0) return std::nullopt;
    const Val count{.imm = static_cast<float>(len.value)};
    const Val eps{.imm = static_cast<float>(n.attrs.get_float("epsilon", 1e-5))};
    Val y;
    if (n.op == "LayerNormalization") {
      Val mean = binary(TileBinary::kDiv, row_reduce(TileReduce::kSum, x), count);
      Val d = binary(TileBinary::kSub, x, mean);
      Val var = binary(TileBinary::kDiv,
                       row_reduce(TileReduce::kSum, binary(TileBinary::kMul, d, d)), count);
      y = binary(TileBinary::kMul, d, unary(TileUnary::kRsqrt, binary(TileBinary::kAdd, var, eps)));
    } else {
      Val ms = binary(TileBinary::kDiv,
                      row_reduce(TileReduce::kSum, binary(TileBinary::kMul, x, x)), count);
      y = binary(TileBinary::kMul, x, unary(TileUnary::kRsqrt, binary(TileBinary::kAdd, ms, eps)));
    }
    y = binary(TileBinary::kMul, y, float_in(n, 1));
    if (n.op == "LayerNormalization" && n.inputs.size() > 2 && n.inputs[2] != kNoValue)
      y = binary(TileBinary::kAdd, y, float_in(n, 2));
    return y;
  }

  Val float_in(const Node& n, size_t i) {
    if (i < n.inputs.size() && n.inputs[i] != kNoValue) require_float(n, i);
    return in(n, i);
  }

  // An int32 value as a float input (converted as loaded, once): it is nothing else's operand.
  Val i32_load(ValueId v) {
    if (auto it = i32_loads_.find(v); it != i32_loads_.end()) return it->second;
    return i32_loads_[v] = load(v, TileDType::kI32);
  }

  // Cast among f32, bf16, f16 and bool: bool -> float is the 0/1 already in the register, float
  // -> bool is x != 0 (NaN -> true).
  std::optional<Val> lower_cast(const Node& n) {
    DType from = g_.value(n.inputs[0]).type.dtype, to = g_.value(n.outputs[0]).type.dtype;
    // int32 -> float32 (an integer product's accumulators): an input converted as it is loaded;
    // the int32 value itself is nothing else's operand (other ops reject it).
    if (from == DType::kI32 && to == DType::kF32) return i32_load(n.inputs[0]);
    Val x = in(n, 0);
    // Between f32, bf16 and f16 the value itself (lower() rounds to a half output); bool is 0/1;
    // an 8-bit integer is exact in float.
    const bool int8 = from == DType::kU8 || from == DType::kI8;
    if (from == to || from == DType::kBool || ((is_real(from) || int8) && is_real(to))) return x;
    if (is_real(from) && to == DType::kBool) return compare(TileCompare::kNe, x, Val{.imm = 0.0f});
    return std::nullopt;
  }

  // A per-tensor (one value) or last-axis (a row of the last dimension, which numpy broadcasting
  // lines up) scale or zero point of a Quantize/DequantizeLinear on x: an immediate when it is a
  // constant scalar, else loaded; nullopt for other layouts (per-axis on another axis, blocked).
  std::optional<Val> quant_param(const Node& n, size_t i, float absent) {
    if (i >= n.inputs.size() || n.inputs[i] == kNoValue) return Val{.imm = absent};
    if (n.attr_int("block_size") != 0) return std::nullopt;
    const ValueId p = n.inputs[i];
    if (std::optional<double> c = scalar_constant(g_, p)) return Val{.imm = static_cast<float>(*c)};
    const std::optional<Shape>&ps = g_.value(p).type.shape, &xs = g_.value(n.inputs[0]).type.shape;
    if (!ps || !xs) return std::nullopt;
    bool one = true;
    for (const Dim& d : *ps) one = one && d.is_known() && d.value == 1;
    const auto rank = static_cast<int64_t>(xs->size());
    const int64_t axis = n.attr_int("axis") < 0 ? n.attr_int("axis") + rank : n.attr_int("axis");
    const bool last = ps->size() == 1 && rank > 0 && axis == rank - 1 && (*ps)[0] == xs->back();
    if (!one && !last) return std::nullopt;
    return load(p, dtype_of_value(p));
  }

  // QuantizeLinear to u8/i8 of a float32 x: saturate(round_half_even(x / scale) + zp), NaN -> zp,
  // the reference's formula in its order (float division, then the rounding and the clamp).
  std::optional<Val> lower_quantize(const Node& n) {
    const DType to = g_.value(n.outputs[0]).type.dtype;
    if (g_.value(n.inputs[0]).type.dtype != DType::kF32 || (to != DType::kU8 && to != DType::kI8) ||
        n.attr_int("precision") != 0 || g_.value(n.inputs[1]).type.dtype != DType::kF32)
      return std::nullopt;
    std::optional<Val> scale = quant_param(n, 1, 1.0f), zp = quant_param(n, 2, 0.0f);
    if (!scale || !zp) return std::nullopt;
    Val r = unary(TileUnary::kRound, binary(TileBinary::kDiv, in(n, 0), *scale));
    r = select(unary(TileUnary::kIsNaN, r), Val{.imm = 0.0f}, r);
    const bool u8 = to == DType::kU8;
    if (!zp->is_imm() || zp->imm != 0.0f) r = binary(TileBinary::kAdd, r, *zp);
    return emit({.op = TileOpcode::kClip,
                 .a = static_cast<int16_t>(reg(r)),
                 .imm0 = u8 ? 0.0f : -128.0f,
                 .imm1 = u8 ? 255.0f : 127.0f});
  }

  // DequantizeLinear of u8/i8 (or int32 without a zero point: a bias) to float32:
  // (float(x) - float(zp)) * scale, in float32 as the reference.
  std::optional<Val> lower_dequantize(const Node& n) {
    const DType from = g_.value(n.inputs[0]).type.dtype;
    const bool has_zp = n.inputs.size() > 2 && n.inputs[2] != kNoValue;
    if (g_.value(n.outputs[0]).type.dtype != DType::kF32 ||
        g_.value(n.inputs[1]).type.dtype != DType::kF32 ||
        !(from == DType::kU8 || from == DType::kI8 || (from == DType::kI32 && !has_zp)))
      return std::nullopt;
    std::optional<Val> scale = quant_param(n, 1, 1.0f), zp = quant_param(n, 2, 0.0f);
    if (!scale || !zp) return std::nullopt;
    Val x = from == DType::kI32 ? i32_load(n.inputs[0]) : in(n, 0);
    if (!zp->is_imm() || zp->imm != 0.0f) x = binary(TileBinary::kSub, x, *zp);  // x - 0 is x
    return binary(TileBinary::kMul, x, *scale);
  }

  // Clip: attributes before opset 11 (defaults +-inf), optional scalar inputs from 11 (defaults
  // +-FLT_MAX), as the reference kernel reads them.
  std::optional<Val> lower_clip(const Node& n) {
    float lo, hi;
    if (n.opset > 0 && n.opset < 11) {
      lo = attr(n, "min", -INFINITY), hi = attr(n, "max", INFINITY);
    } else {
      lo = -FLT_MAX, hi = FLT_MAX;
      for (size_t i : {1, 2}) {
        if (i >= n.inputs.size() || n.inputs[i] == kNoValue) continue;
        if (g_.value(n.inputs[i]).type.dtype != DType::kF32) return std::nullopt;
        std::optional<double> c = scalar_constant(g_, n.inputs[i]);
        if (!c) return std::nullopt;
        (i == 1 ? lo : hi) = static_cast<float>(*c);
      }
    }
    return emit({.op = TileOpcode::kClip,
                 .a = static_cast<int16_t>(reg(float_in(n, 0))),
                 .imm0 = lo,
                 .imm1 = hi});
  }

  std::optional<Val> lower_pow(const Node& n) {
    Val x = float_in(n, 0);
    if (std::optional<double> e = scalar_constant(g_, n.inputs[1])) {
      if (*e == std::nearbyint(*e) && std::fabs(*e) <= 32)
        return power(x, static_cast<int64_t>(*e));
      if (*e == 0.5) return unary(TileUnary::kPowHalf, x);
      return binary(TileBinary::kPow, x, Val{.imm = static_cast<float>(*e)});
    }
    return binary(TileBinary::kPow, x, float_in(n, 1));
  }

  // Virtual registers onto physical ones: a register is freed after the last instruction that
  // reads it, so the next destination may reuse it.
  void allocate_registers() {
    std::vector<int> last(static_cast<size_t>(next_reg_), -1);
    for (size_t i = 0; i < code_.size(); ++i)
      for (int r : {code_[i].a, code_[i].b, code_[i].c})
        if (r >= 0) last[static_cast<size_t>(r)] = static_cast<int>(i);
    std::vector<int> phys(static_cast<size_t>(next_reg_), -1);
    std::vector<bool> busy;
    for (size_t i = 0; i < code_.size(); ++i) {
      TileInstr in = code_[i];
      for (int16_t* r : {&in.a, &in.b, &in.c})
        if (*r >= 0) *r = static_cast<int16_t>(phys[static_cast<size_t>(*r)]);
      for (int r : {code_[i].a, code_[i].b, code_[i].c})
        if (r >= 0 && last[static_cast<size_t>(r)] == static_cast<int>(i))
          busy[static_cast<size_t>(phys[static_cast<size_t>(r)])] = false;
      if (in.op != TileOpcode::kStore) {
        size_t p = 0;
        while (p < busy.size() && busy[p]) ++p;
        if (p == busy.size()) busy.push_back(false);
        // A value nobody reads still needs its register for the instruction itself.
        busy[p] = last[static_cast<size_t>(code_[i].dst)] > static_cast<int>(i);
        phys[static_cast<size_t>(code_[i].dst)] = static_cast<int>(p);
        in.dst = static_cast<int16_t>(p);
      }
      prog_.emit(in);
    }
  }

  const Graph& g_;
  const KernelGroup& group_;
  std::optional<Shape> space_;  // the index space: the first output's shape
  TileProgram prog_;
  std::vector<TileInstr> code_;  // on virtual registers
  std::unordered_map<ValueId, Val> env_;
  std::unordered_map<ValueId, Val> i32_loads_;  // int32 inputs loaded for Cast(to=float)
  int next_reg_ = 0;
};

std::optional<TileProgram> lower_with(const Graph& g, const KernelGroup& group, ValueId acc,
                                      int32_t skip, std::string* why_not) {
  try {
    TileProgram p = Lowering(g, group).run(acc, skip);
    if (p.num_regs > 64) throw Unsupported{cat(p.num_regs, " registers needed, at most 64")};
    return p;
  } catch (const Unsupported& u) {
    if (why_not) *why_not = u.why;
    return std::nullopt;
  } catch (const Error& e) {  // a malformed attribute
    if (why_not) *why_not = e.what();
    return std::nullopt;
  }
}

}  // namespace

std::optional<TileProgram> lower_elementwise(const Graph& g, const KernelGroup& group,
                                             std::string* why_not) {
  return lower_with(g, group, kNoValue, -1, why_not);
}

std::optional<TileProgram> lower_epilogue(const Graph& g, const KernelGroup& group,
                                          ValueId accumulator, std::string* why_not) {
  auto fail = [&](std::string why) -> std::optional<TileProgram> {
    if (why_not) *why_not = std::move(why);
    return std::nullopt;
  };
  const int32_t producer = g.value(accumulator).producer;
  bool found = false;
  for (int32_t n : group.nodes) found = found || n == producer;
  if (!found) return fail("the accumulator is not produced in the group");
  for (ValueId v : group.outputs)
    if (v == accumulator) return fail("the accumulator is read outside the group");
  if (group.outputs.size() != 1) return fail("an epilogue writes one output");
  if (g.value(accumulator).type.dtype != DType::kF32) return fail("the accumulator is not f32");
  const Value& out = g.value(group.outputs[0]);
  if (!out.type.shape || !g.value(accumulator).type.shape ||
      *out.type.shape != *g.value(accumulator).type.shape)
    return fail("the output's shape is not the accumulator's");
  std::optional<TileProgram> p = lower_with(g, group, accumulator, producer, why_not);
  if (p && p->has_row_reduction()) return fail("row reductions do not fit a GEMM block");
  if (p && (p->inputs.empty() || p->inputs[0].value != accumulator))
    return fail("the accumulator is not input 0");
  if (p)  // the GEMM reads epilogue operands as float (gemm.h Epilogue)
    for (const TileOperand& o : p->inputs)
      if (o.dtype != TileDType::kF32) return fail(cat("operand '", o.name, "' is not f32"));
  return p;
}

}  // namespace pto
