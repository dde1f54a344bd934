// Reference MatMul, Gemm, MatMulInteger and GatherMatMul. Floats accumulate in double; integers
// accumulate in uint64 (two's complement wraparound, no signed overflow) and are truncated to the
// output type. The i-k-j loop order keeps the innermost loop a contiguous row of B and of the
// result, so BERT-sized models run in seconds.
#include <cmath>
#include <type_traits>

#include "cast.h"
#include "ir/ops/op_params.h"
#include "nn_kernels.h"

namespace pto::reference {

std::vector<double> product_operand(const KernelContext& c, const Tensor& t, const std::string& w) {
  std::vector<double> v = values_as<double>(t, w);
  const std::optional<DType> p = params::product_precision(c.node);
  if (!p)
    throw UnsupportedError(cat(w, ": precision '", c.node.attrs.get_string("precision"),
                               "' is not one PyPTO knows for ", c.node.op,
                               " (\"bf16\", \"f16\"; \"bf16x3\" on MatMul, Gemm and Conv)"));
  if (*p == DType::kF32) return v;
  dispatch(*p, kFloatTypes, w, [&]<class H>() {
    for (double& x : v) x = static_cast<float>(cast_value<H>(x));  // Cast's own rounding
  });
  return v;
}

std::vector<double> split_products(const std::vector<double>& a, const std::vector<double>& b,
                                   const Product& product) {
  auto split = [](const std::vector<double>& v, std::vector<double>& head,
                  std::vector<double>& tail) {
    head.resize(v.size());
    tail.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const auto x = static_cast<float>(v[i]);
      const auto h = static_cast<float>(cast_value<BFloat16>(x));
      head[i] = h;
      tail[i] = static_cast<float>(cast_value<BFloat16>(x - h));
    }
  };
  std::vector<double> ah, al, bh, bl;
  split(a, ah, al);
  split(b, bh, bl);
  std::vector<double> y = product(ah, bh);
  const std::vector<double> y2 = product(al, bh), y3 = product(ah, bl);
  for (size_t i = 0; i < y.size(); ++i) y[i] += y2[i] + y3[i];
  return y;
}

