// Elementwise CPU kernels: float32 unary math and activations, binary arithmetic, comparisons and
// Where with numpy broadcasting, variadic Max/Min/Sum/Mean, Pow, logic on bools, and Cast. The
// integer forms (int64/int32 Add/Sub/Mul/Div/Mod/Max/Min/Neg/Abs/Clip and comparisons, mostly shape
// arithmetic) are scalar loops with the reference's integer semantics (wrapping, Div truncating).
//
// Broadcasting: the output shape's dimensions of size 1 are dropped and adjacent dimensions merged
// wherever every input steps through them alike, leaving rows whose inputs are each either
// contiguous (stride 1) or one repeated value (stride 0). Rows run in parallel in chunks of at
// least kGrain elements, so small tensors stay on one thread. Rows shorter than 64 that one input
// repeats (a per-channel vector times channel-blocked planes, [.., m, 16] * [.., 1, 16]) are
// folded k at a time into rows of k * 16, that input's row laid out k times: one call per 1024
// elements instead of per 16 (EfficientNet-B0's squeeze-excite Muls at level 3 1.51 -> 0.60 ms).
// The vector loops are in elementwise_impl.h; forms not handled here decline in accepts() and run
// on the reference.
#include "backend/cpu/elementwise.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backend/cpu/isa/isa.h"
#include "backend/cpu/kernel.h"
#include "pto/parallel.h"
#include "reference/ops/cast.h"
#include "reference/ops/elementwise_util.h"

namespace pto::cpu {

PTO_ISA_DECLARE(void unary_f32(UnaryOp op, const UnaryParams& p, const float* x, float* y,
                               int64_t n);
                void binary_f32(BinaryOp op, const float* a, int64_t sa, const float* b, int64_t sb,
                                float* y, int64_t n);
                void compare_f32(CompareOp op, const float* a, int64_t sa, const float* b,
                                 int64_t sb, bool* y, int64_t n);
                void where_b32(const bool* c, int64_t sc, const float* a, int64_t sa,
                               const float* b, int64_t sb, float* y, int64_t n);
                int64_t f16_to_f32_vec(const uint16_t* x, float* y, int64_t n);
                int64_t f32_to_f16_vec(const float* x, uint16_t* y, int64_t n);
                int64_t round_to_f16_vec(float* x, int64_t n);
                int64_t bf16_to_f32_vec(const uint16_t* x, float* y, int64_t n);
                int64_t f32_to_bf16_vec(const float* x, uint16_t* y, int64_t n);
                int64_t round_to_bf16_vec(float* x, int64_t n);)

void unary_f32(UnaryOp op, const UnaryParams& p, const float* x, float* y, int64_t n) {
  PTO_ISA_DISPATCH(unary_f32, op, p, x, y, n);
}
void binary_f32(BinaryOp op, const float* a, int64_t sa, const float* b, int64_t sb, float* y,
                int64_t n) {
  PTO_ISA_DISPATCH(binary_f32, op, a, sa, b, sb, y, n);
}
void compare_f32(CompareOp op, const float* a, int64_t sa, const float* b, int64_t sb, bool* y,
                 int64_t n) {
  PTO_ISA_DISPATCH(compare_f32, op, a, sa, b, sb, y, n);
}
void where_b32(const bool* c, int64_t sc, const float* a, int64_t sa, const float* b, int64_t sb,
               float* y, int64_t n) {
  PTO_ISA_DISPATCH(where_b32, c, sc, a, sa, b, sb, y, n);
}

void f16_to_f32(const uint16_t* x, float* y, int64_t n) {
  int64_t i = has_ext(Ext::kF16c) ? PTO_ISA_DISPATCH(f16_to_f32_vec, x, y, n) : 0;
  for (; i < n; ++i) y[i] = Float16::to_float(x[i]);
}
void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = has_ext(Ext::kF16c) ? PTO_ISA_DISPATCH(f32_to_f16_vec, x, y, n) : 0;
  for (; i < n; ++i) y[i] = Float16::from_float(x[i]);
}
void round_to_f16(float* x, int64_t n) {
  int64_t i = has_ext(Ext::kF16c) ? PTO_ISA_DISPATCH(round_to_f16_vec, x, n) : 0;
  for (; i < n; ++i) x[i] = Float16::to_float(Float16::from_float(x[i]));
}

void bf16_to_f32(const uint16_t* x, float* y, int64_t n) {
  int64_t i = PTO_ISA_DISPATCH(bf16_to_f32_vec, x, y, n);
  for (; i < n; ++i) y[i] = std::bit_cast<float>(static_cast<uint32_t>(x[i]) << 16);
}
void f32_to_bf16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = PTO_ISA_DISPATCH(f32_to_bf16_vec, x, y, n);
  for (; i < n; ++i) y[i] = BFloat16::from_float(x[i]);
}
void round_to_bf16(float* x, int64_t n) {
  int64_t i = PTO_ISA_DISPATCH(round_to_bf16_vec, x, n);
  for (; i < n; ++i) x[i] = static_cast<float>(BFloat16(x[i]));
}

