// The int8 GEMM (src/backend/cpu/gemm/igemm.h) against a plain int64 loop, and the CPU kernels of
// MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv, QuantizeLinear, DequantizeLinear and
// DynamicQuantizeLinear against the reference interpreter, bit for bit: on every ISA this machine
// runs, with VNNI on and forced off (the widening fallback), on 1 and 2 threads; shapes with tails
// in M, N and K (K not a multiple of 4, M = 1), all four uint8/int8 pairs, zero points per tensor,
// per row and per column; convolutions with strides, pads, dilations, groups and depthwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/gemm/igemm.h"
#include "backend/cpu/isa/isa.h"
#include "backend/cpu/quant.h"
#include "pto/error.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"

namespace pto::cpu {
namespace {

// Runs body(config name) on every ISA, with the VNNI extensions on and off (and AMX-INT8 with
// them), and with AMX-INT8 alone off where the CPU has it, on 1 and 2 threads.
template <class F>
void for_each_config(F body, bool threads_too = true) {
  const bool amx = has_ext(Ext::kAmxInt8);
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    for (int off = 0; off < (amx ? 3 : 2); ++off) {
      std::unique_ptr<ExtScope> e1, e2, e3;
      if (off == 1) {
        e1 = std::make_unique<ExtScope>(Ext::kAvx512Vnni);
        e2 = std::make_unique<ExtScope>(Ext::kAvxVnni);
      }
      if (off >= 1) e3 = std::make_unique<ExtScope>(Ext::kAmxInt8);
      if (off == 2 && isa != Isa::kAvx512) continue;  // the same as all on
      for (int threads : {1, 2}) {
        if (threads == 2 && !threads_too) continue;
        set_num_threads(threads);
        body(std::string(isa_name(isa)) +
             (off == 1   ? ", VNNI off"
              : off == 2 ? ", AMX off"
                         : "") +
             ", " + std::to_string(threads) + " thread(s)" +
             (igemm_uses_amx()    ? " [amx from 16 rows]"
              : igemm_uses_vnni() ? " [vnni]"
                                  : " [widening]"));
      }
    }
  }
  set_num_threads(0);
}

std::vector<uint8_t> random_bytes(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, 255);
  std::vector<uint8_t> v(static_cast<size_t>(std::max<int64_t>(n, 1)));
  for (auto& x : v) x = static_cast<uint8_t>(d(rng));
  // The extremes, where a saturating multiply-add would go wrong.
  if (n > 4) v[0] = 255, v[1] = 128, v[2] = 127, v[3] = 0;
  return v;
}

int64_t value(const std::vector<uint8_t>& v, int64_t i, bool is_signed) {
  return is_signed ? static_cast<int8_t>(v[i]) : v[i];
}

struct Shape {
  int64_t m, n, k;
};
// With 16 rows or more on AMX tiles: K in a part chunk ({33, 65, 17}), in several slices of whole
// chunks and a part one ({48, 70, 1100}), columns in two blocks ({129, 300, 770}).
const Shape kShapes[] = {{1, 1, 1},    {1, 70, 13},    {7, 13, 5},   {6, 64, 8},
                         {33, 65, 17}, {13, 130, 259}, {100, 47, 3}, {129, 300, 770},
                         {2, 17, 0},   {48, 70, 1100}, {16, 16, 64}};

TEST(CpuIgemm, MatchesAnIntegerLoop) {
  for_each_config([](const std::string& cfg) {
    uint32_t seed = 1;
    for (const Shape& s : kShapes)
      for (int types = 0; types < 4; ++types) {
        const bool as = types & 1, bs = types & 2;
        const auto a = random_bytes(s.m * (s.k + 3), seed++), b = random_bytes(s.k * s.n, seed++);
        const auto zav = random_bytes(s.m + 5, seed++), zbv = random_bytes(s.n + 5, seed++);
        for (int zp = 0; zp < 3; ++zp) {  // none, per tensor, per row of A and column of B
          std::vector<int32_t> za(static_cast<size_t>(s.m + 1)), zb(static_cast<size_t>(s.n + 1));
          for (int64_t i = 0; i <= s.m; ++i) za[i] = static_cast<int32_t>(value(zav, i, as));
          for (int64_t j = 0; j <= s.n; ++j) zb[j] = static_cast<int32_t>(value(zbv, j, bs));
          IgemmArgs g;
          g.m = s.m;
          g.n = s.n;
          g.k = s.k;
          g.a = a.data();
          g.lda = s.k + 3;
          g.a_signed = as;
          if (zp) {
            g.a_zp = za.data();
            g.b_zp = zb.data();
            g.a_zp_per_row = g.b_zp_per_col = zp == 2;
          }
          std::vector<int32_t> c(static_cast<size_t>(s.m * (s.n + 1) + 1), -7);
          g.c = c.data();
          g.ldc = s.n + 1;
          igemm(g, pack_i8_b(s.k, s.n, b.data(), s.n, false, bs));
          // The float and requantized epilogues on the same product.
          std::vector<float> sb(static_cast<size_t>(s.n + 1)), bias(sb.size());
          std::vector<double> mult(sb.size());
          std::vector<int32_t> bias32(sb.size());
          for (size_t j = 0; j < sb.size(); ++j) {
            sb[j] = 0.01f * static_cast<float>(j % 7 + 1);
            bias[j] = 0.5f * static_cast<float>(j % 3);
            mult[j] = 1e-3 * static_cast<double>(j % 5 + 1);
            bias32[j] = static_cast<int32_t>(j % 11) * 1000 - 5000;
          }
          IgemmArgs gf = g;
          std::vector<float> cf(static_cast<size_t>(s.m * s.n + 1));
          gf.out = IgemmArgs::Out::kF32;
          gf.c = cf.data();
          gf.ldc = s.n;
          gf.scale_a = 0.25f;
          gf.scale_b = sb.data();
          gf.scale_b_per_col = true;
          gf.bias = bias.data();
          igemm(gf, pack_i8_b(s.k, s.n, b.data(), s.n, false, bs));
          IgemmArgs gq = g;
          std::vector<uint8_t> cq(static_cast<size_t>(s.m * s.n + 1));
          gq.out = IgemmArgs::Out::kQuantized;
          gq.c = cq.data();
          gq.ldc = s.n;
          gq.mult = mult.data();
          gq.mult_per_col = true;
          gq.y_zp = as ? 3 : 100;
          gq.c_signed = as;
          gq.bias_s32 = bias32.data();  // in the sum before rounding
          igemm(gq, pack_i8_b(s.k, s.n, b.data(), s.n, false, bs));
          int bad = 0;
          for (int64_t i = 0; i < s.m; ++i)
            for (int64_t j = 0; j < s.n; ++j) {
              int64_t want = 0;
              const int64_t zi = zp ? za[zp == 2 ? i : 0] : 0, zj = zp ? zb[zp == 2 ? j : 0] : 0;
              for (int64_t p = 0; p < s.k; ++p)
                want += (value(a, i * g.lda + p, as) - zi) * (value(b, p * s.n + j, bs) - zj);
              const auto w32 = static_cast<int32_t>(want);
              const float wf = static_cast<float>(w32) * (0.25f * sb[j]) + bias[j];
              double wq = std::nearbyint(static_cast<double>(want + bias32[j]) * mult[j] + gq.y_zp);
              wq = std::min(std::max(wq, as ? -128.0 : 0.0), as ? 127.0 : 255.0);
              const double gotq = as ? static_cast<int8_t>(cq[i * s.n + j]) : cq[i * s.n + j];
              if ((c[i * g.ldc + j] != w32 || cf[i * s.n + j] != wf || gotq != wq) && bad++ < 3)
                ADD_FAILURE() << cfg << ": " << s.m << "x" << s.n << "x" << s.k << " types "
                              << types << " zp " << zp << " at (" << i << ", " << j << "): got "
                              << c[i * g.ldc + j] << " / " << cf[i * s.n + j] << " / " << gotq
                              << ", want " << w32 << " / " << wf << " / " << wq;
            }
          // Nothing written past the columns of C.
          for (int64_t i = 0; i < s.m; ++i)
            if (c[i * g.ldc + s.n] != -7 && bad++ < 3) ADD_FAILURE() << cfg << ": wrote past N";
        }
      }
  });
}

