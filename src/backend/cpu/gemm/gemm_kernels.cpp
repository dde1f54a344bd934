// CPU kernels for MatMul (numpy semantics: 1-D operands promoted then removed, batch dimensions
// broadcast) and Gemm (transA, transB, alpha, beta, C broadcast to M x N), on sgemm. float32 only;
// other dtypes are declined and run on the reference interpreter (but a bf16/f16 A in the node's
// product precision, and a bf16/f16 result from a fused group ending in a Cast). A constant B (a
// weight) is packed once at compile time (prepare) and every run uses sgemm_packed. A node marked
// precision="bf16" or "f16" (AutoMixedPrecision) runs sgemm's bf16 or f16 products, its weight
// packed rounded to that type.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/env_switch.h"
#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/scratch.h"
#include "ir/ops/op_params.h"
#include "pto/error.h"

namespace pto::cpu {
namespace {

// Operands and result in float32, except an A stored in the node's own product precision
// (bf16 or f16, StoreHalfOperands), which the products read exactly.
bool all_f32(const NodeInfo& n, size_t count) {
  const std::optional<DType> p = params::product_precision(n.node);
  for (size_t i = 0; i < count; ++i)
    if (n.dtype(i) != DType::kF32 && !(i == 0 && p && *p != DType::kF32 && n.dtype(0) == *p))
      return false;
  return n.outputs.size() == 1 && n.outputs[0].dtype == DType::kF32;
}

Precision precision_of_dtype(DType d) {
  return d == DType::kBF16  ? Precision::kBF16
         : d == DType::kF16 ? Precision::kF16
                            : Precision::kF32;
}

// Where the result goes: float Y, or, when the fused group stores bf16 or f16, a half tensor
// `out` with the float accumulators in thread scratch (GemmArgs::c_half).
struct Result {
  Tensor out;
  float* c = nullptr;
};

Result result_for(const KernelContext& c, const Dims& shape, GemmArgs& g) {
  if (c.knobs) {
    if (auto it = c.knobs->find("gemm.blocks"); it != c.knobs->end()) {
      g.block_kc = it->second[0];
      g.block_mc = it->second[1];
      g.block_nc = it->second[2];
    }
    if (auto it = c.knobs->find("gemm.grid"); it != c.knobs->end()) {
      g.grid_tm = it->second[0];
      g.grid_tn = it->second[1];
    }
  }
  const DType dt = c.epilogue ? c.epilogue->store : DType::kF32;
  Result r{Tensor::empty(dt, shape)};
  if (dt == DType::kF32) {
    r.c = r.out.data<float>();
  } else {
    static thread_local ScratchBuffer accumulators;
    r.c = accumulators.get_as<float>(static_cast<size_t>(r.out.numel()));
    g.c_half = static_cast<uint16_t*>(r.out.raw_data());
    g.c_half_type = precision_of_dtype(dt);
  }
  return r;
}

// A (float or half) into g.
void set_a(const Tensor& A, GemmArgs& g) {
  if (A.dtype() == DType::kF32) {
    g.a = A.data<float>();
  } else {
    g.a_half = static_cast<const uint16_t*>(A.raw_data());
    g.a_half_type = precision_of_dtype(A.dtype());
  }
}

bool rank_is(const TensorType& t, size_t rank) {
  return t.shape && t.shape->size() == rank;
}

// A constant B packed at compile time, and what giving the original back needs.
struct PreparedB {
  PackedB packed;
  Dims shape;          // B's own shape: [K, N], [N, K] (transposed) or [K]
  bool trans = false;  // Gemm's transB
};

// A constant 2-D (or 1-D, as K x 1) B, packed for sgemm_packed; K x N as the product sees it.
// A bf16 packing keeps B rounded to bf16, which the node's products round it to anyway.
std::any pack_constant_b(const Tensor& b, bool trans, Precision precision) {
  PreparedB p{{}, b.shape(), trans};
  if (b.rank() == 1) {
    p.packed = pack_b(b.dim(0), 1, b.data<float>(), 1, false, precision);
  } else {
    const int64_t k = trans ? b.dim(1) : b.dim(0), n = trans ? b.dim(0) : b.dim(1);
    p.packed = pack_b(k, n, b.data<float>(), b.dim(1), trans, precision);
  }
  return p;
}

// B as it was before packing (the panels unpack to N x K, B transposed; bf16-rounded when packed
// for bf16 products, which give the same results from it).
Tensor unpack_constant_b(const std::any& state, size_t input) {
  const auto& p = std::any_cast<const PreparedB&>(state);
  PTO_CHECK(input == 1) << "MatMul/Gemm: only B is packed";
  const std::vector<float> nk = p.packed.unpack();
  Tensor b = Tensor::empty(DType::kF32, p.shape);
  float* out = b.data<float>();
  const int64_t n = p.packed.n(), k = p.packed.k();
  if (p.trans || p.shape.size() == 1) {
    std::copy(nk.begin(), nk.end(), out);
  } else {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t q = 0; q < k; ++q) out[q * n + j] = nk[j * k + q];
  }
  return b;
}

// Both kernels read B only from its packing when prepare() packed it.
void set_packing(Kernel& k) {
  k.packed_inputs = [](const std::any& state) {
    return state.has_value() ? std::vector<size_t>{1} : std::vector<size_t>{};
  };
  k.packed_bytes = [](const std::any& state) {
    return state.has_value() ? std::any_cast<const PreparedB&>(state).packed.bytes() : 0;
  };
  k.unpack = unpack_constant_b;
}

// sgemm, or sgemm_packed when prepare() packed B.
void run_sgemm(const KernelContext& c, const GemmArgs& g) {
  if (c.state && c.state->has_value())
    sgemm_packed(g, c.prepared<PreparedB>().packed);
  else
    sgemm(g);
}

std::vector<Tensor> matmul(const KernelContext& c) {
  // The node's name (an allocation) is built for the messages only: this runs on every call.
  const Tensor &A = c.input(0), &B = c.input(1);
  if (A.rank() == 0 || B.rank() == 0)
    throw ValueError(cat(c.where(), ": operands must have rank >= 1, got ", dims_str(A.shape()),
                         " and ", dims_str(B.shape())));
  Dims a2 = A.shape(), b2 = B.shape();
  if (a2.size() == 1) a2.insert(a2.begin(), 1);
  if (b2.size() == 1) b2.push_back(1);
  const int64_t M = a2[a2.size() - 2], K = a2.back(), N = b2.back();
  if (b2[b2.size() - 2] != K)
    throw ValueError(cat(c.where(), ": inner dimensions differ: ", dims_str(A.shape()), " x ",
                         dims_str(B.shape())));
  const Dims ab(a2.begin(), a2.end() - 2), bb(b2.begin(), b2.end() - 2);
  const Dims batch = ab == bb ? ab : broadcast_dims(ab, bb, c.where());
  Dims yshape = batch;
  if (A.rank() > 1) yshape.push_back(M);
  if (B.rank() > 1) yshape.push_back(N);
  GemmArgs g;
  const auto [Y, y] = result_for(c, yshape, g);
  if (Y.numel() == 0) return one(std::move(Y));
  g.m = M;
  g.n = N;
  g.k = K;
  set_a(A, g);
  g.lda = K;
  g.b = B.data<float>();
  g.ldb = N;
  g.c = y;
  g.ldc = N;
  g.precision = *precision_of(c.node);
  if (const FusedEpilogue* f = c.epilogue) apply_fused(*f, Y, N, c.where(), g.epilogue);
  int64_t items = 1;
  for (int64_t d : batch) items *= d;
  int64_t a_items = 1, b_items = 1;
  for (int64_t d : ab) a_items *= d;
  for (int64_t d : bb) b_items *= d;
  if (c.epilogue && c.epilogue->tile && b_items != 1)  // operands index the folded rows
    throw KernelDeclined(cat(c.where(), ": a tile epilogue needs one B for every batch item"));
  if (b_items == 1) {  // one B for every batch: fold A's batch into M (rows are contiguous)
    g.m = M * items;
    run_sgemm(c, g);
    return one(std::move(Y));
  }
  if ((a_items == 1 || a_items == items) && b_items == items) {  // A shared or batched in full
    sgemm_batched(g, items, a_items == 1 ? 0 : M * K, K * N, M * N);
    return one(std::move(Y));
  }
  // General broadcasting between batch shapes: one GEMM per output batch item.
  const size_t r = batch.size();
  Dims idx(r, 0);
  for (int64_t item = 0; item < items; ++item) {
    int64_t ao = 0, bo = 0, as = 1, bs = 1;
    for (size_t d = r; d-- > 0;) {
      const size_t da = d + ab.size() - r, db = d + bb.size() - r;  // right-aligned
      if (d + ab.size() >= r && ab[da] != 1) ao += idx[d] * as;
      if (d + ab.size() >= r) as *= ab[da];
      if (d + bb.size() >= r && bb[db] != 1) bo += idx[d] * bs;
      if (d + bb.size() >= r) bs *= bb[db];
    }
    GemmArgs one = g;
    if (one.a_half)  // whichever holds A
      one.a_half += ao * M * K;
    else
      one.a += ao * M * K;
    one.b += bo * K * N;
    one.c += item * M * N;
    sgemm(one);
    for (size_t d = r; d-- > 0;)
      if (++idx[d] < batch[d])
        break;
      else
        idx[d] = 0;
  }
  return one(std::move(Y));
}

std::vector<Tensor> gemm(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &A = c.input(0), &B = c.input(1);
  if (A.rank() != 2 || B.rank() != 2)
    throw ValueError(cat(w, ": A and B must be 2-D, got ", A.str(), " and ", B.str()));
  const params::Gemm p = params::gemm(c.node);
  const bool ta = p.trans_a, tb = p.trans_b;
  const int64_t M = ta ? A.dim(1) : A.dim(0), K = ta ? A.dim(0) : A.dim(1);
  const int64_t N = tb ? B.dim(0) : B.dim(1);
  if ((tb ? B.dim(1) : B.dim(0)) != K)
    throw ValueError(cat(w, ": A' [", M, ", ", K, "] and B' ", B.str(), (tb ? " (transposed)" : ""),
                         " do not multiply"));
  const auto alpha = static_cast<float>(p.alpha), beta = static_cast<float>(p.beta);
  GemmArgs g;
  const auto [Y, y] = result_for(c, {M, N}, g);
  g.m = M;
  g.n = N;
  g.k = K;
  set_a(A, g);
  g.lda = A.dim(1);
  g.trans_a = ta;
  g.b = B.data<float>();
  g.ldb = B.dim(1);
  g.trans_b = tb;
  g.c = y;
  g.ldc = N;
  g.alpha = alpha;
  g.precision = *precision_of(c.node);
  std::vector<float> bias;  // beta * C when C is a row, a column or a scalar
  // beta = 0 leaves C unread, as the reference does (an Inf or NaN in C is no 0 * C = NaN).
  if (c.has_input(2) && beta != 0.0f) {
    const Tensor& C = c.input(2);
    const int64_t cm = C.rank() == 2 ? C.dim(0) : 1, cn = C.rank() >= 1 ? C.dim(-1) : 1;
    if (C.rank() > 2 || (cm != 1 && cm != M) || (cn != 1 && cn != N))
      throw ValueError(cat(w, ": C ", C.str(), " does not broadcast to [", M, ", ", N, "]"));
    const float* cv = C.data<float>();
    Epilogue& ep = g.epilogue;
    // A full C is the epilogue's residual, unless a fused residual takes that place (the
    // fusion rules then only allow a row of C, which works as a bias too).
    const bool fused_residual = c.epilogue && c.epilogue->residual.defined();
    if (cm == M && cn == N && M * N > 1 && !(fused_residual && cm == 1)) {
      ep.residual = cv;
      ep.ldr = N;
      ep.residual_scale = beta;
    } else {
      bias.resize(static_cast<size_t>(cm * cn));
      for (size_t i = 0; i < bias.size(); ++i) bias[i] = beta * cv[i];
      ep.bias = bias.data();
      ep.bias_kind = cm * cn == 1 ? Epilogue::Bias::kScalar
                     : cm == 1    ? Epilogue::Bias::kPerCol
                                  : Epilogue::Bias::kPerRow;
    }
  }
  if (c.epilogue && c.epilogue->tile && c.has_input(2))  // the program replaces C's bias
    throw KernelDeclined(cat(w, ": a tile epilogue after a Gemm with C"));
  if (const FusedEpilogue* f = c.epilogue) apply_fused(*f, Y, N, w, g.epilogue);
  run_sgemm(c, g);
  return one(std::move(Y));
}

// How a tile-epilogue operand is read from the product's rows of N (EpilogueOperand): a scalar,
// a row of N, a value per row, or a tensor of the product's shape.
EpilogueOperand operand_of(const Tensor& t, const Tensor& Y, int64_t N, const std::string& where) {
  const float* p = t.data<float>();
  const int64_t rows = N ? Y.numel() / N : 0;
  if (t.numel() == 1) return {p, 0, 0};
  if (t.rank() >= 1 && t.dim(-1) == N && t.numel() == N) return {p, 0, 1};
  if (t.shape() == Y.shape()) return {p, N, 1};
  if (t.rank() == Y.rank() && t.dim(-1) == 1 && t.numel() == rows &&
      std::equal(t.shape().begin(), t.shape().end() - 1, Y.shape().begin()))
    return {p, 1, 0};
  throw KernelDeclined(cat(where, ": epilogue operand ", t.str(), " is not a scalar, a row, a ",
                           "column or the shape of ", Y.str()));
}

}  // namespace