namespace {

constexpr int64_t kGrain = 16384;  // elements per parallel chunk at least

// Inputs broadcast to one output shape, as rows: dims_ holds the merged dimensions (the last one
// is the row), strides_[k] input k's element strides through them (0 where it is broadcast).
class Broadcast {
 public:
  Broadcast(const std::vector<const Tensor*>& in, const std::string& where) {
    size_t rank = 0;
    for (const Tensor* t : in) rank = std::max(rank, t->shape().size());
    shape_.assign(rank, 1);
    for (const Tensor* t : in) {
      const Dims& s = t->shape();
      for (size_t d = 0; d < s.size(); ++d) {
        int64_t& o = shape_[rank - s.size() + d];
        if (s[d] == o || s[d] == 1) continue;
        if (o != 1)
          throw ValueError(
              cat(where, ": shapes do not broadcast (", t->str(), " against ", shape_str(), ")"));
        o = s[d];
      }
    }
    strides_.resize(in.size());
    std::vector<std::vector<int64_t>> full(in.size(), std::vector<int64_t>(rank, 0));
    for (size_t k = 0; k < in.size(); ++k) {
      const Dims& s = in[k]->shape();
      int64_t step = 1;
      for (size_t d = s.size(); d-- > 0;) {
        if (s[d] != 1) full[k][rank - s.size() + d] = step;
        step *= s[d];
      }
    }
    for (size_t d = 0; d < rank; ++d) {
      if (shape_[d] == 1) continue;
      bool merge = !dims_.empty();
      for (size_t k = 0; k < in.size() && merge; ++k)
        merge = strides_[k].back() == full[k][d] * shape_[d];
      if (merge) {
        dims_.back() *= shape_[d];
        for (size_t k = 0; k < in.size(); ++k) strides_[k].back() = full[k][d];
      } else {
        dims_.push_back(shape_[d]);
        for (size_t k = 0; k < in.size(); ++k) strides_[k].push_back(full[k][d]);
      }
    }
    if (dims_.empty()) {  // a scalar result
      dims_.push_back(1);
      for (auto& s : strides_) s.push_back(0);
    }
  }

  const Dims& shape() const { return shape_; }
  int64_t row() const { return dims_.back(); }

  // Two inputs, rows shorter than 64 that input `rep` repeats through the dimension out of the
  // row while the other steps through it contiguously (a per-channel vector against channel-
  // blocked planes, [.., m, n] * [.., 1, n]): k whole rows become one (k the largest divisor of
  // m with k n <= 1024), so a row is k n elements, not n, and `rep`'s row is its n values
  // repeated k times (the caller lays those out). Returns rep, or -1 (nothing changed).
  int fold_repeated_rows(int64_t* k_out) {
    if (strides_.size() != 2 || dims_.size() < 2) return -1;
    const size_t last = dims_.size() - 1;
    const int64_t n = dims_[last], m = dims_[last - 1];
    if (n >= 64 || m < 2) return -1;
    for (int rep = 0; rep < 2; ++rep) {
      const std::vector<int64_t>&r = strides_[rep], &o = strides_[1 - rep];
      if (r[last] != 1 || o[last] != 1 || r[last - 1] != 0 || o[last - 1] != n) continue;
      int64_t k = 1;
      for (int64_t d = std::min(m, 1024 / n); d >= 2 && k == 1; --d)
        if (m % d == 0) k = d;
      if (k == 1) return -1;
      dims_[last - 1] = m / k;
      dims_[last] = k * n;
      strides_[1 - rep][last - 1] = k * n;
      *k_out = k;
      return rep;
    }
    return -1;
  }
  // Stride (0 or 1) of input k along a row.
  int64_t row_stride(size_t k) const { return strides_[k].back(); }

  // fn(offsets, out_offset, n) for every row in parallel; offsets[k] is input k's row start.
  template <class F>
  void for_rows(F fn) const {
    int64_t numel = 1;
    for (int64_t d : dims_) numel *= d;
    if (numel == 0) return;
    const int64_t n = row(), rows = numel / n;
    const size_t outer = dims_.size() - 1, inputs = strides_.size();
    parallel_for(0, rows, std::max<int64_t>(1, kGrain / n), [&](int64_t begin, int64_t end) {
      std::vector<int64_t> idx(outer), off(inputs, 0);
      for (size_t d = outer, r = static_cast<size_t>(begin); d-- > 0;) {
        idx[d] = static_cast<int64_t>(r) % dims_[d];
        r /= static_cast<size_t>(dims_[d]);
        for (size_t k = 0; k < inputs; ++k) off[k] += idx[d] * strides_[k][d];
      }
      for (int64_t r = begin; r < end; ++r) {
        fn(off.data(), r * n, n);
        for (size_t d = outer; d-- > 0;) {  // next row: an odometer over the outer dimensions
          for (size_t k = 0; k < inputs; ++k) off[k] += strides_[k][d];
          if (++idx[d] < dims_[d]) break;
          for (size_t k = 0; k < inputs; ++k) off[k] -= dims_[d] * strides_[k][d];
          idx[d] = 0;
        }
      }
    });
  }