// IgemmArgs::fill_a: rows written on demand, each exactly once, on thread counts whose task grids
// split N (M small) or M or both; the float epilogue with per-row zero points and scales.
TEST(CpuIgemm, FillsRowsOnDemand) {
  // Large enough to run on several threads (igemm keeps below ~1e6 multiply-adds on one).
  const Shape shapes[] = {{1, 2000, 600}, {5, 300, 700}, {7, 700, 230},   {13, 2050, 50},
                          {16, 64, 1000}, {40, 40, 700}, {130, 131, 259}, {1, 17, 0}};
  for_each_config(
      [&](const std::string& cfg) {
        for (int threads : {1, 2, 3, 4}) {
          set_num_threads(threads);
          uint32_t seed = 900;
          for (const Shape& s : shapes) {
            const auto src = random_bytes(s.m * s.k, seed++), b = random_bytes(s.k * s.n, seed++);
            const auto zav = random_bytes(s.m, seed++);
            std::vector<uint8_t> a(src.size(), 0);
            std::vector<int32_t> za(static_cast<size_t>(s.m), 0);
            std::vector<float> sa(static_cast<size_t>(s.m), 0.0f), sb(static_cast<size_t>(s.n));
            for (int64_t j = 0; j < s.n; ++j) sb[j] = 0.01f * static_cast<float>(j % 7 + 1);
            std::vector<std::atomic<int>> filled(static_cast<size_t>(s.m));
            IgemmArgs g;
            g.m = s.m;
            g.n = s.n;
            g.k = s.k;
            g.a = a.data();
            g.lda = s.k;
            g.a_zp = za.data();
            g.a_zp_per_row = true;
            g.out = IgemmArgs::Out::kF32;
            g.scale_a_row = sa.data();
            g.scale_b = sb.data();
            g.scale_b_per_col = true;
            g.fill_a = [&](int64_t i0, int64_t i1) {
              for (int64_t i = i0; i < i1; ++i) {
                std::copy_n(src.begin() + i * s.k, s.k, a.begin() + i * s.k);
                za[i] = zav[i];
                sa[i] = 0.125f * static_cast<float>(i % 5 + 1);
                ++filled[i];
              }
            };
            std::vector<float> c(static_cast<size_t>(s.m * s.n));
            g.c = c.data();
            g.ldc = s.n;
            igemm(g, pack_i8_b(s.k, s.n, b.data(), s.n, false, true));
            int bad = 0;
            const std::string what = cfg + ", " + std::to_string(threads) + " threads, " +
                                     std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                                     std::to_string(s.k);
            for (int64_t i = 0; i < s.m; ++i) {
              if (filled[i] != 1 && bad++ < 3)
                ADD_FAILURE() << what << ": row " << i << " filled " << filled[i] << " times";
              for (int64_t j = 0; j < s.n; ++j) {
                int64_t want = 0;
                for (int64_t p = 0; p < s.k; ++p)
                  want +=
                      (int64_t{src[i * s.k + p]} - zav[i]) * static_cast<int8_t>(b[p * s.n + j]);
                const float wf = static_cast<float>(static_cast<int32_t>(want)) *
                                 (0.125f * static_cast<float>(i % 5 + 1) * sb[j]);
                if (c[i * s.n + j] != wf && bad++ < 3)
                  ADD_FAILURE() << what << " at (" << i << ", " << j << "): got " << c[i * s.n + j]
                                << ", want " << wf;
              }
            }
          }
        }
      },
      false);
}

// ---- the CPU kernels against the reference interpreter ----

Tensor bytes_tensor(DType dt, const Dims& shape, uint32_t seed) {
  Tensor t = Tensor::empty(dt, shape);
  const auto v = random_bytes(t.numel(), seed);
  if (t.numel()) std::memcpy(t.raw_data(), v.data(), static_cast<size_t>(t.numel()));
  return t;
}