// A fused group's epilogue on an M x N product Y: bias per column, residual with Y's shape (its
// rows contiguous, N apart), then the activation. Gemm's own C already set bias or residual; the
// fusion rules never add a second one.
void apply_fused(const FusedEpilogue& f, const Tensor& Y, int64_t N, const std::string& where,
                 Epilogue& ep) {
  if (f.tile) {
    f.tile_operands.clear();
    for (const Tensor& t : f.tile_inputs) f.tile_operands.push_back(operand_of(t, Y, N, where));
    ep.tile = f.tile;
    ep.tile_operands = f.tile_operands.data();
    return;
  }
  if (f.bias.defined()) {
    ep.bias = f.bias.data<float>();
    ep.bias_kind = Epilogue::Bias::kPerCol;
  }
  if (f.residual.defined()) {
    // The residual may be a reshaped view of the product (a Reshape inside the group): the same
    // rows of N in the same order.
    if (f.residual.numel() != Y.numel() || f.residual.rank() == 0 || f.residual.dim(-1) != N)
      throw KernelDeclined(cat(where, ": fused residual ", f.residual.str(),
                               " does not match the output ", Y.str()));
    ep.residual = f.residual.data<float>();
    ep.ldr = N;
    ep.residual_scale = 1.0f;
  }
  ep.act = f.act;
  ep.lo = f.lo;
  ep.hi = f.hi;
  // PTO_GELU_HALF=0 keeps the accurate GELU before a half store too (A/B and tests).
  ep.half_store = f.store != DType::kF32 && env_switch("PTO_GELU_HALF");
}