 private:
  std::string shape_str() const {
    std::string s = "[";
    for (size_t d = 0; d < shape_.size(); ++d) s += (d ? ", " : "") + std::to_string(shape_[d]);
    return s + "]";
  }
  Dims shape_;
  std::vector<int64_t> dims_;
  std::vector<std::vector<int64_t>> strides_;
};

std::vector<const Tensor*> all_inputs(const KernelContext& c) {
  std::vector<const Tensor*> in;
  for (size_t i = 0; i < c.inputs.size(); ++i) in.push_back(&c.input(i));
  return in;
}

// Calls f.template operator()<T>() with T the C++ type of dt, if it is one of Ts; false if not.
template <class... Ts, class F>
bool with_type(DType dt, F&& f) {
  return ((dt == dtype_of<Ts> && (f.template operator()<Ts>(), true)) || ...);
}

template <class... Ts>
bool is_one_of(DType dt) {
  return ((dt == dtype_of<Ts>) || ...);
}

bool all_dtype(const NodeInfo& info, DType dt) {
  if (info.inputs.empty()) return false;
  for (size_t i = 0; i < info.inputs.size(); ++i)
    if (info.dtype(i) != dt) return false;
  return true;
}

// Opset 1-6 broadcasting with `axis` aligns B with the middle of A: left to the reference.
bool legacy_broadcast(const NodeInfo& info) {
  return info.node.opset > 0 && info.node.opset < 7 && info.node.attrs.has("axis");
}

// ---- unary ----

using ParamsFn = UnaryParams (*)(const Node&);

UnaryParams no_params(const Node&) {
  return {};
}

void map_unary(UnaryOp op, const UnaryParams& p, const Tensor& x, Tensor& y) {
  const float* in = x.data<float>();
  float* out = y.data<float>();
  parallel_for(0, x.numel(), kGrain,
               [&](int64_t b, int64_t e) { unary_f32(op, p, in + b, out + b, e - b); });
}

Kernel unary_kernel(UnaryOp op, ParamsFn params = no_params,
                    bool (*extra)(const NodeInfo&) = nullptr) {
  return {.accepts =
              [extra](const NodeInfo& info) {
                return info.inputs.size() == 1 && info.dtype(0) == DType::kF32 &&
                       (!extra || extra(info));
              },
          .run =
              [op, params](const KernelContext& c) {
                const Tensor& x = c.input(0);
                Tensor y = Tensor::empty(DType::kF32, x.shape());
                map_unary(op, params(c.node), x, y);
                return std::vector<Tensor>{y};
              }};
}

// Kernel k, extended to inputs of the types Ts, where y[i] = f(x[i]) element by element.
template <class... Ts, class F>
Kernel with_typed_unary(Kernel k, F f) {
  return {.accepts =
              [accepts = k.accepts](const NodeInfo& info) {
                return (info.inputs.size() == 1 && is_one_of<Ts...>(info.dtype(0))) ||
                       (accepts && accepts(info));
              },
          .run =
              [run = k.run, f](const KernelContext& c) {
                const Tensor& x = c.input(0);
                if (!is_one_of<Ts...>(x.dtype())) return run(c);
                Tensor y = Tensor::empty(x.dtype(), x.shape());
                with_type<Ts...>(x.dtype(), [&]<class T>() {
                  const T* in = x.data<T>();
                  T* out = y.data<T>();
                  parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) {
                    for (int64_t i = b; i < e; ++i) out[i] = f(in[i]);
                  });
                });
                return std::vector<Tensor>{y};
              }};
}

// An activation's float attribute, or its default from the op's schema.
float attr(const Node& n, const char* name) {
  return static_cast<float>(n.attr_float(name));
}

bool gelu_form_known(const NodeInfo& info) {
  std::string s = info.node.attr_string("approximate");
  return s == "none" || s == "tanh";
}

// Clip: float attributes before opset 11, optional scalar inputs from 11 (reference clip()).
// Clip of int64 or int32 x by scalar bounds of its type (opset 11 on; LayoutLMv3's clamped box
// differences): min(max(x, lo), hi), as the reference.
std::vector<Tensor> clip_integers(const KernelContext& c) {
  const Tensor& x = c.input(0);
  Tensor y = Tensor::empty(x.dtype(), x.shape());
  with_type<int64_t, int32_t>(x.dtype(), [&]<class T>() {
    T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
    if (c.has_input(1)) lo = c.input(1).data<T>()[0];
    if (c.has_input(2)) hi = c.input(2).data<T>()[0];
    const T* in = x.data<T>();
    T* out = y.data<T>();
    parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = std::min(std::max(in[i], lo), hi);
    });
  });
  return one(std::move(y));
}