Tensor f32_tensor(const Dims& shape, uint32_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

// One node; inputs listed in `constant` become initializers, undefined tensors are absent
// optional inputs. Checks that the CPU kernel ran (or the reference, when `backend` says so) and
// that every output equals the reference's bit for bit.
// `rel_tol` 0: the same bits (integer kernels); else |got - want| <= rel_tol (|want| + 1).
void expect_node_matches(const std::string& op, const std::vector<Tensor>& inputs,
                         const std::vector<bool>& constant, const Attributes& attrs, size_t outputs,
                         const std::string& what, int opset = 21,
                         const std::string& backend = "cpu", double rel_tol = 0) {
  // `own`: the initializers are copies only this graph holds, so the Executable it is handed to
  // may release the weights its kernels pack.
  std::vector<Tensor> feeds;
  auto build = [&](bool own) {
    Graph g;
    std::vector<ValueId> ins;
    feeds.clear();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& t = inputs[i];
      if (!t.defined()) {
        ins.push_back(kNoValue);
      } else if (i < constant.size() && constant[i]) {
        ins.push_back(g.add_value(cat("c", i)));
        g.set_initializer(ins.back(), own ? t.clone() : t);
      } else {
        ins.push_back(g.add_input(cat("x", i), {t.dtype(), to_shape(t.shape())}));
        feeds.push_back(t);
      }
    }
    std::vector<ValueId> outs;
    for (size_t i = 0; i < outputs; ++i) outs.push_back(g.add_value(cat("y", i)));
    g.add_node(op, ins, outs, attrs, "node", opset);
    for (ValueId v : outs) g.add_output(v);
    return g;
  };
  Executable exe = compile(build(true), {.level = 0});
  const Graph g = build(false);
  EXPECT_EQ(exe.node_backend(0), backend) << what;
  const std::vector<Tensor> got = exe.run(feeds), want = reference::run(g, feeds);
  // A weight the kernel packed and the runtime released comes back bit for bit.
  const Graph full = exe.graph_with_weights();
  for (const auto& [v, t] : g.initializers()) {
    const Tensor& back = full.initializers().at(v);
    ASSERT_TRUE(back.shape() == t.shape() && back.dtype() == t.dtype())
        << what << ": initializer " << v << " given back as " << back.str();
    const auto *x = static_cast<const uint8_t*>(back.raw_data()),
               *y = static_cast<const uint8_t*>(t.raw_data());
    const size_t first = std::mismatch(x, x + t.nbytes(), y).first - x;
    EXPECT_EQ(first, t.nbytes()) << what << ": initializer " << v << " not given back: byte "
                                 << first << " is " << int{x[first]} << ", was " << int{y[first]};
  }
  // The integer products' constant B and the integer convs' W are released (held packed only),
  // except a depthwise conv's (read as it is).
  const bool qlinear = op == "QLinearMatMul" || op == "QLinearConv";
  const bool conv = op == "ConvInteger" || op == "QLinearConv";
  const size_t b = qlinear ? 3 : 1;
  const bool depthwise = conv && inputs[b].dim(1) == 1 && attrs.get_int("group", 1) > 1;
  // MatMulNBits: B on panels when every operand is constant, and g_idx absent or the plain
  // k / block_size.
  bool nbits_panels =
      op == "MatMulNBits" && constant.size() > 4 && constant[2] && constant[3] && constant[4];
  if (nbits_panels && inputs.size() > 4 && inputs[4].defined())
    for (int64_t k = 0; k < inputs[4].numel(); ++k)
      nbits_panels &= inputs[4].data<int32_t>()[k] == k / attrs.get_int("block_size");
  const bool packs_b = op == "MatMulInteger" || op == "QLinearMatMul" ||
                       op == "DynamicQuantizeMatMul" || (conv && !depthwise) || nbits_panels;
  if (packs_b && b < constant.size() && constant[b]) {
    EXPECT_EQ(exe.graph().released().size(), 1u) << what;
  }
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t o = 0; o < got.size(); ++o) {
    ASSERT_EQ(got[o].dtype(), want[o].dtype()) << what;
    ASSERT_EQ(got[o].shape(), want[o].shape()) << what << " output " << o;
    int bad = 0;
    for (int64_t i = 0; i < got[o].numel(); ++i) {
      const double x = got[o].item_as_double(i), y = want[o].item_as_double(i);
      const bool close = rel_tol > 0 && std::fabs(x - y) <= rel_tol * (std::fabs(y) + 1.0);
      if (!(x == y || close || (std::isnan(x) && std::isnan(y))) && bad++ < 3)
        ADD_FAILURE() << what << " output " << o << " element " << i << ": got " << x << ", want "
                      << y;
    }
  }
}

DType byte_type(bool is_signed) {
  return is_signed ? DType::kI8 : DType::kU8;
}

TEST(CpuInt8Kernels, MatMulIntegerMatchesTheReference) {
  struct Case {
    Dims a, b;
  };
  const std::vector<Case> cases = {{{7, 13}, {13, 5}}, {{1, 70}, {70, 33}},  {{2, 3, 9}, {9, 17}},
                                   {{13}, {13, 4}},    {{20, 64}, {64, 80}}, {{0, 5}, {5, 3}}};
  for_each_config(
      [&](const std::string& cfg) {
        uint32_t seed = 100;
        for (const Case& k : cases)
          for (int types = 0; types < 4; ++types)
            for (int zp = 0; zp < 4; ++zp)  // none, scalar, B per column, A per row
              for (bool constant_b : {false, true}) {
                const bool as = types & 1, bs = types & 2;
                const int64_t M = k.a.size() > 1 ? k.a[k.a.size() - 2] : 1, N = k.b[1];
                std::vector<Tensor> in = {bytes_tensor(byte_type(as), k.a, seed++),
                                          bytes_tensor(byte_type(bs), k.b, seed++)};
                if (zp) {
                  in.push_back(bytes_tensor(byte_type(as), zp == 3 ? Dims{M} : Dims{}, seed++));
                  in.push_back(bytes_tensor(byte_type(bs), zp >= 2 ? Dims{N} : Dims{1}, seed++));
                }
                expect_node_matches("MatMulInteger", in, {false, constant_b, true, true}, {}, 1,
                                    cfg + ", MatMulInteger " + dims_str(k.a) + " x " +
                                        dims_str(k.b) + " types " + std::to_string(types) + " zp " +
                                        std::to_string(zp) + (constant_b ? " (constant B)" : ""),
                                    10);
              }
      },
      false);
}

TEST(CpuInt8Kernels, QLinearMatMulMatchesTheReference) {
  const std::vector<std::pair<Dims, Dims>> cases = {
      {{7, 13}, {13, 5}}, {{1, 70}, {70, 33}}, {{2, 3, 9}, {9, 17}}, {{40, 100}, {100, 70}}};
  for_each_config(
      [&](const std::string& cfg) {
        uint32_t seed = 300;
        for (const auto& [ad, bd] : cases)
          for (int types = 0; types < 8; ++types)
            for (bool per_col : {false, true}) {
              const bool as = types & 1, bs = types & 2, ys = types & 4;
              const int64_t N = bd[1];
              const Dims pd = per_col ? Dims{N} : Dims{};
              Tensor bscale = f32_tensor(pd, seed++, 0.002f, 0.02f);
              const std::vector<Tensor> in = {bytes_tensor(byte_type(as), ad, seed++),
                                              Tensor::scalar<float>(0.05f),
                                              bytes_tensor(byte_type(as), {}, seed++),
                                              bytes_tensor(byte_type(bs), bd, seed++),
                                              bscale,
                                              bytes_tensor(byte_type(bs), pd, seed++),
                                              Tensor::scalar<float>(0.3f),
                                              bytes_tensor(byte_type(ys), {}, seed++)};
              for (bool constant_b : {false, true})
                expect_node_matches("QLinearMatMul", in,
                                    {false, true, true, constant_b, true, true, true, true}, {}, 1,
                                    cfg + ", QLinearMatMul " + dims_str(ad) + " x " + dims_str(bd) +
                                        " types " + std::to_string(types) +
                                        (per_col ? " per column" : "") +
                                        (constant_b ? " (constant B)" : ""),
                                    10);
            }
      },
      false);
}