namespace {

// numpy matmul of A and B: the result shape and, per broadcast batch, where each operand's matrix
// starts.
struct Plan {
  Dims yshape;
  int64_t M = 1, K = 1, N = 1;
  std::vector<int64_t> a_off, b_off;
};

Plan plan_matmul(const Dims& a, const Dims& b, const std::string& where) {
  if (a.empty() || b.empty())
    throw ValueError(
        cat(where, ": operands must have rank >= 1, got ", dims_str(a), " and ", dims_str(b)));
  Dims a2 = a, b2 = b;
  if (a2.size() == 1) a2.insert(a2.begin(), 1);
  if (b2.size() == 1) b2.push_back(1);
  Plan p;
  p.M = a2[a2.size() - 2];
  p.K = a2.back();
  p.N = b2.back();
  if (b2[b2.size() - 2] != p.K)
    throw ValueError(cat(where, ": inner dimensions differ: ", dims_str(a), " x ", dims_str(b)));
  const Dims ab(a2.begin(), a2.end() - 2), bb(b2.begin(), b2.end() - 2);
  const Dims batch = broadcast_dims(ab, bb, where);
  p.yshape = batch;
  if (a.size() > 1) p.yshape.push_back(p.M);
  if (b.size() > 1) p.yshape.push_back(p.N);
  if (checked_numel(p.yshape, where.c_str()) == 0) return p;  // no batches to walk
  p.a_off = broadcast_offsets(ab, batch);
  p.b_off = broadcast_offsets(bb, batch);
  for (int64_t& o : p.a_off) o *= p.M * p.K;
  for (int64_t& o : p.b_off) o *= p.K * p.N;
  return p;
}

template <class V>
std::vector<V> run_plan(const Plan& p, const std::vector<V>& a, const std::vector<V>& b) {
  // A 4 x 12 tile of results lives in registers while k runs over a packed panel of 12 columns of
  // B. Each result still sums its products in k order, so the tiling does not change the bits.
  constexpr int64_t MR = 4, NR = 12;
  std::vector<V> y(p.a_off.size() * p.M * p.N, V(0));
  if (p.M < MR || p.N < NR) {
    // Thin products (matrix-vector, single-row decode steps) would waste most of a tile: plain
    // i-k-j loops, with the same per-result summation order.
    for (size_t bt = 0; bt < p.a_off.size(); ++bt)
      for (int64_t i = 0; i < p.M; ++i) {
        V* yrow = y.data() + (bt * p.M + i) * p.N;
        for (int64_t k = 0; k < p.K; ++k) {
          const V av = a[p.a_off[bt] + i * p.K + k];
          const V* brow = b.data() + p.b_off[bt] + k * p.N;
          for (int64_t j = 0; j < p.N; ++j) yrow[j] += av * brow[j];
        }
      }
    return y;
  }
  std::vector<V> panel(static_cast<size_t>(p.K * NR));
  for (size_t bt = 0; bt < p.a_off.size(); ++bt) {
    const V* A = a.data() + p.a_off[bt];
    const V* B = b.data() + p.b_off[bt];
    V* Y = y.data() + bt * p.M * p.N;
    for (int64_t j0 = 0; j0 < p.N; j0 += NR) {
      const int64_t nc = std::min(NR, p.N - j0);
      for (int64_t k = 0; k < p.K; ++k)
        for (int64_t c = 0; c < NR; ++c) panel[k * NR + c] = c < nc ? B[k * p.N + j0 + c] : V(0);
      for (int64_t i0 = 0; i0 < p.M; i0 += MR) {
        const int64_t nr = std::min(MR, p.M - i0);
        const V* rows[MR];
        for (int64_t r = 0; r < MR; ++r) rows[r] = A + (i0 + std::min(r, nr - 1)) * p.K;
        V acc[MR][NR] = {};
        for (int64_t k = 0; k < p.K; ++k) {
          const V* bp = panel.data() + k * NR;
          for (int64_t r = 0; r < MR; ++r) {
            const V av = rows[r][k];
            for (int64_t c = 0; c < NR; ++c) acc[r][c] += av * bp[c];
          }
        }
        for (int64_t r = 0; r < nr; ++r)
          for (int64_t c = 0; c < nc; ++c) Y[(i0 + r) * p.N + j0 + c] = acc[r][c];
      }
    }
  }
  return y;
}

std::vector<Tensor> matmul(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &A = c.input(0), &B = c.input(1);
  params::check_product_operands(c.node, A.dtype(), B.dtype(), w);
  const Plan p = plan_matmul(A.shape(), B.shape(), w);
  if (is_floating(A.dtype())) {
    const std::vector<double> av = product_operand(c, A, w), bv = product_operand(c, B, w);
    return {tensor_from(
        params::product_result_dtype(c.node, A.dtype()), p.yshape,
        params::split_bf16_products(c.node)
            ? split_products(av, bv,
                             [&](const std::vector<double>& x, const std::vector<double>& y) {
                               return run_plan(p, x, y);
                             })
            : run_plan(p, av, bv),
        w)};
  }
  return {tensor_from(A.dtype(), p.yshape,
                      run_plan(p, values_as<uint64_t>(A, w), values_as<uint64_t>(B, w)), w)};
}

// Copies a 2-D matrix, transposed when `trans`.
template <class V>
std::vector<V> maybe_transpose(const std::vector<V>& m, int64_t rows, int64_t cols, bool trans) {
  if (!trans) return m;
  std::vector<V> t(m.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t q = 0; q < cols; ++q) t[q * rows + r] = m[r * cols + q];
  return t;
}

template <class V>
Tensor gemm_typed(const KernelContext& c, V alpha, V beta) {
  const std::string w = c.where();
  const Tensor &A = c.input(0), &B = c.input(1);
  const params::Gemm gp = params::gemm(c.node);
  const bool ta = gp.trans_a, tb = gp.trans_b;
  const int64_t M = ta ? A.dim(1) : A.dim(0), K = ta ? A.dim(0) : A.dim(1);
  const int64_t N = tb ? B.dim(0) : B.dim(1);
  if ((tb ? B.dim(1) : B.dim(0)) != K)
    throw ValueError(cat(w, ": A' [", M, ", ", K, "] and B' ", B.str(), (tb ? " (transposed)" : ""),
                         " do not multiply"));
  Plan p;
  p.M = M;
  p.K = K;
  p.N = N;
  p.yshape = {M, N};
  p.a_off = {0};
  p.b_off = {0};
  std::vector<V> av, bv;
  if constexpr (std::is_same_v<V, double>) {
    av = product_operand(c, A, w);
    bv = product_operand(c, B, w);
  } else {
    av = values_as<V>(A, w);
    bv = values_as<V>(B, w);
  }
  av = maybe_transpose(av, A.dim(0), A.dim(1), ta);
  bv = maybe_transpose(bv, B.dim(0), B.dim(1), tb);
  std::vector<V> y;
  if constexpr (std::is_same_v<V, double>) {
    if (params::split_bf16_products(c.node))
      y = split_products(av, bv, [&](const std::vector<double>& x, const std::vector<double>& z) {
        return run_plan(p, x, z);
      });
  }
  if (y.empty()) y = run_plan(p, av, bv);
  for (V& v : y) v *= alpha;
  if (c.has_input(2)) {
    const Tensor& C = c.input(2);
    if (C.rank() > 2 || broadcast_dims(C.shape(), {M, N}, w) != Dims{M, N})
      throw ValueError(cat(w, ": C ", C.str(), " does not broadcast to [", M, ", ", N, "]"));
    // beta = 0 leaves C unread (as BLAS, onnxruntime and ONNX's reference do): an Inf or NaN in
    // C does not make 0 * C a NaN.
    const std::vector<V> cv = beta == V(0) ? std::vector<V>() : values_as<V>(C, w);
    const std::vector<int64_t> off = broadcast_offsets(C.shape(), {M, N});
    for (size_t i = 0; i < y.size() && beta != V(0); ++i) y[i] += beta * cv[off[i]];
  }
  return tensor_from(params::product_result_dtype(c.node, A.dtype()), {M, N}, y, w);
}

std::vector<Tensor> gemm(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &A = c.input(0), &B = c.input(1);
  if (A.rank() != 2 || B.rank() != 2)
    throw ValueError(cat(w, ": A and B must be 2-D, got ", A.str(), " and ", B.str()));
  params::check_product_operands(c.node, A.dtype(), B.dtype(), w);
  const DType y = params::product_result_dtype(c.node, A.dtype());
  if (c.has_input(2) && c.input(2).dtype() != y)
    throw TypeError(
        cat(w, ": C is ", dtype_name(c.input(2).dtype()), ", the result ", dtype_name(y)));
  const params::Gemm gp = params::gemm(c.node);
  const double alpha = gp.alpha, beta = gp.beta;
  if (is_floating(A.dtype())) return {gemm_typed<double>(c, alpha, beta)};
  if (!is_integral(A.dtype())) throw_unsupported_dtype(A.dtype(), w);
  // Integer Gemm: alpha and beta must be whole numbers for the result to be an exact integer.
  auto as_int = [&](double v, const char* name) {
    if (v != std::floor(v) || std::fabs(v) > 9.0e18)
      throw UnsupportedError(cat(w, ": non-integer ", name, " ", v, " on an integer Gemm"));
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  };
  return {gemm_typed<uint64_t>(c, as_int(alpha, "alpha"), as_int(beta, "beta"))};
}

// A zero point as one value per element of `t`: a scalar, a 1-D per-row (A) / per-column (B)
// vector, or an N-D tensor that broadcasts to t.
std::vector<uint64_t> zero_point_per_element(const KernelContext& c, size_t zp_index,
                                             const Tensor& t, bool is_a) {
  const std::string w = c.where();
  std::vector<uint64_t> out(static_cast<size_t>(t.numel()), 0);
  if (!c.has_input(zp_index) || t.numel() == 0) return out;
  const Tensor& zp = c.input(zp_index);
  if (zp.dtype() != t.dtype())
    throw TypeError(cat(w, ": zero point ", zp.str(), " must have the dtype of ", t.str()));
  const std::vector<uint64_t> z = values_as<uint64_t>(zp, w);
  if (zp.numel() == 1) {
    std::fill(out.begin(), out.end(), z[0]);
    return out;
  }
  if (is_a && zp.rank() == 1 && t.rank() >= 2 && zp.dim(0) == t.dim(-2)) {
    const int64_t M = t.dim(-2), K = t.dim(-1);
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = z[i / K % M];
    return out;
  }
  if (broadcast_dims(zp.shape(), t.shape(), w) != t.shape())
    throw ValueError(cat(w, ": zero point ", zp.str(), " does not fit ", t.str()));
  const std::vector<int64_t> off = broadcast_offsets(zp.shape(), t.shape());
  for (size_t i = 0; i < out.size(); ++i) out[i] = z[off[i]];
  return out;
}

std::vector<Tensor> matmul_integer(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &A = c.input(0), &B = c.input(1);
  for (const Tensor* t : {&A, &B})
    if (t->dtype() != DType::kI8 && t->dtype() != DType::kU8)
      throw_unsupported_dtype(t->dtype(), w);
  const Plan p = plan_matmul(A.shape(), B.shape(), w);
  std::vector<uint64_t> a = values_as<uint64_t>(A, w), b = values_as<uint64_t>(B, w);
  const std::vector<uint64_t> za = zero_point_per_element(c, 2, A, true);
  const std::vector<uint64_t> zb = zero_point_per_element(c, 3, B, false);
  for (size_t i = 0; i < a.size(); ++i) a[i] -= za[i];
  for (size_t i = 0; i < b.size(); ++i) b[i] -= zb[i];
  return {tensor_from(DType::kI32, p.yshape, run_plan(p, a, b), w)};
}

// Row s of Y is W[I[s]] X[s] (W [E, N, K]) or X[s] W[I[s]] (trans_w, W [E, K, N]).
std::vector<Tensor> gather_matmul(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &X = c.input(0), &W = c.input(1), &I = c.input(2);
  if (X.rank() != 2 || W.rank() != 3 || I.rank() != 1 || I.dim(0) != X.dim(0))
    throw ValueError(cat(w, ": X, W and I must be [S, K], [E, N, K] and [S], got ", X.str(), ", ",
                         W.str(), " and ", I.str()));
  const bool trans = c.node.attr_int("trans_w") != 0;
  const int64_t S = X.dim(0), K = X.dim(1), E = W.dim(0), N = W.dim(trans ? 2 : 1);
  if (W.dim(trans ? 1 : 2) != K)
    throw ValueError(cat(w, ": X ", X.str(), " does not fit W ", W.str()));
  const std::vector<double> x = values_as<double>(X, w), wv = values_as<double>(W, w);
  const std::vector<int64_t> idx = values_as<int64_t>(I, w);
  std::vector<double> y(static_cast<size_t>(S * N), 0.0);
  for (int64_t s = 0; s < S; ++s) {
    int64_t e = idx[s];
    if (e < -E || e >= E)
      throw ValueError(cat(w, ": index ", e, " of row ", s, " is outside [", -E, ", ", E, ")"));
    if (e < 0) e += E;
    const double* we = wv.data() + e * N * K;
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t q = 0; q < K; ++q) acc += x[s * K + q] * (trans ? we[q * N + j] : we[j * K + q]);
      y[s * N + j] = acc;
    }
  }
  return {tensor_from(X.dtype(), {S, N}, y, w)};
}

}  // namespace

void register_matmul_kernels(KernelRegistry& r) {
  r.add("MatMul", matmul);
  r.add("Gemm", gemm);
  r.add("MatMulInteger", matmul_integer);
  r.add("GatherMatMul", gather_matmul);
}

}  // namespace pto::reference