Kernel clip_kernel() {
  auto attrs_form = [](const Node& n) { return n.opset > 0 && n.opset < 11; };
  return {
      .accepts =
          [attrs_form](const NodeInfo& info) {
            if (info.inputs.size() > 3) return false;
            const DType t = info.dtype(0);
            if (t == DType::kI64 || t == DType::kI32) {  // scalar bounds of x's type
              if (attrs_form(info.node)) return false;
              for (size_t i = 1; i < info.inputs.size(); ++i) {
                if (info.dtype(i) == DType::kUndefined) continue;  // an omitted bound
                if (info.dtype(i) != t || !info.inputs[i].shape || info.inputs[i].shape->size() > 1)
                  return false;
              }
              return true;
            }
            if (t != DType::kF32) return false;
            if (attrs_form(info.node)) return true;
            for (size_t i = 1; i < info.inputs.size(); ++i)
              if (info.dtype(i) != DType::kF32 && info.dtype(i) != DType::kUndefined) return false;
            return true;
          },
      .run =
          [attrs_form](const KernelContext& c) {
            if (c.input(0).dtype() != DType::kF32) {
              for (size_t i : {1, 2})
                if (c.has_input(i) && c.input(i).numel() != 1)
                  return run_reference(c);  // its error message
              return clip_integers(c);
            }
            UnaryParams p{-std::numeric_limits<float>::max(), std::numeric_limits<float>::max()};
            if (attrs_form(c.node)) {
              p = {static_cast<float>(c.attrs().get_float("min", -INFINITY)),
                   static_cast<float>(c.attrs().get_float("max", INFINITY))};
            } else {
              for (size_t i : {1, 2}) {
                if (!c.has_input(i)) continue;
                if (c.input(i).numel() != 1) return run_reference(c);  // its error message
                (i == 1 ? p.a : p.b) = c.input(i).data<float>()[0];
              }
            }
            Tensor y = Tensor::empty(DType::kF32, c.input(0).shape());
            map_unary(UnaryOp::kClip, p, c.input(0), y);
            return std::vector<Tensor>{y};
          }};
}

void register_unary(KernelRegistry& r) {
  using enum UnaryOp;
  for (auto [name, op] : {std::pair{"Relu", kRelu},
                          {"Sigmoid", kSigmoid},
                          {"Tanh", kTanh},
                          {"Exp", kExp},
                          {"Log", kLog},
                          {"Erf", kErf},
                          {"Sin", kSin},
                          {"Cos", kCos},
                          {"Atan", kAtan},
                          {"Sqrt", kSqrt},
                          {"Reciprocal", kReciprocal},
                          {"Sign", kSign},
                          {"Floor", kFloor},
                          {"Ceil", kCeil},
                          {"Round", kRound},
                          {"HardSwish", kHardSwish},
                          {"Softplus", kSoftplus},
                          {"Softsign", kSoftsign},
                          {"Mish", kMish}})
    r.add(name, unary_kernel(op));
  r.add("LeakyRelu",
        unary_kernel(kLeakyRelu, [](const Node& a) { return UnaryParams{attr(a, "alpha")}; }));
  r.add("ThresholdedRelu", unary_kernel(kThresholdedRelu, [](const Node& a) {
          return UnaryParams{attr(a, "alpha")};
        }));
  r.add("Elu", unary_kernel(kElu, [](const Node& a) { return UnaryParams{attr(a, "alpha")}; }));
  r.add("Celu", unary_kernel(
                    kCelu, [](const Node& a) { return UnaryParams{attr(a, "alpha")}; },
                    [](const NodeInfo& info) { return info.node.attr_float("alpha") != 0; }));
  r.add("Selu", unary_kernel(kSelu, [](const Node& a) {
          return UnaryParams{attr(a, "alpha"), attr(a, "gamma")};
        }));
  r.add("HardSigmoid", unary_kernel(kHardSigmoid, [](const Node& a) {
          return UnaryParams{attr(a, "alpha"), attr(a, "beta")};
        }));
  r.add("Swish", unary_kernel(kSwish, [](const Node& a) { return UnaryParams{attr(a, "alpha")}; }));
  // SwiGLU(a, b) = swish(a) * b (one shape; others go to the reference for its error), in
  // cache-sized chunks: the swish into y, then y *= b.
  r.add("SwiGLU", {.accepts =
                       [](const NodeInfo& info) {
                         return info.inputs.size() == 2 && info.dtype(0) == DType::kF32 &&
                                info.dtype(1) == DType::kF32;
                       },
                   .run =
                       [](const KernelContext& c) {
                         const Tensor &a = c.input(0), &b = c.input(1);
                         if (a.shape() != b.shape()) return run_reference(c);
                         const UnaryParams p{attr(c.node, "alpha")};
                         Tensor y = Tensor::empty(DType::kF32, a.shape());
                         const float *pa = a.data<float>(), *pb = b.data<float>();
                         float* py = y.data<float>();
                         parallel_for(0, a.numel(), kGrain, [&](int64_t s, int64_t e) {
                           for (int64_t i = s; i < e; i += 4096) {
                             const int64_t n = std::min<int64_t>(4096, e - i);
                             unary_f32(kSwish, p, pa + i, py + i, n);
                             binary_f32(BinaryOp::kMul, py + i, 1, pb + i, 1, py + i, n);
                           }
                         });
                         return one(std::move(y));
                       },
                   .reference_at_run_time = true});
  r.add("Shrink", unary_kernel(kShrink, [](const Node& a) {
          return UnaryParams{attr(a, "lambd"), attr(a, "bias")};
        }));
  // Trigonometric and hyperbolic functions without a vector form: the C library's float
  // functions element by element (within an ulp of the reference's double ones).
  r.add("Tan", with_typed_unary<float>({}, [](float x) { return std::tan(x); }));
  r.add("Asin", with_typed_unary<float>({}, [](float x) { return std::asin(x); }));
  r.add("Acos", with_typed_unary<float>({}, [](float x) { return std::acos(x); }));
  r.add("Sinh", with_typed_unary<float>({}, [](float x) { return std::sinh(x); }));
  r.add("Cosh", with_typed_unary<float>({}, [](float x) { return std::cosh(x); }));
  r.add("Asinh", with_typed_unary<float>({}, [](float x) { return std::asinh(x); }));
  r.add("Acosh", with_typed_unary<float>({}, [](float x) { return std::acosh(x); }));
  r.add("Atanh", with_typed_unary<float>({}, [](float x) { return std::atanh(x); }));
  r.add("Gelu", {.accepts =
                     [](const NodeInfo& info) {
                       return info.inputs.size() == 1 && info.dtype(0) == DType::kF32 &&
                              gelu_form_known(info);
                     },
                 .run =
                     [](const KernelContext& c) {
                       bool tanh = c.node.attr_string("approximate") == "tanh";
                       const Tensor& x = c.input(0);
                       Tensor y = Tensor::empty(DType::kF32, x.shape());
                       map_unary(tanh ? kGeluTanh : kGelu, {}, x, y);
                       return std::vector<Tensor>{y};
                     }});
  r.add("Clip", clip_kernel());
  r.add("Neg", with_typed_unary<int64_t, int32_t>(unary_kernel(kNeg),
                                                  [](auto x) { return reference::wrap_neg(x); }));
  r.add("Abs", with_typed_unary<int64_t, int32_t>(unary_kernel(kAbs),
                                                  [](auto x) { return reference::abs_value(x); }));
  r.add("Not", with_typed_unary<bool>({}, [](bool x) { return !x; }));
}