// The requantization at its edges, bit for bit: per-column multipliers that are NaN, +-Inf, 0,
// huge and tiny (NaN results go to 0, Inf to the bounds), an output scale that puts most values
// past both ends of the range, and ones that put many on ties; N = 45 (16- and 8-column steps and
// a scalar tail), uint8 and int8 outputs.
TEST(CpuInt8Kernels, QLinearMatMulRequantizesTheEdges) {
  const float inf = std::numeric_limits<float>::infinity();
  const float special[] = {
      std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, 1e30f, 1e-30f, -0.01f};
  for_each_config(
      [&](const std::string& cfg) {
        uint32_t seed = 700;
        const int64_t N = 45;
        for (int types = 0; types < 8; ++types)
          for (float y_scale : {0.01f, 0.5f, 4.0f}) {
            const bool as = types & 1, bs = types & 2, ys = types & 4;
            Tensor bscale = f32_tensor({N}, seed++, 0.002f, 0.02f);
            for (size_t i = 0; i < std::size(special); ++i)
              bscale.data<float>()[i * 6 % N] = special[i];
            // Scales that are powers of two make acc * mult land on halves (ties).
            if (y_scale == 4.0f)
              for (int64_t j = 1; j < N; j += 2) bscale.data<float>()[j] = 0.03125f;
            const std::vector<Tensor> in = {bytes_tensor(byte_type(as), {9, 37}, seed++),
                                            Tensor::scalar<float>(0.25f),
                                            bytes_tensor(byte_type(as), {}, seed++),
                                            bytes_tensor(byte_type(bs), {37, N}, seed++),
                                            bscale,
                                            bytes_tensor(byte_type(bs), {N}, seed++),
                                            Tensor::scalar<float>(y_scale),
                                            bytes_tensor(byte_type(ys), {}, seed++)};
            expect_node_matches("QLinearMatMul", in,
                                {false, true, true, true, true, true, true, true}, {}, 1,
                                cfg + ", QLinearMatMul edges types " + std::to_string(types) +
                                    " y_scale " + std::to_string(y_scale),
                                10);
          }
      },
      false);
}

TEST(CpuInt8Kernels, DynamicQuantizeMatMulMatchesTheReference) {
  // A's values span both signs or one (a zero point of 0 or 255), or are all zero (scale 1).
  // On 1 and 2 threads; the last three have the work to run on both (in one range of A): M < 16
  // and M = 1 against a wide B (the columns split), M past two row panels with tails in N and K
  // (the rows split, each task quantizing its own).
  const std::vector<std::pair<Dims, Dims>> cases = {
      {{7, 13}, {13, 5}},     {{1, 70}, {70, 33}},     {{2, 3, 9}, {9, 17}},
      {{40, 100}, {100, 70}}, {{13}, {13, 4}},         {{0, 5}, {5, 3}},
      {{3, 0}, {0, 6}},       {{11, 250}, {250, 390}}, {{2, 65, 77}, {77, 131}},
      {{1, 600}, {600, 1030}}};
  for_each_config([&](const std::string& cfg) {
    uint32_t seed = 500;
    for (const auto& [ad, bd] : cases)
      for (int range = 0; range < (ad.back() * bd.back() > 1 << 16 ? 1 : 3); ++range)
        for (int form = 0; form < 16; ++form) {  // B signed, per-column params, bias, B's zp
          const bool bs = form & 1, per_col = form & 2, bias = form & 4, zp = !(form & 8);
          const int64_t N = bd[1];
          const Dims pd = per_col ? Dims{N} : Dims{1};
          const float lo = range == 1 ? 0.5f : -3.0f, hi = range == 2 ? -0.25f : 2.0f;
          Tensor a = f32_tensor(ad, seed++, lo, hi);
          std::vector<Tensor> in = {a, bytes_tensor(byte_type(bs), bd, seed++),
                                    f32_tensor(pd, seed++, 0.002f, 0.02f),
                                    zp ? bytes_tensor(byte_type(bs), pd, seed++) : Tensor()};
          if (bias) in.push_back(f32_tensor({N}, seed++, -1.0f, 1.0f));
          for (int64_t per_row = 0; per_row < 2; ++per_row)
            for (bool constant_b : {false, true}) {
              Attributes attrs;
              attrs.set("per_row", per_row);
              expect_node_matches(
                  "DynamicQuantizeMatMul", in, {false, constant_b, true, true, true}, attrs, 1,
                  cfg + ", DynamicQuantizeMatMul " + dims_str(ad) + " x " + dims_str(bd) +
                      " range " + std::to_string(range) + " form " + std::to_string(form) +
                      (per_row ? " per row" : "") + (constant_b ? " (constant B)" : ""),
                  10);
            }
        }
  });
}

// ---- MatMulNBits ----

// One MatMulNBits node's operands: A [rows..., K], B [N, blocks, blob] of random codes, scales,
// zero points (0: none, 1: packed uint8, 2: float), g_idx (0: none, 1: whole blocks scattered over
// K, 2: the plain k / block_size, 3: blocks of uneven sizes), bias.
struct NBitsCase {
  Dims a;
  int64_t n, bits, block;
  int zp, g_idx;
  bool bias;
};

std::vector<Tensor> nbits_inputs(const NBitsCase& c, uint32_t seed) {
  const int64_t K = c.a.back(), blocks = (K + c.block - 1) / c.block;
  const int64_t blob = c.block * c.bits / 8, zp_row = (blocks * c.bits + 7) / 8;
  std::vector<Tensor> in = {f32_tensor(c.a, seed, -2.0f, 2.0f),
                            bytes_tensor(DType::kU8, {c.n, blocks, blob}, seed + 1),
                            f32_tensor({c.n * blocks}, seed + 2, 0.002f, 0.05f),
                            Tensor(),
                            Tensor(),
                            Tensor()};
  if (c.zp == 1) in[3] = bytes_tensor(DType::kU8, {c.n * zp_row}, seed + 3);
  if (c.zp == 2) in[3] = f32_tensor({c.n * blocks}, seed + 3, 0.0f, float(1 << c.bits));
  if (c.g_idx) {
    std::vector<int32_t> g(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k)
      g[k] = static_cast<int32_t>(c.g_idx == 1   ? (k * 7 + 3) % blocks
                                  : c.g_idx == 2 ? k / c.block
                                                 : (k < K / 2 ? 0 : k % blocks));
    in[4] = Tensor::from_vector(g, {K});
  }
  if (c.bias) in[5] = f32_tensor({c.n}, seed + 4, -1.0f, 1.0f);
  while (!in.back().defined()) in.pop_back();
  return in;
}

Attributes nbits_attrs(const NBitsCase& c, int64_t accuracy_level) {
  Attributes attrs;
  attrs.set("K", c.a.back());
  attrs.set("N", c.n);
  attrs.set("bits", c.bits);
  attrs.set("block_size", c.block);
  attrs.set("accuracy_level", accuracy_level);
  return attrs;
}

const std::vector<NBitsCase> kNBitsCases = {
    {{1, 64}, 16, 4, 32, 1, 0, true},     {{3, 100}, 37, 4, 32, 1, 0, true},
    {{2, 5, 96}, 20, 4, 16, 0, 0, false}, {{9, 130}, 33, 4, 64, 1, 0, true},
    {{70, 48}, 18, 4, 16, 0, 0, true},    {{1, 300}, 70, 4, 128, 1, 0, false},
    {{4, 100}, 24, 8, 32, 1, 0, true},    {{5, 100}, 24, 2, 32, 0, 0, true},
    {{2, 64}, 33, 2, 16, 1, 0, false},    {{1, 200}, 37, 8, 64, 0, 0, true},
    {{11, 72}, 16, 8, 16, 1, 0, false},   {{3, 70}, 40, 4, 32, 2, 0, true},
    {{1, 64}, 20, 8, 32, 2, 0, false},    {{6, 96}, 17, 4, 16, 1, 1, true},
    {{4, 80}, 17, 4, 16, 1, 2, true},     {{2, 96}, 20, 8, 16, 0, 1, false},
    {{3, 96}, 17, 4, 16, 1, 3, true},     {{0, 64}, 16, 4, 32, 1, 0, false},
    {{2, 520}, 4001, 8, 32, 1, 0, true}};  // panels of 2.2 MB (on huge pages), K past whole blocks