std::optional<Precision> precision_of(const Node& n) {
  const std::optional<DType> p = params::product_precision(n);
  if (!p) return std::nullopt;
  if (params::split_bf16_products(n)) return Precision::kBF16x3;
  return *p == DType::kBF16  ? Precision::kBF16
         : *p == DType::kF16 ? Precision::kF16
                             : Precision::kF32;
}

// The knobs MatMul and Gemm take: "gemm.blocks" = {KC, MC, NC} (GemmArgs::block_kc...) and
// "gemm.grid" = {row ranges, column ranges} (GemmArgs::grid_tm, grid_tn).
std::string check_gemm_knob(const NodeInfo&, const std::string& knob, const std::vector<int64_t>& v,
                            const std::string& where) {
  if (knob == "gemm.grid") {
    if (v.size() != 2 || v[0] < 1 || v[0] > 256 || v[1] < 1 || v[1] > 256)
      throw ValueError(cat(where, ": knob gemm.grid must be {row ranges in [1, 256], column ",
                           "ranges in [1, 256]}, got ", dims_str(v)));
    return cat("knob gemm.grid: ", v[0], " row x ", v[1],
               " column ranges per product (at most its panels; with more than one thread)");
  }
  if (knob != "gemm.blocks") throw ValueError(cat(where, ": takes no knob '", knob, "'"));
  if (v.size() != 3 || v[0] < 8 || v[0] > 8192 || v[1] < 1 || v[1] > (1 << 20) || v[2] < 1 ||
      v[2] > (1 << 24))
    throw ValueError(cat(where, ": knob gemm.blocks must be {KC in [8, 8192], MC in [1, 2^20], ",
                         "NC in [1, 2^24]}, got ", dims_str(v)));
  return cat("knob gemm.blocks: KC ", v[0], ", MC ", v[1], ", NC ", v[2],
             " (rounded to the register block)");
}