// ---- binary, variadic, comparisons, Where, logic ----

// y[i] = f(a[i * sa], b[i * sb]) with the strides 0 or 1 known to the compiler, so that the
// common integer ops vectorize.
template <class T, class O, class F>
void scalar_row(F f, const T* a, int64_t sa, const T* b, int64_t sb, O* y, int64_t n) {
  if (sa && sb) {
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
  } else if (sa) {
    const T v = b[0];
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], v);
  } else if (sb) {
    const T v = a[0];
    for (int64_t i = 0; i < n; ++i) y[i] = f(v, b[i]);
  } else {
    const O v = f(a[0], b[0]);
    for (int64_t i = 0; i < n; ++i) y[i] = v;
  }
}

// A BinaryOp on integers, with the reference's semantics (reference/ops/elementwise_util.h):
// wrapping Add/Sub/Mul, Div truncating toward zero with x / 0 = 0.
template <class T>
void binary_row(BinaryOp op, const T* a, int64_t sa, const T* b, int64_t sb, T* y, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    binary_f32(op, a, sa, b, sb, y, n);
  } else {
    using namespace reference;
    auto row = [&](auto f) { scalar_row(f, a, sa, b, sb, y, n); };
    switch (op) {
      case BinaryOp::kAdd:
        return row([](T u, T v) { return wrap_add(u, v); });
      case BinaryOp::kSub:
        return row([](T u, T v) { return wrap_sub(u, v); });
      case BinaryOp::kMul:
        return row([](T u, T v) { return wrap_mul(u, v); });
      case BinaryOp::kDiv:
        return row([](T u, T v) { return int_div(u, v); });
      case BinaryOp::kMax:
        return row([](T u, T v) { return std::max(u, v); });
      case BinaryOp::kMin:
        return row([](T u, T v) { return std::min(u, v); });
    }
  }
}

template <class T>
void compare_row(CompareOp op, const T* a, int64_t sa, const T* b, int64_t sb, bool* y, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    compare_f32(op, a, sa, b, sb, y, n);
  } else {
    auto row = [&](auto f) { scalar_row(f, a, sa, b, sb, y, n); };
    switch (op) {
      case CompareOp::kEqual:
        return row(std::equal_to<T>());
      case CompareOp::kLess:
        return row(std::less<T>());
      case CompareOp::kLessOrEqual:
        return row(std::less_equal<T>());
      case CompareOp::kGreater:
        return row(std::greater<T>());
      case CompareOp::kGreaterOrEqual:
        return row(std::greater_equal<T>());
    }
  }
}

// Two inputs of one dtype among Ts, broadcast as in opset 7+.
template <class... Ts>
bool broadcast_accepts(const NodeInfo& info) {
  return info.inputs.size() == 2 && info.dtype(0) == info.dtype(1) &&
         is_one_of<Ts...>(info.dtype(0)) && !legacy_broadcast(info);
}