// The float32 forms' tolerance against the reference's double sums, relative to |y| + 1: the sums
// of K products of |a| <= 2 and |w| <= 13 round more with K (K 520: 4.6e-5 where |y| ~ 0.1).
double nbits_tolerance(const NBitsCase& c) {
  return 2e-5 * std::max(1.0, static_cast<double>(c.a.back()) / 128.0);
}

// At accuracy_level 0 the kernel's float32 products against the reference's (double sums of the
// same dequantized weight): the panels (constant operands: 2/4/8-bit codes, uint8, float or no
// zero points, a plain g_idx or one whose whole blocks are scattered over K), and the dequantized
// blocks + GEMM (blocks of uneven sizes, a B fed at run time).
TEST(CpuNBitsKernel, MatchesTheReference) {
  for_each_config([&](const std::string& cfg) {
    uint32_t seed = 900;
    for (const NBitsCase& c : kNBitsCases)
      for (bool constant : {true, false}) {
        const std::vector<Tensor> in = nbits_inputs(c, seed += 10);
        expect_node_matches("MatMulNBits", in, {false, constant, true, true, true, true},
                            nbits_attrs(c, 0), 1,
                            cfg + ", MatMulNBits " + dims_str(c.a) + " x " + std::to_string(c.n) +
                                " bits " + std::to_string(c.bits) + " block " +
                                std::to_string(c.block) + (constant ? " (constant B)" : ""),
                            21, "cpu", nbits_tolerance(c));
      }
  });
}

// At accuracy_level 4 the int8 form (AVX512_VNNI; panels, in the forms onnxruntime quantizes A
// for) quantizes A per row and block as onnxruntime does; against that arithmetic written out
// here (integer dot products, the float epilogue in double). Where the form does not run (other
// ISAs, VNNI off, float zero points, 2-bit codes with zero points) the float32 form must match the
// reference instead.
TEST(CpuNBitsKernel, Int8FormMatchesAnIntegerLoop) {
  for_each_config([&](const std::string& cfg) {
    uint32_t seed = 1900;
    for (const NBitsCase& c : kNBitsCases) {
      if (c.g_idx == 1 || c.g_idx == 3) continue;  // K reordered or per call: no int8 form
      const std::vector<Tensor> in = nbits_inputs(c, seed += 10);
      Graph g;
      std::vector<ValueId> ins = {g.add_input("a", {DType::kF32, to_shape(c.a)})};
      for (size_t i = 1; i < in.size(); ++i) {
        ins.push_back(in[i].defined() ? g.add_value(cat("c", i)) : kNoValue);
        if (in[i].defined()) g.set_initializer(ins.back(), in[i]);
      }
      const ValueId y = g.add_value("y");
      g.add_node("MatMulNBits", ins, {y}, nbits_attrs(c, 4), "node");
      g.add_output(y);
      const Executable exe = compile(g, {.level = 0});
      const Tensor got = exe.run({in[0]})[0];
      const std::string what = cfg + ", int8 form " + dims_str(c.a) + " x " + std::to_string(c.n);
      // onnxruntime's forms: not float zero points, nor 2-bit codes with zero points.
      const bool int8_form = c.zp != 2 && !(c.bits == 2 && c.zp == 1) &&
                             isa_name(active_isa()) == std::string("avx512") &&
                             has_ext(Ext::kAvx512Vnni);
      EXPECT_EQ(exe.describe_step(0).find("int8") != std::string::npos, int8_form) << what;
      if (!int8_form) {
        expect_node_matches("MatMulNBits", in, {false, true, true, true, true, true},
                            nbits_attrs(c, 4), 1, what + " (float32 form)", 21, "cpu",
                            nbits_tolerance(c));
        continue;
      }
      const int64_t K = c.a.back(), N = c.n, blocks = (K + c.block - 1) / c.block;
      const int64_t M = in[0].numel() / K, zp_row = (blocks * c.bits + 7) / 8;
      const float* a = in[0].data<float>();
      const uint8_t* codes = in[1].data<uint8_t>();
      ASSERT_EQ(got.numel(), M * N) << what;
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          double want = c.bias ? in[5].data<float>()[n] : 0.0;
          for (int64_t b = 0; b < blocks; ++b) {
            float amax = 0.0f;
            for (int64_t k = b * c.block; k < std::min(K, (b + 1) * c.block); ++k)
              amax = std::max(amax, std::fabs(a[m * K + k]));
            const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
            // The j-th `bits`-wide value of a packed row, low bits first.
            auto packed = [&](const uint8_t* p, int64_t j) {
              return (p[j * c.bits / 8] >> (j * c.bits % 8)) & ((1 << c.bits) - 1);
            };
            const double zero = c.zp == 2   ? in[3].data<float>()[n * blocks + b]
                                : c.zp == 1 ? packed(in[3].data<uint8_t>() + n * zp_row, b)
                                            : 1 << (c.bits - 1);
            const uint8_t* row = codes + n * blocks * c.block * c.bits / 8;
            double dot = 0;
            for (int64_t k = b * c.block; k < std::min(K, (b + 1) * c.block); ++k)
              dot += (packed(row, k) - zero) * std::nearbyint(a[m * K + k] * inv);
            want += double{in[2].data<float>()[n * blocks + b]} * (amax / 127.0f) * dot;
          }
          const double x = got.data<float>()[m * N + n];
          EXPECT_NEAR(x, want, 1e-5 * (std::fabs(want) + 1.0))
              << what << " [" << m << ", " << n << "]";
        }
      }
    }
  });
}

// ---- ConvInteger and QLinearConv ----

// The integer convs' transposes (quant.h: bytes and int32) against an index loop on every ISA:
// bands of 64 / 32 / 16 rows, 16 x 16 and 8 x 8 tiles, partial tiles in both directions, one row
// or column, strides wider than the block.
template <class T, class F>
void check_transpose(F transpose) {
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1},   {1, 77},   {77, 1},   {16, 16},  {16, 64},
                                               {32, 96}, {7, 13},   {24, 200}, {17, 33},  {48, 145},
                                               {64, 64}, {33, 130}, {15, 71},  {100, 24}, {40, 40}};
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    uint32_t seed = 40;
    for (const auto& [rows, cols] : sizes) {
      const int64_t ldx = cols + 3, ldy = rows + 5;
      std::vector<T> x(static_cast<size_t>(rows * ldx));
      std::mt19937 rng(seed++);
      for (T& v : x) v = static_cast<T>(rng());
      const T gap = static_cast<T>(0xAB);
      std::vector<T> y(static_cast<size_t>(cols * ldy), gap);
      transpose(x.data(), ldx, y.data(), ldy, rows, cols);
      int bad = 0;
      for (int64_t q = 0; q < cols; ++q)
        for (int64_t r = 0; r < ldy; ++r) {
          const T want = r < rows ? x[r * ldx + q] : gap;  // the gaps left alone
          if (y[q * ldy + r] != want && bad++ < 3)
            ADD_FAILURE() << isa_name(isa) << " " << sizeof(T) << "-byte " << rows << " x " << cols
                          << ": y[" << q << ", " << r << "] = " << int64_t{y[q * ldy + r]}
                          << ", want " << int64_t{want};
        }
    }
  }
}