void register_gemm_kernels(KernelRegistry& r) {
  Kernel mm;
  mm.accepts = [](const NodeInfo& n) { return all_f32(n, 2) && precision_of(n.node).has_value(); };
  mm.prepare = [](const NodeInfo& n) -> std::any {
    // Only a 1-D or 2-D constant B with a known A rank that folds into one GEMM is worth packing.
    if (!n.is_constant(1) || n.constants[1]->rank() > 2) return {};
    return pack_constant_b(*n.constants[1], false, *precision_of(n.node));
  };
  mm.run = matmul;
  mm.check_knob = check_gemm_knob;
  set_packing(mm);
  r.add("MatMul", std::move(mm));

  Kernel gm;
  gm.accepts = [](const NodeInfo& n) {
    const size_t count = n.inputs.size() > 2 && n.inputs[2].dtype != DType::kUndefined ? 3 : 2;
    return all_f32(n, count) && rank_is(n.inputs[0], 2) && rank_is(n.inputs[1], 2) &&
           precision_of(n.node).has_value();
  };
  gm.prepare = [](const NodeInfo& n) -> std::any {
    if (!n.is_constant(1) || n.constants[1]->rank() != 2) return {};
    return pack_constant_b(*n.constants[1], params::gemm(n.node).trans_b, *precision_of(n.node));
  };
  gm.run = gemm;
  gm.check_knob = check_gemm_knob;
  set_packing(gm);
  r.add("Gemm", std::move(gm));
}

}  // namespace pto::cpu