// Runs a node on two broadcast inputs of one dtype among Ts, writing a tensor of Out (void: the
// inputs' type) row by row: row(a, sa, b, sb, out, n) with input strides 0 or 1, generic over the
// element type.
template <class Out, class... Ts, class Row>
std::vector<Tensor> broadcast_run(const KernelContext& c, const Row& row) {
  const Tensor &a = c.input(0), &b = c.input(1);
  Broadcast bc({&a, &b}, c.where());
  Tensor y;
  with_type<Ts...>(a.dtype(), [&]<class T>() {
    using O = std::conditional_t<std::is_void_v<Out>, T, Out>;
    y = Tensor::empty(dtype_of<O>, bc.shape());
    const T *pa = a.data<T>(), *pb = b.data<T>();
    O* po = y.data<O>();
    const int64_t sa = bc.row_stride(0), sb = bc.row_stride(1), n = bc.row();
    int64_t k = 1;
    // (Per-channel vectors are small: the laid-out copy stays under a few MiB.)
    const int rep = !std::is_same_v<T, bool> && std::min(a.numel(), b.numel()) <= 4096
                        ? bc.fold_repeated_rows(&k)
                        : -1;
    if constexpr (!std::is_same_v<T, bool>) {
      if (rep >= 0) {
        // Each of the repeating input's rows of n laid out k times, so that a row of k n
        // elements reads it contiguously.
        const T* src = rep == 0 ? pa : pb;
        const int64_t count = (rep == 0 ? a : b).numel() / n;
        std::vector<T> wide(static_cast<size_t>(count * k * n));
        for (int64_t i = 0; i < count; ++i)
          for (int64_t j = 0; j < k; ++j)
            std::copy(src + i * n, src + (i + 1) * n, &wide[(i * k + j) * n]);
        bc.for_rows([&](const int64_t* off, int64_t o, int64_t len) {
          const T* w = wide.data() + off[rep] / n * (k * n);
          if (rep == 0)
            row(w, 1, pb + off[1], 1, po + o, len);
          else
            row(pa + off[0], 1, w, 1, po + o, len);
        });
        return;
      }
    }
    bc.for_rows([&](const int64_t* off, int64_t o, int64_t len) {
      row(pa + off[0], sa, pb + off[1], sb, po + o, len);
    });
  });
  return one(std::move(y));
}

template <class Out, class... Ts, class Row>
Kernel broadcast_kernel(Row row) {
  return {.accepts = broadcast_accepts<Ts...>,
          .run = [row](const KernelContext& c) { return broadcast_run<Out, Ts...>(c, row); }};
}

// Add, Sub, Mul, Div: float32 vectorized, int64 and int32 as the reference computes them.
Kernel binary_kernel(BinaryOp op) {
  return broadcast_kernel<void, float, int64_t, int32_t>(
      [op](const auto* a, int64_t sa, const auto* b, int64_t sb, auto* y, int64_t n) {
        binary_row(op, a, sa, b, sb, y, n);
      });
}

// Mod on float32, int64 and int32 with the reference's values for fmod 0 and 1.
Kernel mod_kernel() {
  return {.accepts =
              [](const NodeInfo& info) {
                const int64_t fmod = info.node.attr_int("fmod");
                return (fmod == 0 || fmod == 1) && broadcast_accepts<float, int64_t, int32_t>(info);
              },
          .run =
              [](const KernelContext& c) {
                auto mod = [c_style = c.node.attr_int("fmod") == 1](auto u, auto v) {
                  return reference::mod_value(u, v, c_style);
                };
                return broadcast_run<void, float, int64_t, int32_t>(
                    c, [&](const auto* a, int64_t sa, const auto* b, int64_t sb, auto* y,
                           int64_t n) { scalar_row(mod, a, sa, b, sb, y, n); });
              }};
}

// Max/Min over 1..N inputs: folded in input order, as the reference does, row by row.
Kernel fold_kernel(BinaryOp op) {
  return {.accepts =
              [](const NodeInfo& info) {
                return is_one_of<float, int64_t, int32_t>(info.dtype(0)) &&
                       all_dtype(info, info.dtype(0));
              },
          .run =
              [op](const KernelContext& c) {
                std::vector<const Tensor*> in = all_inputs(c);
                Broadcast bc(in, c.where());
                Tensor y = Tensor::empty(in[0]->dtype(), bc.shape());
                with_type<float, int64_t, int32_t>(y.dtype(), [&]<class T>() {
                  T* po = y.data<T>();
                  bc.for_rows([&](const int64_t* off, int64_t o, int64_t n) {
                    if (in.size() == 1) {
                      std::memcpy(po + o, in[0]->data<T>() + off[0], sizeof(T) * n);
                      return;
                    }
                    binary_row(op, in[0]->data<T>() + off[0], bc.row_stride(0),
                               in[1]->data<T>() + off[1], bc.row_stride(1), po + o, n);
                    for (size_t k = 2; k < in.size(); ++k)
                      binary_row(op, po + o, 1, in[k]->data<T>() + off[k], bc.row_stride(k), po + o,
                                 n);
                  });
                });
                return std::vector<Tensor>{y};
              }};
}