TEST(CpuInt8Kernels, TransposesMatchAnIndexLoop) {
  check_transpose<uint8_t>(
      [](const uint8_t* x, int64_t ldx, uint8_t* y, int64_t ldy, int64_t rows, int64_t cols) {
        PTO_ISA_DISPATCH(transpose_bytes, x, ldx, y, ldy, rows, cols);
      });
  check_transpose<int32_t>(
      [](const int32_t* x, int64_t ldx, int32_t* y, int64_t ldy, int64_t rows, int64_t cols) {
        PTO_ISA_DISPATCH(transpose_s32, x, ldx, y, ldy, rows, cols);
      });
}

struct ConvCase {
  Dims x, w;
  Dims strides, pads, dilations;
  int64_t group = 1;
  std::string auto_pad;
};

Attributes conv_attrs(const ConvCase& k) {
  Attributes at;
  if (!k.strides.empty()) at.set("strides", k.strides);
  if (!k.pads.empty()) at.set("pads", k.pads);
  if (!k.dilations.empty()) at.set("dilations", k.dilations);
  if (k.group != 1) at.set("group", k.group);
  if (!k.auto_pad.empty()) at.set("auto_pad", k.auto_pad);
  return at;
}

// General (im2col, one run per kernel row or per tap), 1x1 (no im2col), grouped, depthwise (with
// a channel multiplier), 1-D, auto_pad; odd channel counts, K not a multiple of 4.
const std::vector<ConvCase> kConvCases = {
    {{1, 3, 7, 9}, {5, 3, 3, 3}, {}, {1, 1, 1, 1}},
    {{2, 8, 6, 5}, {6, 8, 1, 1}},
    {{1, 6, 9, 8}, {6, 3, 3, 2}, {2, 2}, {0, 1, 2, 1}, {2, 1}, 2},
    {{2, 5, 7, 7}, {5, 1, 3, 3}, {2, 2}, {1, 1, 1, 1}, {}, 5},
    {{1, 3, 6, 6}, {6, 1, 3, 3}, {1, 1}, {0, 2, 1, 0}, {}, 3},
    {{2, 4, 11}, {7, 4, 3}, {2}, {1, 1}},
    {{1, 4, 8, 7}, {9, 4, 3, 3}, {2, 2}, {}, {}, 1, "SAME_UPPER"},
    {{1, 16, 7, 7}, {20, 16, 1, 1}, {2, 2}},
    {{1, 32, 10, 10}, {33, 32, 3, 3}, {}, {1, 0, 1, 2}, {1, 2}},
    {{1, 12, 5, 6}, {20, 3, 3, 3}, {}, {1, 1, 1, 1}, {}, 4},
    // Planes cut into several row chunks, the last one short; 1x1 (rows transposed per chunk) and
    // 3x3 (im2col per chunk), output channels not a multiple of 8.
    {{2, 20, 41, 45}, {27, 20, 1, 1}},
    {{1, 9, 33, 35}, {13, 9, 3, 3}, {}, {1, 1, 1, 1}},
};

std::string conv_what(const std::string& cfg, const std::string& op, const ConvCase& k, int types,
                      bool per_channel, bool constant_w) {
  return cfg + ", " + op + " x " + dims_str(k.x) + " w " + dims_str(k.w) + " group " +
         std::to_string(k.group) + " types " + std::to_string(types) +
         (per_channel ? " per channel" : "") + (constant_w ? " (constant W)" : "");
}

// Depthwise convs (one input channel per group) on the vectorized path: 3x3 stride 1 and 2 with
// pads on planes with vector tails, a channel multiplier, 5x5, dilation and asymmetric pads,
// mixed strides, 1-D; a 17x17 kernel (289 taps, past the float kernel's exact range) on the
// integer loop.
const std::vector<ConvCase> kDepthwiseCases = {
    {{1, 24, 17, 19}, {24, 1, 3, 3}, {}, {1, 1, 1, 1}, {}, 24},
    {{2, 19, 23, 37}, {19, 1, 3, 3}, {2, 2}, {1, 1, 1, 1}, {}, 19},
    {{1, 8, 40, 33}, {16, 1, 5, 5}, {2, 2}, {2, 2, 2, 2}, {}, 8},
    {{1, 5, 9, 10}, {5, 1, 3, 3}, {}, {2, 1, 0, 2}, {2, 2}, 5},
    {{1, 6, 12, 29}, {6, 1, 3, 2}, {1, 2}, {1, 0, 1, 1}, {}, 6},
    {{2, 6, 33}, {6, 1, 3}, {2}, {1, 1}, {}, 6},
    {{1, 3, 20, 20}, {3, 1, 17, 17}, {}, {8, 8, 8, 8}, {}, 3},
    // Output planes of at most 14x14 (channels-last, channels in vector lanes): channel counts
    // past a vector with a tail, stride 2 down to 7x7, 5x5.
    {{2, 37, 7, 7}, {37, 1, 3, 3}, {}, {1, 1, 1, 1}, {}, 37},
    {{1, 40, 14, 14}, {40, 1, 3, 3}, {2, 2}, {1, 1, 1, 1}, {}, 40},
    {{1, 20, 9, 11}, {20, 1, 5, 5}, {}, {2, 2, 2, 2}, {}, 20},
    // Channels-last rows in blocks of 4 pixels with taps inside the row: dilated, and stride 2
    // on a 14x14 output with the pixels at both edges outside.
    {{1, 18, 13, 12}, {18, 1, 3, 3}, {}, {2, 2, 2, 2}, {2, 2}, 18},
    {{1, 17, 27, 27}, {17, 1, 3, 3}, {2, 2}, {1, 1, 1, 1}, {}, 17},
};

void check_conv_integer(const std::vector<ConvCase>& cases, uint32_t first_seed) {
  for_each_config(
      [&](const std::string& cfg) {
        uint32_t seed = first_seed;
        for (const ConvCase& k : cases)
          for (int types = 0; types < 4; ++types)
            for (int zp = 0; zp < 3; ++zp) {  // none, per tensor, w per output channel
              const bool xs = types & 1, ws = types & 2, constant_w = (seed & 1) != 0;
              std::vector<Tensor> in = {bytes_tensor(byte_type(xs), k.x, seed++),
                                        bytes_tensor(byte_type(ws), k.w, seed++)};
              if (zp) {
                in.push_back(bytes_tensor(byte_type(xs), {}, seed++));
                in.push_back(bytes_tensor(byte_type(ws), zp == 2 ? Dims{k.w[0]} : Dims{}, seed++));
              }
              expect_node_matches("ConvInteger", in, {false, constant_w, true, true}, conv_attrs(k),
                                  1, conv_what(cfg, "ConvInteger", k, types, zp == 2, constant_w),
                                  10);
            }
      },
      false);
}