// Sum/Mean of 3+ inputs (and Mean of 2): accumulated in double and rounded once, as the
// reference does. Sum of 2 is Add; of 1, a copy.
Kernel sum_kernel(bool mean) {
  return {.accepts = [](const NodeInfo& info) { return all_dtype(info, DType::kF32); },
          .run =
              [mean](const KernelContext& c) {
                std::vector<const Tensor*> in = all_inputs(c);
                Broadcast bc(in, c.where());
                Tensor y = Tensor::empty(DType::kF32, bc.shape());
                float* po = y.data<float>();
                const double count = static_cast<double>(in.size());
                bc.for_rows([&](const int64_t* off, int64_t o, int64_t n) {
                  if (in.size() == 2 && !mean)  // a + b rounds once in float too
                    return binary_f32(BinaryOp::kAdd, in[0]->data<float>() + off[0],
                                      bc.row_stride(0), in[1]->data<float>() + off[1],
                                      bc.row_stride(1), po + o, n);
                  for (int64_t i = 0; i < n; ++i) {
                    double acc = 0;
                    for (size_t k = 0; k < in.size(); ++k)
                      acc += in[k]->data<float>()[off[k] + i * bc.row_stride(k)];
                    po[o + i] = static_cast<float>(mean ? acc / count : acc);
                  }
                });
                return std::vector<Tensor>{y};
              }};
}

// Comparisons on float32, int64 and int32 (and Equal on bool: Ts).
template <class... Ts>
Kernel compare_kernel(CompareOp op) {
  return broadcast_kernel<bool, float, int64_t, int32_t, Ts...>(
      [op](const auto* a, int64_t sa, const auto* b, int64_t sb, bool* y, int64_t n) {
        compare_row(op, a, sa, b, sb, y, n);
      });
}

// Where on any dtype: 32-bit elements through the vector blend, others element by element.
std::vector<Tensor> where_run(const KernelContext& c) {
  const Tensor &cond = c.input(0), &x = c.input(1), &y = c.input(2);
  Broadcast bc({&cond, &x, &y}, c.where());
  Tensor out = Tensor::empty(x.dtype(), bc.shape());
  const bool* pc = cond.data<bool>();
  const int64_t sc = bc.row_stride(0), sx = bc.row_stride(1), sy = bc.row_stride(2);
  auto scalar = [&]<class T>() {
    const T *px = static_cast<const T*>(x.raw_data()), *py = static_cast<const T*>(y.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    bc.for_rows([&](const int64_t* off, int64_t o, int64_t n) {
      for (int64_t i = 0; i < n; ++i)
        po[o + i] = pc[off[0] + i * sc] ? px[off[1] + i * sx] : py[off[2] + i * sy];
    });
  };
  switch (x.itemsize()) {
    case 4: {
      const float *px = static_cast<const float*>(x.raw_data()),
                  *py = static_cast<const float*>(y.raw_data());
      float* po = static_cast<float*>(out.raw_data());
      bc.for_rows([&](const int64_t* off, int64_t o, int64_t n) {
        where_b32(pc + off[0], sc, px + off[1], sx, py + off[2], sy, po + o, n);
      });
      break;
    }
    case 8:
      scalar.template operator()<uint64_t>();
      break;
    case 2:
      scalar.template operator()<uint16_t>();
      break;
    default:
      scalar.template operator()<uint8_t>();
  }
  return one(std::move(out));
}

Kernel where_kernel() {
  return {.accepts =
              [](const NodeInfo& info) {
                return info.inputs.size() == 3 && info.dtype(0) == DType::kBool &&
                       info.dtype(1) != DType::kUndefined && info.dtype(1) == info.dtype(2);
              },
          .run = where_run};
}

template <class F>
Kernel bool_kernel(F f) {
  return broadcast_kernel<bool, bool>([f](const bool* a, int64_t sa, const bool* b, int64_t sb,
                                          bool* y,
                                          int64_t n) { scalar_row(f, a, sa, b, sb, y, n); });
}

// ---- Pow ----

// pow(a, b) for float32 a and a float32, int64 or int32 exponent b: a scalar exponent of 1, 2,
// 0.5 or 3 takes a fast path with the reference's exact results; any other is std::pow in double,
// rounded once, as the reference.
std::vector<Tensor> pow_run(const KernelContext& c) {
  const Tensor &a = c.input(0), &b = c.input(1);
  Broadcast bc({&a, &b}, c.where());
  Tensor y = Tensor::empty(DType::kF32, bc.shape());
  const float* pa = a.data<float>();
  float* po = y.data<float>();
  if (b.numel() == 1 && a.numel() == y.numel()) {
    const double e = b.item_as_double(0);
    if (e == 1 || e == 2 || e == 0.5) {
      map_unary(e == 1   ? UnaryOp::kIdentity
                : e == 2 ? UnaryOp::kSquare
                         : UnaryOp::kPowHalf,
                {}, a, y);
      return one(std::move(y));
    }
    if (e == 3) {  // x^2 is exact in double, so this is pow's correctly rounded double
      parallel_for(0, y.numel(), kGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          double x = pa[i];
          po[i] = static_cast<float>(x * x * x);
        }
      });
      return one(std::move(y));
    }
  }
  const int64_t sa = bc.row_stride(0), sb = bc.row_stride(1);
  with_type<float, int64_t, int32_t>(b.dtype(), [&]<class E>() {
    const E* pb = b.data<E>();
    bc.for_rows([&](const int64_t* off, int64_t o, int64_t n) {
      for (int64_t i = 0; i < n; ++i)
        po[o + i] = static_cast<float>(std::pow(static_cast<double>(pa[off[0] + i * sa]),
                                                static_cast<double>(pb[off[1] + i * sb])));
    });
  });
  return one(std::move(y));
}