void check_qlinear_conv(const std::vector<ConvCase>& cases, uint32_t first_seed) {
  for_each_config([&](const std::string& cfg) {
    uint32_t seed = first_seed;
    for (const ConvCase& k : cases)
      for (int types = 0; types < 8; ++types)
        for (bool per_channel : {false, true}) {
          const bool xs = types & 1, ws = types & 2, ys = types & 4;
          const bool constant_w = (seed & 1) != 0, with_bias = (seed & 2) != 0;
          const Dims pd = per_channel ? Dims{k.w[0]} : Dims{};
          // Output scales around the accumulators' spread, so that the requantized values
          // land inside the range, and some ties: the bias moves the sum by whole units.
          std::vector<Tensor> in = {bytes_tensor(byte_type(xs), k.x, seed++),
                                    Tensor::scalar<float>(0.05f),
                                    bytes_tensor(byte_type(xs), {}, seed++),
                                    bytes_tensor(byte_type(ws), k.w, seed++),
                                    f32_tensor(pd, seed++, 0.002f, 0.02f),
                                    bytes_tensor(byte_type(ws), pd, seed++),
                                    Tensor::scalar<float>(0.5f),
                                    bytes_tensor(byte_type(ys), {}, seed++)};
          if (with_bias) {
            Tensor bias = Tensor::empty(DType::kI32, {k.w[0]});
            std::mt19937 rng(seed++);
            std::uniform_int_distribution<int32_t> d(-20000, 20000);
            for (int64_t i = 0; i < k.w[0]; ++i) bias.data<int32_t>()[i] = d(rng);
            in.push_back(bias);
          }
          expect_node_matches("QLinearConv", in,
                              {false, true, true, constant_w, true, true, true, true, true},
                              conv_attrs(k), 1,
                              conv_what(cfg, "QLinearConv", k, types, per_channel, constant_w) +
                                  (with_bias ? " bias" : ""),
                              10);
        }
  });
}

TEST(CpuInt8Kernels, ConvIntegerMatchesTheReference) {
  check_conv_integer(kConvCases, 900);
}

TEST(CpuInt8Kernels, QLinearConvMatchesTheReference) {
  check_qlinear_conv(kConvCases, 1300);
}

TEST(CpuInt8Kernels, DepthwiseConvIntegerMatchesTheReference) {
  check_conv_integer(kDepthwiseCases, 2100);
}

TEST(CpuInt8Kernels, DepthwiseQLinearConvMatchesTheReference) {
  check_qlinear_conv(kDepthwiseCases, 2500);
}

// The largest sums the float depthwise kernels take exactly: 16x16 = 256 taps of |x - x_zp| =
// |w - w_zp| = 255, -256 * 255 * 255 = -16646400 (just under 2^24), on a 5x5 output plane
// (channels-last) and a 5x64 one (per plane); and the 17x17 kernel past the bound.
TEST(CpuInt8Kernels, DepthwiseConvIntegerIsExactAtTheExtremes) {
  for (auto [kk, ow] : {std::pair<int64_t, int64_t>{16, 5}, {16, 64}, {17, 5}}) {
    auto filled = [](DType dt, const Dims& shape, uint8_t v) {
      Tensor t = Tensor::empty(dt, shape);
      std::memset(t.raw_data(), v, static_cast<size_t>(t.numel()));
      return t;
    };
    const std::vector<Tensor> in = {filled(DType::kU8, {1, 2, kk + 3, kk + ow - 4}, 255),
                                    filled(DType::kI8, {2, 1, kk, kk}, 0x80),
                                    filled(DType::kU8, {}, 0), filled(DType::kI8, {}, 127)};
    ConvCase k{{}, {}, {}, {1, 2, 0, 1}, {}, 2};
    for_each_config(
        [&](const std::string& cfg) {
          expect_node_matches("ConvInteger", in, {false, true, true, true}, conv_attrs(k), 1,
                              cfg + ", " + std::to_string(kk) + "x" + std::to_string(kk) +
                                  " output width " + std::to_string(ow),
                              10);
        },
        false);
  }
}

// A requantized depthwise conv whose int32 bias sits at each of its paths' bounds: inside the
// float sums (|bias| + taps * 255^2 < 2^24), just past that (added to the int32 sums), past
// int32's room (one pixel at a time), on per-plane (30x30) and channels-last (7x7) planes; x and
// w at their extremes so that the sums reach taps * 255^2, and an output scale that keeps the
// results inside the range.
TEST(CpuInt8Kernels, DepthwiseQLinearConvBiasesAtTheBounds) {
  const int32_t edge = (1 << 24) - 9 * 255 * 255;
  const int32_t biases[] = {edge - 1,  -(edge - 1), edge,       -edge, 1 << 24,
                            INT32_MAX, INT32_MIN,   -(1 << 24), 0};
  const int64_t c = static_cast<int64_t>(std::size(biases));
  for (int64_t side : {30, 7})
    for_each_config(
        [&](const std::string& cfg) {
          Tensor x = bytes_tensor(DType::kU8, {1, c, side, side}, 90);
          std::fill_n(static_cast<uint8_t*>(x.raw_data()), side * side, uint8_t{255});
          Tensor w = bytes_tensor(DType::kI8, {c, 1, 3, 3}, 91);
          std::fill_n(static_cast<uint8_t*>(w.raw_data()), 9, uint8_t{0x80});
          Tensor bias = Tensor::empty(DType::kI32, {c});
          std::copy(std::begin(biases), std::end(biases), bias.data<int32_t>());
          const std::vector<Tensor> in = {x,
                                          Tensor::scalar<float>(1.0f),
                                          Tensor::scalar<uint8_t>(0),
                                          w,
                                          Tensor::scalar<float>(1.0f),
                                          Tensor::scalar<int8_t>(127),
                                          Tensor::scalar<float>(131072.0f),
                                          Tensor::scalar<uint8_t>(128),
                                          bias};
          ConvCase k{{}, {}, {}, {1, 1, 1, 1}, {}, c};
          expect_node_matches("QLinearConv", in,
                              {false, true, true, true, true, true, true, true, true},
                              conv_attrs(k), 1, cfg + ", side " + std::to_string(side), 10);
        },
        false);
}

// The GEMM path's requantization with int32 biases whose sums with the accumulators overflow
// int32 in some lanes of a 16-column step and not in others (the bias then joins in double, as
// the reference's exact sum): 45 output channels, biases over all of int32 and at both ends, an
// output scale that leaves the smaller ones inside the range.
TEST(CpuInt8Kernels, QLinearConvBiasesThatOverflowInt32) {
  for_each_config(
      [&](const std::string& cfg) {
        const int64_t m = 45;
        Tensor bias = Tensor::empty(DType::kI32, {m});
        std::mt19937 rng(93);
        for (int64_t i = 0; i < m; ++i)
          bias.data<int32_t>()[i] =
              i % 3 == 0 ? static_cast<int32_t>(rng())
                         : (i % 3 == 1 ? INT32_MAX - static_cast<int32_t>(rng() % 1000)
                                       : INT32_MIN + static_cast<int32_t>(rng() % 1000));
        bias.data<int32_t>()[4] = 1000;
        bias.data<int32_t>()[5] = -1000;
        for (bool xs : {false, true}) {
          const std::vector<Tensor> in = {bytes_tensor(byte_type(xs), {1, 40, 6, 7}, 94),
                                          Tensor::scalar<float>(1.0f),
                                          bytes_tensor(byte_type(xs), {}, 95),
                                          bytes_tensor(DType::kI8, {m, 40, 1, 1}, 96),
                                          Tensor::scalar<float>(1.0f),
                                          bytes_tensor(DType::kI8, {}, 97),
                                          Tensor::scalar<float>(1024.0f),
                                          bytes_tensor(byte_type(xs), {}, 98),
                                          bias};
          expect_node_matches("QLinearConv", in,
                              {false, true, true, true, true, true, true, true, true}, {}, 1,
                              cfg + (xs ? ", int8" : ", uint8"), 10);
        }
      },
      false);
}

// Shape inference of the integer convs gives the output's shape (and the kernels run).
TEST(CpuInt8Kernels, IntegerConvsInferTheOutputShape) {
  Graph g;
  const ValueId x = g.add_input("x", {DType::kU8, to_shape({2, 8, 9, 9})});
  const ValueId w = g.add_value("w"), y = g.add_value("y");
  g.set_initializer(w, bytes_tensor(DType::kI8, {4, 8, 3, 3}, 1));
  Attributes at;
  at.set("strides", Dims{2, 2});
  at.set("pads", Dims{1, 1, 1, 1});
  g.add_node("ConvInteger", {x, w}, {y}, at, "node", 10);
  g.add_output(y);
  Executable exe = compile(g, {.level = 0});
  const TensorType& t = exe.graph().value(exe.graph().outputs()[0]).type;
  ASSERT_TRUE(t.shape.has_value());
  EXPECT_EQ(t.shape->size(), 4u);
  EXPECT_EQ(t.dtype, DType::kI32);
  const Tensor out = exe.run({bytes_tensor(DType::kU8, {2, 8, 9, 9}, 2)}).at(0);
  EXPECT_EQ(out.shape(), (Dims{2, 4, 5, 5}));
  for (size_t i = 0; i < t.shape->size(); ++i) {
    ASSERT_TRUE((*t.shape)[i].is_known());
    EXPECT_EQ((*t.shape)[i].value, out.dim(static_cast<int64_t>(i)));
  }
}

// Values on the rounding boundaries (x / scale = k + 0.5), beyond the range, and NaN and Inf.
Tensor quantize_input(const Dims& shape, uint32_t seed, float scale) {
  Tensor t = f32_tensor(shape, seed, -40.0f * scale, 300.0f * scale);
  float* x = t.data<float>();
  const float special[] = {0.5f * scale,
                           1.5f * scale,
                           2.5f * scale,
                           -0.5f * scale,
                           -1e9f,
                           1e9f,
                           std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  for (int64_t i = 0; i < t.numel(); i += 7) x[i] = special[(i / 7) % 9];
  return t;
}

TEST(CpuInt8Kernels, QuantizeAndDequantizeMatchTheReference) {
  const std::vector<Dims> shapes = {{1}, {37}, {3, 17}, {2, 5, 33}, {4, 70}};
  for_each_config([&](const std::string& cfg) {
    uint32_t seed = 500;
    for (const Dims& shape : shapes)
      for (bool is_signed : {false, true})
        for (int64_t axis = -1; axis < static_cast<int64_t>(shape.size()); ++axis) {
          // axis -1: per tensor; else per axis.
          const Dims pd = axis < 0 ? Dims{} : Dims{shape[axis]};
          Tensor scale = f32_tensor(pd, seed++, 0.01f, 0.1f);
          Tensor zp = bytes_tensor(byte_type(is_signed), pd, seed++);
          Attributes at;
          at.set("axis", axis < 0 ? int64_t{1} : axis);
          const std::string what = cfg + " " + dims_str(shape) + (is_signed ? " int8" : " uint8") +
                                   " axis " + std::to_string(axis);
          expect_node_matches("QuantizeLinear",
                              {quantize_input(shape, seed++, scale.data<float>()[0]), scale, zp},
                              {false, true, true}, at, 1, "QuantizeLinear " + what);
          expect_node_matches("DequantizeLinear",
                              {bytes_tensor(byte_type(is_signed), shape, seed++), scale, zp},
                              {false, true, true}, at, 1, "DequantizeLinear " + what);
          if (axis < 0 && !is_signed) {  // no zero point: uint8, zero
            expect_node_matches("QuantizeLinear",
                                {quantize_input(shape, seed++, scale.data<float>()[0]), scale},
                                {false, true}, at, 1, "QuantizeLinear (no zp) " + what);
            expect_node_matches("DequantizeLinear",
                                {bytes_tensor(DType::kU8, shape, seed++), scale}, {false, true}, at,
                                1, "DequantizeLinear (no zp) " + what);
          }
        }
    // Blocked quantization is left to the reference.
    Attributes blocked;
    blocked.set("axis", int64_t{1});
    blocked.set("block_size", int64_t{2});
    expect_node_matches("DequantizeLinear",
                        {bytes_tensor(DType::kU8, {3, 4}, 9), f32_tensor({3, 2}, 10, 0.1f, 1.0f),
                         bytes_tensor(DType::kU8, {3, 2}, 11)},
                        {false, true, true}, blocked, 1, "blocked " + cfg, 21, "reference");
  });
}

TEST(CpuInt8Kernels, DynamicQuantizeLinearMatchesTheReference) {
  const std::vector<Dims> shapes = {{1}, {37}, {3, 17}, {128, 768}, {70000}};
  for_each_config([&](const std::string& cfg) {
    uint32_t seed = 700;
    for (const Dims& shape : shapes)
      for (int range = 0; range < 4; ++range) {
        // Mixed signs, all positive, all negative, all zero.
        const float lo = range == 1 ? 0.5f : -3.0f, hi = range == 2 ? -0.5f : 5.0f;
        Tensor x = f32_tensor(shape, seed++, lo, hi);
        if (range == 3)
          for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.0f;
        if (range == 0 && x.numel() > 10) x.data<float>()[3] = std::nanf("");
        expect_node_matches(
            "DynamicQuantizeLinear", {x}, {false}, {}, 3,
            cfg + ", DynamicQuantizeLinear " + dims_str(shape) + " range " + std::to_string(range),
            11);
      }
  });
}

}  // namespace
}  // namespace pto::cpu