// ---- Cast ----

// Calls f.template operator()<T>() for the dtypes Cast handles here (bf16: the inputs and
// outputs of a bf16 graph, PromoteHalf).
template <class F>
bool with_cast_type(DType dt, F&& f) {
  return with_type<float, double, Float16, BFloat16, int64_t, int32_t, bool>(dt, f);
}

bool cast_handles(DType dt) {
  return with_cast_type(dt, []<class T>() {});
}

// Converts n values between float, bf16 and f16 through float (exact into float from the halves,
// one rounding out of it: what reference::cast_value does), vectorized (F16C for the f16 sides).
template <class From, class To>
void cast_through_float(const From* in, To* out, int64_t n) {
  constexpr int64_t kChunk = 1024;
  float buf[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    const float* f = buf;
    if constexpr (std::is_same_v<From, Float16>)
      f16_to_f32(reinterpret_cast<const uint16_t*>(in + i), buf, m);
    else if constexpr (std::is_same_v<From, BFloat16>)
      bf16_to_f32(reinterpret_cast<const uint16_t*>(in + i), buf, m);
    else
      f = in + i;
    if constexpr (std::is_same_v<To, Float16>)
      f32_to_f16(f, reinterpret_cast<uint16_t*>(out + i), m);
    else if constexpr (std::is_same_v<To, BFloat16>)
      f32_to_bf16(f, reinterpret_cast<uint16_t*>(out + i), m);
    else
      std::memcpy(out + i, f, static_cast<size_t>(m) * sizeof(float));
  }
}

template <class T>
constexpr bool kFloatOrHalf =
    std::is_same_v<T, float> || std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;

// Cast element by element with the reference's own conversion (reference/ops/cast.h), in parallel;
// among float, bf16 and f16 vectorized (cast_through_float).
Kernel cast_kernel() {
  return {.accepts =
              [](const NodeInfo& info) {
                if (info.inputs.size() != 1 || !info.node.attrs.has("to")) return false;
                try {
                  return cast_handles(info.dtype(0)) &&
                         cast_handles(info.node.attrs.get_dtype("to"));
                } catch (const Error&) {
                  return false;  // an unknown target: the reference reports it
                }
              },
          .run =
              [](const KernelContext& c) {
                const Tensor& x = c.input(0);
                DType to = c.attrs().get_dtype("to");
                if (to == x.dtype()) return std::vector<Tensor>{x};
                Tensor y = Tensor::empty(to, x.shape());
                with_cast_type(x.dtype(), [&]<class From>() {
                  with_cast_type(to, [&]<class To>() {
                    const From* in = x.data<From>();
                    To* out = y.data<To>();
                    parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) {
                      if constexpr (kFloatOrHalf<From> && kFloatOrHalf<To>)
                        cast_through_float(in + b, out + b, e - b);
                      else
                        for (int64_t i = b; i < e; ++i) out[i] = reference::cast_value<To>(in[i]);
                    });
                  });
                });
                return std::vector<Tensor>{y};
              }};
}

}  // namespace

void register_elementwise_kernels(KernelRegistry& r) {
  register_unary(r);
  r.add("Add", binary_kernel(BinaryOp::kAdd));
  r.add("Sub", binary_kernel(BinaryOp::kSub));
  r.add("Mul", binary_kernel(BinaryOp::kMul));
  r.add("Div", binary_kernel(BinaryOp::kDiv));
  r.add("Max", fold_kernel(BinaryOp::kMax));
  r.add("Min", fold_kernel(BinaryOp::kMin));
  r.add("Sum", sum_kernel(false));
  r.add("Mean", sum_kernel(true));
  r.add("Mod", mod_kernel());
  r.add("Equal", compare_kernel<bool>(CompareOp::kEqual));
  r.add("Less", compare_kernel(CompareOp::kLess));
  r.add("LessOrEqual", compare_kernel(CompareOp::kLessOrEqual));
  r.add("Greater", compare_kernel(CompareOp::kGreater));
  r.add("GreaterOrEqual", compare_kernel(CompareOp::kGreaterOrEqual));
  r.add("Where", where_kernel());
  r.add("And", bool_kernel([](bool a, bool b) { return a && b; }));
  r.add("Or", bool_kernel([](bool a, bool b) { return a || b; }));
  r.add("Xor", bool_kernel([](bool a, bool b) { return a != b; }));
  r.add("Pow", {.accepts =
                    [](const NodeInfo& info) {
                      return info.inputs.size() == 2 && info.dtype(0) == DType::kF32 &&
                             is_one_of<float, int64_t, int32_t>(info.dtype(1)) &&
                             !legacy_broadcast(info);
                    },
                .run = pow_run});
  r.add("Cast", cast_kernel());
}

}  // namespace pto::cpu
