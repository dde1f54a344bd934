// The tile interpreter, compiled once per ISA (tile_exec_<isa>.cpp): runs a tile program's
// instructions in order on one tile, each one a vector loop over the tile (rows * width values,
// a few KiB, so every register stays in L1).
//
// A register is a pointer and an index mask: p[i & m]. Loads of contiguous float inputs alias the
// input (no copy); a value that is the same over the whole tile (a broadcast scalar, a constant,
// anything computed from those only) lives in a 16-float splat with m = 0 and is computed once;
// other results go to the register's scratch buffer, or straight into an output when the
// executor marked the instruction `direct` (its result is what a later store writes).
#pragma once

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/elementwise_ops.h"
#include "backend/cpu/tile_exec.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int L = Vec::kLanes;
constexpr int kSplat = 16;  // floats in a splat: the widest Vec

struct Src {
  const float* p;
  int64_t m;  // -1: a full tile; 0: one value, splat
  Vec at(int64_t i) const { return Vec::load(p + (i & m)); }
  Vec at(int64_t i, int k) const { return Vec::load(p + (i & m), k); }
};

// The two kinds of source a vector loop sees, so that it loads a full tile's vector with one
// instruction and keeps a splat in a register: indexing both alike (p[i & m]) cost an AND, an
// address computation and a load per source per vector, which on elementwise chains that run
// from memory at 40 GB/s a core (Zen 4) made the interpreter, not the memory, the limit.
struct Full {
  const float* p;
  Vec at(int64_t i) const { return Vec::load(p + i); }
  Vec at(int64_t i, int k) const { return Vec::load(p + i, k); }
};
struct Splat {
  Vec v;
  Vec at(int64_t) const { return v; }
  Vec at(int64_t, int) const { return v; }
};

// y[i] = f(sources at i) for i < n, two vectors a step to hide latency, a masked tail. With
// `stream`, the full vectors at 64-byte-aligned addresses go past the cache (the caller fences).
template <class F, class... S>
inline void map_loop(int64_t n, float* y, bool stream, F f, S... s) {
  int64_t i = 0;
  if (stream) {
    const auto lane = static_cast<int64_t>(reinterpret_cast<uintptr_t>(y) / sizeof(float) % L);
    if (lane != 0 && n > 0) {  // the unaligned head, stored normally
      const int k = static_cast<int>(n < L - lane ? n : L - lane);
      f(s.at(0, k)...).store(y, k);
      i = k;
    }
    for (; i + 2 * L <= n; i += 2 * L) {
      Vec u = f(s.at(i)...), v = f(s.at(i + L)...);
      u.stream(y + i);
      v.stream(y + i + L);
    }
  }
  for (; i + 2 * L <= n; i += 2 * L) {
    Vec u = f(s.at(i)...), v = f(s.at(i + L)...);
    u.store(y + i);
    v.store(y + i + L);
  }
  for (; i < n; i += L) {
    if (n - i >= L) {
      f(s.at(i)...).store(y + i);
    } else {
      int k = static_cast<int>(n - i);
      f(s.at(i, k)...).store(y + i, k);
    }
  }
}

// Calls g with s as a Splat (m == 0) or a Full source.
template <class G>
inline void with_kind(Src s, G g) {
  if (s.m == 0) return g(Splat{Vec::load(s.p)});
  g(Full{s.p});
}

// map_loop with each source as a Full or a Splat, as its mask says.
template <class F>
inline void map_n(int64_t n, float* y, bool stream, F f, Src a) {
  with_kind(a, [&](auto ka) { map_loop(n, y, stream, f, ka); });
}
template <class F>
inline void map_n(int64_t n, float* y, bool stream, F f, Src a, Src b) {
  with_kind(a, [&](auto ka) { with_kind(b, [&](auto kb) { map_loop(n, y, stream, f, ka, kb); }); });
}
template <class F>
inline void map_n(int64_t n, float* y, bool stream, F f, Src a, Src b, Src c) {
  with_kind(a, [&](auto ka) {
    with_kind(
        b, [&](auto kb) { with_kind(c, [&](auto kc) { map_loop(n, y, stream, f, ka, kb, kc); }); });
  });
}

template <TileUnary Op>
inline Vec tile_unary(Vec x, const UnaryParams& p) {
  const Vec zero = Vec::zero(), one = Vec::set1(1.0f);
  using enum TileUnary;
  if constexpr (Op == kRsqrt) return one / sqrt(x);
  if constexpr (Op == kNot) return select(x == zero, one, zero);
  if constexpr (Op == kIsNaN) return select(is_nan(x), one, zero);
  if constexpr (Op == kIsInf) return select(abs(x) == Vec::set1(INFINITY), one, zero);
  if constexpr (Op == kRoundBf16) return round_bf16(x);
  if constexpr (Op == kRoundF16) {  // F16C where has_ext says so (round_to_f16 dispatches)
    alignas(64) float v[L];
    x.store(v);
    round_to_f16(v, L);
    return Vec::load(v);
  }
#define PTO_TILE_MAP(name) \
  if constexpr (Op == TileUnary::k##name) return unary<UnaryOp::k##name>(x, p);
  // clang-format off
  PTO_TILE_MAP(Neg)
  PTO_TILE_MAP(Abs)
  PTO_TILE_MAP(Exp)
  PTO_TILE_MAP(Expm1)
  PTO_TILE_MAP(Log)
  PTO_TILE_MAP(Log1p)
  PTO_TILE_MAP(Sqrt)
  PTO_TILE_MAP(Reciprocal)
  PTO_TILE_MAP(Square)
  PTO_TILE_MAP(Relu)
  PTO_TILE_MAP(LeakyRelu)
  PTO_TILE_MAP(ThresholdedRelu)
  PTO_TILE_MAP(Sigmoid)
  PTO_TILE_MAP(HardSigmoid)
  PTO_TILE_MAP(HardSwish)
  PTO_TILE_MAP(Tanh)
  PTO_TILE_MAP(Erf)
  PTO_TILE_MAP(Gelu)
  PTO_TILE_MAP(GeluTanh)
  PTO_TILE_MAP(Silu)
  PTO_TILE_MAP(Swish)
  PTO_TILE_MAP(Softplus)
  PTO_TILE_MAP(Softsign)
  PTO_TILE_MAP(Mish)
  PTO_TILE_MAP(Elu)
  PTO_TILE_MAP(Selu)
  PTO_TILE_MAP(Celu)
  PTO_TILE_MAP(Floor)
  PTO_TILE_MAP(Ceil)
  PTO_TILE_MAP(Round)
  PTO_TILE_MAP(Sign)
  PTO_TILE_MAP(PowHalf)
  PTO_TILE_MAP(Sin)
  PTO_TILE_MAP(Cos)
  PTO_TILE_MAP(Shrink)
  // clang-format on
#undef PTO_TILE_MAP
}

inline Vec bool_vec(Mask m) {
  return select(m, Vec::set1(1.0f), Vec::zero());
}

template <TileBinary Op>
inline Vec tile_binary(Vec a, Vec b) {
  using enum TileBinary;
  const Vec zero = Vec::zero();
  if constexpr (Op == kAdd) return a + b;
  if constexpr (Op == kSub) return a - b;
  if constexpr (Op == kMul) return a * b;
  if constexpr (Op == kDiv) return a / b;
  if constexpr (Op == kMax) return select(is_nan(b), b, select(a < b, b, a));
  if constexpr (Op == kMin) return select(is_nan(b), b, select(b < a, b, a));
  if constexpr (Op == kAnd) return bool_vec((a != zero) & (b != zero));
  if constexpr (Op == kOr) return bool_vec((a != zero) | (b != zero));
  if constexpr (Op == kXor) return abs(bool_vec(a != zero) - bool_vec(b != zero));
  if constexpr (Op == kPow) return a;  // element by element in pow_n
}

template <TileCompare Op>
inline Vec tile_compare(Vec a, Vec b) {
  using enum TileCompare;
  if constexpr (Op == kEq) return bool_vec(a == b);
  if constexpr (Op == kNe) return bool_vec(a != b);
  if constexpr (Op == kLt) return bool_vec(a < b);
  if constexpr (Op == kLe) return bool_vec(a <= b);
  if constexpr (Op == kGt) return bool_vec(a > b);
  if constexpr (Op == kGe) return bool_vec(a >= b);
}

// std::pow in double, rounded once to float: the reference's Pow on float32.
inline void pow_n(int64_t n, float* y, Src a, Src b) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = static_cast<float>(
        std::pow(static_cast<double>(a.p[i & a.m]), static_cast<double>(b.p[i & b.m])));
}

// One source: a Full always (a unary op of a splat is uniform, computed on the splat's kSplat
// values).
void unary_n(TileUnary op, const UnaryParams& p, int64_t n, float* y, bool stream, Src a) {
  switch (op) {
#define PTO_TILE_CASE(name, text) \
  case TileUnary::k##name:        \
    return map_loop(              \
        n, y, stream, [&](Vec x) { return tile_unary<TileUnary::k##name>(x, p); }, Full{a.p});
    PTO_TILE_UNARY_OPS(PTO_TILE_CASE)
#undef PTO_TILE_CASE
  }
}

void binary_n(TileBinary op, int64_t n, float* y, bool stream, Src a, Src b) {
  using enum TileBinary;
  auto go = [&]<TileBinary Op>() {
    map_n(
        n, y, stream, [](Vec u, Vec v) { return tile_binary<Op>(u, v); }, a, b);
  };
  switch (op) {
    case kAdd:
      return go.template operator()<kAdd>();
    case kSub:
      return go.template operator()<kSub>();
    case kMul:
      return go.template operator()<kMul>();
    case kDiv:
      return go.template operator()<kDiv>();
    case kMax:
      return go.template operator()<kMax>();
    case kMin:
      return go.template operator()<kMin>();
    case kAnd:
      return go.template operator()<kAnd>();
    case kOr:
      return go.template operator()<kOr>();
    case kXor:
      return go.template operator()<kXor>();
    case kPow:
      return pow_n(n, y, a, b);
  }
}

void compare_n(TileCompare op, int64_t n, float* y, bool stream, Src a, Src b) {
  using enum TileCompare;
  auto go = [&]<TileCompare Op>() {
    map_n(
        n, y, stream, [](Vec u, Vec v) { return tile_compare<Op>(u, v); }, a, b);
  };
  switch (op) {
    case kEq:
      return go.template operator()<kEq>();
    case kNe:
      return go.template operator()<kNe>();
    case kLt:
      return go.template operator()<kLt>();
    case kLe:
      return go.template operator()<kLe>();
    case kGt:
      return go.template operator()<kGt>();
    case kGe:
      return go.template operator()<kGe>();
  }
}

float load_one(const TileOperandView& v, int64_t offset) {
  float x;
  switch (v.dtype) {
    case TileDType::kBool:
      return static_cast<const bool*>(v.ptr)[offset] ? 1.0f : 0.0f;
    case TileDType::kI32:
      return static_cast<float>(static_cast<const int32_t*>(v.ptr)[offset]);
    case TileDType::kBF16:
      bf16_to_f32(static_cast<const uint16_t*>(v.ptr) + offset, &x, 1);
      return x;
    case TileDType::kF16:
      f16_to_f32(static_cast<const uint16_t*>(v.ptr) + offset, &x, 1);
      return x;
    case TileDType::kU8:
      return static_cast<const uint8_t*>(v.ptr)[offset];
    case TileDType::kI8:
      return static_cast<const int8_t*>(v.ptr)[offset];
    case TileDType::kF32:
      break;
  }
  return static_cast<const float*>(v.ptr)[offset];
}

// n values of an integer type to floats (exact for 8-bit; int32 rounds to nearest, as Cast).
template <class T>
void widen_ints(const void* p, int64_t off, int64_t n, float* y) {
  const T* x = static_cast<const T*>(p) + off;
  for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(x[j]);
}

// Row i of a load that cannot alias its input: a copy, a conversion or a fill.
void gather_row(const TileOperandView& v, int64_t i, int64_t width, float* y) {
  const int64_t off = i * v.row_step;
  if (v.col_stride == 0) {
    const float x = load_one(v, off);
    for (int64_t j = 0; j < width; ++j) y[j] = x;
    return;
  }
  switch (v.dtype) {
    case TileDType::kF32:
      std::memcpy(y, static_cast<const float*>(v.ptr) + off, static_cast<size_t>(width) * 4);
      return;
    case TileDType::kI32:
      return widen_ints<int32_t>(v.ptr, off, width, y);
    case TileDType::kU8:
      return widen_ints<uint8_t>(v.ptr, off, width, y);
    case TileDType::kI8:
      return widen_ints<int8_t>(v.ptr, off, width, y);
    case TileDType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(v.ptr) + off, y, width);
    case TileDType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(v.ptr) + off, y, width);
    case TileDType::kBool: {
      const bool* b = static_cast<const bool*>(v.ptr) + off;
      for (int64_t j = 0; j < width; j += L) {
        int k = static_cast<int>(width - j < L ? width - j : L);
        bool_vec(load_bool(b + j, k)).store(y + j, k);
      }
      return;
    }
  }
}

// Stores row i; a half output converts from the register (a splat through a small buffer); a
// float32 one streams past the cache when `stream` says so.
void store_row(const TileOperandView& v, int64_t i, int64_t width, Src a, int64_t a0, bool stream) {
  void* out = const_cast<void*>(v.ptr);
  if (v.dtype == TileDType::kF32) {
    float* y = static_cast<float*>(out) + i * v.row_step;
    if (a.m == 0) {
      for (int64_t j = 0; j < width; ++j) y[j] = a.p[0];
    } else if (a.p + a0 == y) {
      // computed in place (TileArgs::direct), streamed there already if `stream`
    } else if (stream) {
      store_vectors(y, width, true, [&](int64_t j, int k) { return a.at(a0 + j, k); });
    } else {
      std::memmove(y, a.p + a0, static_cast<size_t>(width) * 4);
    }
    return;
  }
  if (v.dtype == TileDType::kBF16 || v.dtype == TileDType::kF16) {
    uint16_t* y = static_cast<uint16_t*>(out) + i * v.row_step;
    auto convert = v.dtype == TileDType::kBF16 ? f32_to_bf16 : f32_to_f16;
    if (a.m != 0) return convert(a.p + a0, y, width);
    uint16_t h;
    convert(a.p, &h, 1);
    for (int64_t j = 0; j < width; ++j) y[j] = h;
    return;
  }
  if (v.dtype == TileDType::kU8 || v.dtype == TileDType::kI8) {  // whole numbers in range
    auto narrow = [&]<class T>(T* y) {
      if (a.m == 0) return static_cast<void>(std::memset(y, static_cast<T>(a.p[0]), width));
      // To int32 a vector at a time (exact: whole numbers), then to bytes in a loop the
      // compiler vectorizes (a truncation, right for values in the type's range).
      alignas(64) int32_t w[256];
      for (int64_t j0 = 0; j0 < width; j0 += 256) {
        const int64_t n = width - j0 < 256 ? width - j0 : 256;
        int64_t j = 0;
        for (; j + L <= n; j += L) {
          const VecI q = to_int(a.at(a0 + j0 + j));
          std::memcpy(w + j, &q, sizeof q);
        }
        for (; j < n; ++j) w[j] = static_cast<int32_t>(a.p[a0 + j0 + j]);
        for (j = 0; j < n; ++j) y[j0 + j] = static_cast<T>(w[j]);
      }
    };
    if (v.dtype == TileDType::kU8) return narrow(static_cast<uint8_t*>(out) + i * v.row_step);
    return narrow(static_cast<int8_t*>(out) + i * v.row_step);
  }
  bool* y = static_cast<bool*>(out) + i * v.row_step;
  for (int64_t j = 0; j < width; j += L) {
    int k = static_cast<int>(width - j < L ? width - j : L);
    store_bool(a.at(a0 + j, k) != Vec::zero(), y + j, k);
  }
}

// y[i * width + j] = fn over row i of a, for every j.
void row_reduce(TileReduce fn, int64_t rows, int64_t width, float* y, Src a) {
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t base = i * width;
    Vec acc = fn == TileReduce::kSum ? Vec::zero()
                                     : Vec::set1(fn == TileReduce::kMax ? -INFINITY : INFINITY);
    int64_t j = 0;
    for (; j + L <= width; j += L) {
      Vec x = a.at(base + j);
      acc = fn == TileReduce::kSum ? acc + x : fn == TileReduce::kMax ? max(acc, x) : min(acc, x);
    }
    float r = fn == TileReduce::kSum   ? reduce_add(acc)
              : fn == TileReduce::kMax ? reduce_max(acc)
                                       : reduce_min(acc);
    for (; j < width; ++j) {  // the tail, one value at a time: lanes past it must not count
      float x = a.p[(base + j) & a.m];
      r = fn == TileReduce::kSum   ? r + x
          : fn == TileReduce::kMax ? (x > r ? x : r)
                                   : (x < r ? x : r);
    }
    for (int64_t k = 0; k < width; ++k) y[base + k] = r;
  }
}

// Instruction `in` (an arithmetic one: unary, binary, compare, clip, select, fma) on m values
// from its sources into y; `streamed`: y's full aligned vectors with streaming stores.
void compute(const TileInstr& in, int64_t m, float* out, bool streamed, Src a, Src b, Src c) {
  switch (in.op) {
    case TileOpcode::kUnary:
      unary_n(static_cast<TileUnary>(in.fn), UnaryParams{in.imm0, in.imm1}, m, out, streamed, a);
      break;
    case TileOpcode::kBinary:
    case TileOpcode::kBinaryImm:
      binary_n(static_cast<TileBinary>(in.fn), m, out, streamed, a, b);
      break;
    case TileOpcode::kCompare:
    case TileOpcode::kCompareImm:
      compare_n(static_cast<TileCompare>(in.fn), m, out, streamed, a, b);
      break;
    case TileOpcode::kClip: {
      const Vec lo = Vec::set1(in.imm0), hi = Vec::set1(in.imm1);
      map_n(
          m, out, streamed,
          [&](Vec x) {
            Vec r = select(x < lo, lo, x);
            return select(hi < r, hi, r);
          },
          a);
      break;
    }
    case TileOpcode::kSelect:
      map_n(
          m, out, streamed, [](Vec k, Vec u, Vec v) { return select(k != Vec::zero(), u, v); }, a,
          b, c);
      break;
    case TileOpcode::kFma:
      map_n(
          m, out, streamed, [](Vec u, Vec v, Vec w) { return fma(u, v, w); }, a, b, c);
      break;
    default:
      break;
  }
}

}  // namespace

// The view of `v` from column c0 on. (tile_itemsize's table: this per-ISA file includes plain
// data headers only.)
TileOperandView from_column(const TileOperandView& v, int64_t c0) {
  int64_t itemsize = 4;
  switch (v.dtype) {
    case TileDType::kF32:
    case TileDType::kI32:
      break;
    case TileDType::kBF16:
    case TileDType::kF16:
      itemsize = 2;
      break;
    case TileDType::kU8:
    case TileDType::kI8:
    case TileDType::kBool:
      itemsize = 1;
      break;
  }
  TileOperandView r = v;
  r.ptr = static_cast<const char*>(v.ptr) + c0 * v.col_stride * itemsize;
  return r;
}

namespace {

// Strips of a one-row tile (TileArgs::strip) run a program decoded once per tile: what does not
// change from strip to strip (splat loads, constants, every instruction on splats only, the
// immediates' splats, each instruction's sources and destination, whether it streams into an
// output, its share of the prefetches) is worked out before the first strip, so a strip runs
// only the vector loops, gathers, stores and prefetches (relu(2x + 1) in passes: 7% fewer
// instructions, callgrind, AVX2, strips of 512 values; sigmoid(a) b + 1, whose sigmoid dominates,
// 1% fewer).
constexpr int kMaxStripCode = 128;

struct Step {  // trivial: an array of them costs nothing to set up
  enum Kind : uint8_t { kCompute, kGather, kStore, kPrefetch } kind;
  bool streamed;  // kCompute: into an output with streaming stores
  int pc;
  int l0, l1;      // the share of the lines ahead this step prefetches
  Src a, b, c;     // at the tile's column 0 (a full source) or splats
  float* y;        // kCompute, kGather: the destination at column 0
  const float* p;  // kPrefetch: the input at column 0
};

// The source s from column c0 on.
inline Src from(Src s, int64_t c0) {
  return s.m == 0 ? s : Src{s.p + c0, -1};
}

// Returns false (nothing run) for a program it does not take: too long, or with a row reduction.
bool exec_strips(const TileArgs& t) {
  if (t.num_code > kMaxStripCode) return false;
  for (int pc = 0; pc < t.num_code; ++pc)
    if (t.code[pc].op == TileOpcode::kRowReduce) return false;
  alignas(64) float splat[kMaxStripCode][kSplat];  // per instruction: its uniform result
  alignas(64) float imms[kMaxStripCode][kSplat];   // per instruction: its immediate
  auto splat_of = [](float x, float* slot) {
    for (int l = 0; l < kSplat; ++l) slot[l] = x;
    return Src{slot, 0};
  };
  Src reg[kTileMaxRegs];
  Step steps[kMaxStripCode];
  int num_steps = 0, done = 0;  // `done`: the prefetch lines the steps so far cover
  auto share = [&](int pc) { return t.prefetch_lines * pc / t.num_code; };
  auto add = [&](Step::Kind kind, int pc) -> Step& {
    Step& s = steps[num_steps++];
    s.kind = kind;
    s.streamed = false;
    s.pc = pc;
    s.l0 = done;
    s.l1 = done = share(pc + 1);
    return s;
  };
  for (int pc = 0; pc < t.num_code; ++pc) {
    const TileInstr& in = t.code[pc];
    float* buf = t.scratch + in.dst * t.capacity;
    switch (in.op) {
      case TileOpcode::kStore:
        add(Step::kStore, pc).a = reg[in.a];
        continue;
      case TileOpcode::kLoad: {
        const TileOperandView& v = t.inputs[in.operand];
        if (v.col_stride == 0) {
          reg[in.dst] = splat_of(load_one(v, 0), splat[pc]);
        } else if (v.dtype == TileDType::kF32) {
          const auto* p = static_cast<const float*>(v.ptr);
          reg[in.dst] = Src{p, -1};
          if (t.prefetch_lines > 0) add(Step::kPrefetch, pc).p = p;
        } else {
          add(Step::kGather, pc).y = buf;
          reg[in.dst] = Src{buf, -1};
        }
        continue;
      }
      case TileOpcode::kConst:
        reg[in.dst] = splat_of(in.imm0, splat[pc]);
        continue;
      default:
        break;
    }
    Src a = in.a >= 0 ? reg[in.a] : Src{nullptr, 0};
    Src b = in.b >= 0 ? reg[in.b] : Src{nullptr, 0};
    Src c = in.c >= 0 ? reg[in.c] : Src{nullptr, 0};
    if (in.op == TileOpcode::kBinaryImm || in.op == TileOpcode::kCompareImm) {
      b = splat_of(in.imm0, imms[pc]);
      if (in.imm_left) std::swap(a, b);
    }
    if (a.m == 0 && b.m == 0 && c.m == 0) {  // on splats only: once, here
      compute(in, kSplat, splat[pc], false, a, b, c);
      reg[in.dst] = Src{splat[pc], 0};
      continue;
    }
    Step& s = add(Step::kCompute, pc);
    s.a = a, s.b = b, s.c = c, s.y = buf;
    if (t.direct && t.direct[pc] >= 0 && (!t.stream || (t.direct_stream && t.direct_stream[pc]))) {
      const TileOperandView& o = t.outputs[t.direct[pc]];
      if (o.dtype == TileDType::kF32) {
        s.y = static_cast<float*>(const_cast<void*>(o.ptr));
        s.streamed = t.stream;
      }
    }
    reg[in.dst] = Src{s.y, -1};
  }
  if (num_steps > 0) steps[num_steps - 1].l1 = t.prefetch_lines;  // the shares of those after
  auto prefetch = [](const float* p, int l0, int l1) {
    for (int l = l0; l < l1; ++l) __builtin_prefetch(reinterpret_cast<const char*>(p) + l * 64);
  };
  for (int64_t c0 = 0; c0 < t.width; c0 += t.strip) {
    const int64_t w = std::min(t.strip, t.width - c0);
    const float* ahead[4];  // with prefetch_spread: the inputs past this strip, from column c0
    int num_ahead = 0;
    for (int k = 0; k < num_steps; ++k) {
      const Step& s = steps[k];
      for (int j = 0; j < num_ahead; ++j) prefetch(ahead[j], s.l0, s.l1);
      const TileInstr& in = t.code[s.pc];
      switch (s.kind) {
        case Step::kPrefetch:
          if (t.prefetch_spread && num_ahead < 4) {
            ahead[num_ahead++] = s.p + c0 + w;
            prefetch(s.p + c0 + w, 0, s.l1);
          } else {
            prefetch(s.p + c0 + w, 0, t.prefetch_lines);
          }
          break;
        case Step::kGather:
          gather_row(from_column(t.inputs[in.operand], c0), 0, w, s.y + c0);
          break;
        case Step::kStore:
          store_row(from_column(t.outputs[in.operand], c0), 0, w, s.a, c0, t.stream);
          break;
        case Step::kCompute:
          compute(in, w, s.y + c0, s.streamed, from(s.a, c0), from(s.b, c0), from(s.c, c0));
          break;
      }
    }
  }
  return true;
}

}  // namespace

namespace {

// A program that is one chain (every arithmetic instruction reads the result of the one before,
// nothing else reads that result, and the other operands are splats or float32 inputs read in
// place; one store of the last result to a float32 output) runs as one loop over the tile, four
// vectors at a time through every instruction in registers: no pass per instruction with its
// loads and stores of a register in L1, and no strips. The interpreter's dispatch is then one
// switch per instruction per four vectors; the same functions as the passes, so the same bits.
// relu(2x + 1) over 128 MiB on a Zen 4 core: 39.2 GB/s (the bandwidth ceiling, copy_nt, ~40)
// against ~21-30 in strips of passes. The same 4x L3 in callgrind (AVX2) executes 10-15% more
// instructions than the strips (no unrolling across instructions: a dispatch per instruction per
// four vectors), but no register goes through L1 and the loads stay ahead of the stores.
constexpr int kMaxChain = 16;

// What a chain instruction does with the running value v and its operand w.
enum class ChainKind : uint8_t { kUnary, kLeft, kRight, kClip };  // kLeft: v fn w; kRight: w fn v

struct ChainOp {
  uint8_t code;        // chain_code(kind, fn)
  uint8_t operand;     // 0: the splat s; 1: the input p; 2: v itself
  const float* p;      // at the tile's first value
  UnaryParams params;  // kUnary; kClip: lo, hi
  alignas(64) float s[kSplat];
};

constexpr uint8_t chain_code(ChainKind k, int fn) {
  return static_cast<uint8_t>(static_cast<int>(k) * 48 + fn);
}

// The unary functions a chain takes in its switch: a few instructions each, few registers. With
// exp, sigmoid or erf in the switch too (tens of instructions, their constants' registers) the
// compiler kept the four running vectors in memory across the whole loop, and out of line (a call
// per function per four vectors) the loop's own instructions around the call exceeded those of
// the passes: sigmoid(a) b + 1 ran 0.87-0.91x the passes in L2 (Zen 4, AVX-512). So a chain
// takes at most one of those (ChainHeavy), compiled into a loop of its own between the switches
// of the instructions before and after it: 1.11x the passes in L2, 1.17-1.19x at 128 MiB.
// clang-format off
#define PTO_CHAIN_UNARY(X) X(Neg) X(Abs) X(Square) X(Relu) X(LeakyRelu) X(Floor) X(Ceil) X(Round)
// clang-format on
#define PTO_CHAIN_BINARY(X) X(Add) X(Sub) X(Mul) X(Div) X(Max) X(Min)

bool chain_unary(TileUnary fn) {
  switch (fn) {
#define PTO_CHAIN_CASE(name) case TileUnary::k##name:
    PTO_CHAIN_UNARY(PTO_CHAIN_CASE)
#undef PTO_CHAIN_CASE
    return true;
    default:
      return false;
  }
}

bool chain_binary(TileBinary fn) {
  switch (fn) {
#define PTO_CHAIN_CASE(name) case TileBinary::k##name:
    PTO_CHAIN_BINARY(PTO_CHAIN_CASE)
#undef PTO_CHAIN_CASE
    return true;
    default:
      return false;
  }
}

// v[j] = op(v[j]) for B vectors at value i (B == 1: the first k lanes).
template <int B>
PTO_VMATH_INLINE void chain_step(const ChainOp& o, Vec (&v)[B], int64_t i, int k) {
  Vec w[B];
  for (int j = 0; j < B; ++j)
    w[j] = o.operand == 0   ? Vec::load(o.s)
           : o.operand == 2 ? v[j]
           : B == 1         ? Vec::load(o.p + i, k)
                            : Vec::load(o.p + i + j * L);
  switch (o.code) {
#define PTO_CHAIN_CASE(name)                                                           \
  case chain_code(ChainKind::kUnary, static_cast<int>(TileUnary::k##name)):            \
    for (int j = 0; j < B; ++j) v[j] = tile_unary<TileUnary::k##name>(v[j], o.params); \
    break;
    PTO_CHAIN_UNARY(PTO_CHAIN_CASE)
#undef PTO_CHAIN_CASE
#define PTO_CHAIN_CASE(name)                                                         \
  case chain_code(ChainKind::kLeft, static_cast<int>(TileBinary::k##name)):          \
    for (int j = 0; j < B; ++j) v[j] = tile_binary<TileBinary::k##name>(v[j], w[j]); \
    break;                                                                           \
  case chain_code(ChainKind::kRight, static_cast<int>(TileBinary::k##name)):         \
    for (int j = 0; j < B; ++j) v[j] = tile_binary<TileBinary::k##name>(w[j], v[j]); \
    break;
    PTO_CHAIN_BINARY(PTO_CHAIN_CASE)
#undef PTO_CHAIN_CASE
    case chain_code(ChainKind::kClip, 0): {
      const Vec lo = Vec::set1(o.params.a), hi = Vec::set1(o.params.b);
      for (int j = 0; j < B; ++j) {
        Vec r = select(v[j] < lo, lo, v[j]);
        v[j] = select(hi < r, hi, r);
      }
      break;
    }
    default:
      break;
  }
}

// The one heavy unary function a chain may have (kNone: none), compiled into the chain's loop
// between the switches of the instructions before and after it.
enum class ChainHeavy : uint8_t { kNone, kExp, kSigmoid, kTanh, kErf, kGelu, kGeluTanh };

ChainHeavy chain_heavy(TileUnary fn) {
  switch (fn) {
    case TileUnary::kExp:
      return ChainHeavy::kExp;
    case TileUnary::kSigmoid:
      return ChainHeavy::kSigmoid;
    case TileUnary::kTanh:
      return ChainHeavy::kTanh;
    case TileUnary::kErf:
      return ChainHeavy::kErf;
    case TileUnary::kGelu:
      return ChainHeavy::kGelu;
    case TileUnary::kGeluTanh:
      return ChainHeavy::kGeluTanh;
    default:
      return ChainHeavy::kNone;
  }
}

template <ChainHeavy H>
PTO_VMATH_INLINE Vec heavy_unary(Vec x, const UnaryParams& p) {
  using enum TileUnary;
  if constexpr (H == ChainHeavy::kExp) return tile_unary<kExp>(x, p);
  if constexpr (H == ChainHeavy::kSigmoid) return tile_unary<kSigmoid>(x, p);
  if constexpr (H == ChainHeavy::kTanh) return tile_unary<kTanh>(x, p);
  if constexpr (H == ChainHeavy::kErf) return tile_unary<kErf>(x, p);
  if constexpr (H == ChainHeavy::kGelu) return tile_unary<kGelu>(x, p);
  if constexpr (H == ChainHeavy::kGeluTanh) return tile_unary<kGeluTanh>(x, p);
  return x;
}

// The chain over values [i, i + B L) (B == 1: the first k lanes) of x into y; instruction h is
// the heavy function H (with H kNone, h is num_ops).
template <int B, ChainHeavy H>
PTO_VMATH_INLINE void chain_run(const ChainOp* ops, int num_ops, int h, const float* x, int64_t i,
                                int k, Vec (&v)[B]) {
  for (int j = 0; j < B; ++j) v[j] = B == 1 ? Vec::load(x + i, k) : Vec::load(x + i + j * L);
  for (int q = 0; q < h; ++q) chain_step<B>(ops[q], v, i, k);
  if constexpr (H != ChainHeavy::kNone) {
    for (int j = 0; j < B; ++j) v[j] = heavy_unary<H>(v[j], ops[h].params);
    for (int q = h + 1; q < num_ops; ++q) chain_step<B>(ops[q], v, i, k);
  }
}

// The chain over n values of x into y (the head before y's first aligned vector, then full
// vectors past the cache, with kStream), four vectors a step; the inputs ins prefetched `lines`
// lines ahead.
template <bool kStream, ChainHeavy H>
void chain_loop(const ChainOp* ops, int num_ops, int h, const float* x, float* y, int64_t n,
                const float* const* ins, int num_ins, int lines) {
  int64_t i = 0;
  Vec one[1];
  if (kStream) {
    const auto lane = static_cast<int64_t>(reinterpret_cast<uintptr_t>(y) / sizeof(float) % L);
    if (lane != 0) {
      const int k = static_cast<int>(n < L - lane ? n : L - lane);
      chain_run<1, H>(ops, num_ops, h, x, 0, k, one);
      one[0].store(y, k);
      i = k;
    }
  }
  constexpr int B = 4;
  for (; i + B * L <= n; i += B * L) {
    for (int j = 0; j < num_ins; ++j)
      for (int l = 0; l < B * L * 4; l += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(ins[j] + i) + lines * 64 + l);
    Vec v[B];
    chain_run<B, H>(ops, num_ops, h, x, i, L, v);
    for (int j = 0; j < B; ++j) {
      if constexpr (kStream)
        v[j].stream(y + i + j * L);
      else
        v[j].store(y + i + j * L);
    }
  }
  for (; i < n; i += L) {
    const int k = static_cast<int>(n - i < L ? n - i : L);
    chain_run<1, H>(ops, num_ops, h, x, i, k, one);
    if (k == L)
      one[0].store(y + i);
    else
      one[0].store(y + i, k);
  }
}

// Row operands (kind 4 below) a chain may read.
constexpr int kRepeatedRows = 4;

// `row` (width floats) repeated `rows` times, in buffer `slot` of this thread's. Every tile of a
// kernel reads the same row, so the buffer is refilled only when the row's address or values, or
// the tile's shape, differ from what it holds (a width-long compare per tile against rows * width
// copies). The chain then reads it as a full operand: one flat loop over the tile, where a loop
// per row cost its dispatch on every row (rows of 49, a Swin window's keys, ran 2.4x slower than
// the separate Mul and Add kernels that way).
const float* repeated_row(const float* row, int64_t width, int64_t rows, int slot) {
  struct Repeated {
    std::vector<float> buf;
    const float* src = nullptr;
    int64_t width = 0, rows = 0;
  };
  static thread_local Repeated cache[kRepeatedRows];
  Repeated& c = cache[slot];
  const size_t bytes = static_cast<size_t>(width) * sizeof(float);
  if (c.src != row || c.width != width || c.rows < rows || std::memcmp(c.buf.data(), row, bytes)) {
    c.buf.resize(static_cast<size_t>(rows * width));
    for (int64_t r = 0; r < rows; ++r) std::memcpy(c.buf.data() + r * width, row, bytes);
    c.src = row;
    c.width = width;
    c.rows = rows;
  }
  return c.buf.data();
}

// Recognizes a chain (above) and runs it; false (nothing run) for any other program.
bool exec_chain(const TileArgs& t) {
  if (t.num_code > 2 * kMaxChain + 8) return false;
  ChainOp ops[kMaxChain];
  int num_ops = 0;
  alignas(64) float splats[kMaxChain + 8][kSplat];
  int num_splats = 0;
  // Each register: 0 unset or dead, 1 a splat (sp), 2 an input in place (p), 3 the chain's value,
  // 4 a row every row of the tile reads (a bias or a mask over the last axis), repeated (p).
  struct Reg {
    uint8_t kind;
    const float* p;
  } reg[kTileMaxRegs];
  // What cannot be a chain, before any setup: this runs for every tile of every program.
  int stores = 0;
  for (int pc = 0; pc < t.num_code; ++pc) {
    const TileOpcode op = t.code[pc].op;
    stores += op == TileOpcode::kStore;
    if (op == TileOpcode::kRowReduce || op == TileOpcode::kSelect || op == TileOpcode::kFma ||
        op == TileOpcode::kCompare || op == TileOpcode::kCompareImm)
      return false;
  }
  if (stores != 1) return false;
  for (int r = 0; r < kTileMaxRegs; ++r) reg[r].kind = 0;
  const float* x = nullptr;  // the chain's first value: an input
  float* y = nullptr;
  const int64_t count = t.rows * t.width;
  int acc = -1;                          // the register of the chain's value
  ChainHeavy heavy = ChainHeavy::kNone;  // the chain's heavy function, instruction h
  int rows_used = 0;                     // row operands (kind 4) repeated down the tile so far
  int h = -1;
  for (int pc = 0; pc < t.num_code; ++pc) {
    const TileInstr& in = t.code[pc];
    if (in.op == TileOpcode::kStore) {
      if (y || in.a != acc || pc + 1 != t.num_code) return false;
      const TileOperandView& o = t.outputs[in.operand];
      if (o.dtype != TileDType::kF32 || (t.rows > 1 && o.row_step != t.width)) return false;
      y = static_cast<float*>(const_cast<void*>(o.ptr));
      continue;
    }
    if (in.dst < 0 || in.dst >= kTileMaxRegs) return false;
    auto splat = [&](float value) {
      if (num_splats == kMaxChain + 8) return false;
      float* sp = splats[num_splats++];
      for (int l = 0; l < kSplat; ++l) sp[l] = value;
      reg[in.dst] = {1, sp};
      return true;
    };
    if (in.op == TileOpcode::kLoad) {
      const TileOperandView& v = t.inputs[in.operand];
      if (v.col_stride == 0 && (t.rows == 1 || v.row_step == 0)) {
        if (!splat(load_one(v, 0))) return false;
      } else if (v.dtype == TileDType::kF32 && (t.rows == 1 || v.row_step == t.width)) {
        reg[in.dst] = {2, static_cast<const float*>(v.ptr)};
      } else if (v.row_step == 0 && t.width == L) {
        // One row for every row, rows of one vector (a per-channel operand of a blocked NCHWc
        // value on AVX-512): a splat of that vector, since the chain's vector i is row i.
        if (num_splats == kMaxChain + 8) return false;
        float* sp = splats[num_splats++];
        gather_row(v, 0, L, sp);
        reg[in.dst] = {1, sp};
      } else if (v.row_step == 0 && v.col_stride == 1 && v.dtype == TileDType::kF32) {
        // One row for every row, wider (a bias, an attention mask over the keys): read as a tile
        // of that row repeated (repeated_row), so the chain stays one flat loop.
        if (rows_used == kRepeatedRows) return false;
        reg[in.dst] = {
            4, repeated_row(static_cast<const float*>(v.ptr), t.width, t.rows, rows_used++)};
      } else {
        return false;
      }
      if (in.dst == acc) return false;
      continue;
    }
    if (in.op == TileOpcode::kConst) {
      if (in.dst == acc || !splat(in.imm0)) return false;
      continue;
    }
    {  // on splats only: computed here, once
      auto src = [&](int r) { return r < 0 ? Src{nullptr, 0} : Src{reg[r].p, 0}; };
      auto is_splat = [&](int r) { return r < 0 || reg[r].kind == 1; };
      if (in.op != TileOpcode::kRowReduce && is_splat(in.a) && is_splat(in.b) && is_splat(in.c)) {
        if (in.dst == acc || num_splats == kMaxChain + 8) return false;
        Src a = src(in.a), b = src(in.b);
        alignas(64) float imm[kSplat];
        if (in.op == TileOpcode::kBinaryImm || in.op == TileOpcode::kCompareImm) {
          for (int l = 0; l < kSplat; ++l) imm[l] = in.imm0;
          b = Src{imm, 0};
          if (in.imm_left) std::swap(a, b);
        }
        float* sp = splats[num_splats++];
        compute(in, kSplat, sp, false, a, b, src(in.c));
        reg[in.dst] = {1, sp};
        continue;
      }
    }
    if (num_ops == kMaxChain) return false;
    ChainOp& o = ops[num_ops];
    o.operand = 0;
    o.p = nullptr;
    o.params = UnaryParams{in.imm0, in.imm1};
    auto operand = [&](const Reg& r) {
      if (r.kind == 1) {
        std::memcpy(o.s, r.p, sizeof o.s);
      } else {
        o.operand = 1;
        o.p = r.p;
      }
    };
    // The chain's value as source a (or b, for binary ops): from the register holding it, or
    // the first instruction starting the chain from an input.
    auto is_acc = [&](int r) { return r >= 0 && r == acc; };
    auto can_start = [&](int r) {
      return acc < 0 && num_ops == 0 && r >= 0 && (reg[r].kind == 2 || reg[r].kind == 4);
    };
    auto start = [&](int r) {
      if (acc < 0) x = reg[r].p;
    };
    if (in.op == TileOpcode::kUnary || in.op == TileOpcode::kClip) {
      if (in.op == TileOpcode::kUnary && !chain_unary(static_cast<TileUnary>(in.fn))) {
        const ChainHeavy hv = chain_heavy(static_cast<TileUnary>(in.fn));
        if (hv == ChainHeavy::kNone || heavy != ChainHeavy::kNone) return false;
        heavy = hv;
        h = num_ops;
      }
      if (!is_acc(in.a) && !can_start(in.a)) return false;
      start(in.a);
      o.code = in.op == TileOpcode::kClip ? chain_code(ChainKind::kClip, 0)
                                          : chain_code(ChainKind::kUnary, in.fn);
    } else if (in.op == TileOpcode::kBinary || in.op == TileOpcode::kBinaryImm) {
      if (!chain_binary(static_cast<TileBinary>(in.fn))) return false;
      int a = in.a, b = in.op == TileOpcode::kBinary ? in.b : -1;
      bool left = true;  // the chain's value on the left
      if (in.op == TileOpcode::kBinaryImm) {
        if (!is_acc(a) && !can_start(a)) return false;
        start(a);
        for (int l = 0; l < kSplat; ++l) o.s[l] = in.imm0;
        left = !in.imm_left;
      } else if (is_acc(a) || (!is_acc(b) && can_start(a))) {
        if (is_acc(b) || (acc < 0 && a == b)) {
          o.operand = 2;
        } else if (b < 0 || reg[b].kind == 0 || reg[b].kind == 3) {
          return false;
        } else {
          operand(reg[b]);
        }
        start(a);
      } else if (is_acc(b) || can_start(b)) {
        if (a < 0 || reg[a].kind == 0 || reg[a].kind == 3) return false;
        operand(reg[a]);
        start(b);
        left = false;
      } else {
        return false;
      }
      o.code = chain_code(left ? ChainKind::kLeft : ChainKind::kRight, in.fn);
    } else {
      return false;
    }
    ++num_ops;
    if (acc >= 0) reg[acc].kind = 0;  // read by this instruction only
    acc = in.dst;
    reg[acc] = {3, nullptr};
  }
  if (!y || !x || num_ops == 0) return false;

  const int64_t n = count;
  const int lines = t.prefetch_lines;
  const float* ins[4];  // the inputs read in place, for the prefetches
  int num_ins = 0;
  if (lines > 0) {
    ins[num_ins++] = x;
    for (int q = 0; q < num_ops; ++q)
      if (ops[q].operand == 1 && num_ins < 4) {
        bool seen = false;
        for (int j = 0; j < num_ins; ++j) seen |= ins[j] == ops[q].p;
        if (!seen) ins[num_ins++] = ops[q].p;
      }
  }
  if (heavy == ChainHeavy::kNone) h = num_ops;
  auto go = [&]<ChainHeavy H>() {
    if (t.stream)
      chain_loop<true, H>(ops, num_ops, h, x, y, n, ins, num_ins, lines);
    else
      chain_loop<false, H>(ops, num_ops, h, x, y, n, ins, num_ins, lines);
  };
  switch (heavy) {
    case ChainHeavy::kNone:
      go.template operator()<ChainHeavy::kNone>();
      break;
    case ChainHeavy::kExp:
      go.template operator()<ChainHeavy::kExp>();
      break;
    case ChainHeavy::kSigmoid:
      go.template operator()<ChainHeavy::kSigmoid>();
      break;
    case ChainHeavy::kTanh:
      go.template operator()<ChainHeavy::kTanh>();
      break;
    case ChainHeavy::kErf:
      go.template operator()<ChainHeavy::kErf>();
      break;
    case ChainHeavy::kGelu:
      go.template operator()<ChainHeavy::kGelu>();
      break;
    case ChainHeavy::kGeluTanh:
      go.template operator()<ChainHeavy::kGeluTanh>();
      break;
  }
  if (t.stream && t.fence) stream_fence();
  return true;
}

}  // namespace

void exec_tile(const TileArgs& t) {
  if (exec_chain(t)) return;
  alignas(64) float splat[kTileMaxRegs + 1][kSplat];
  Src reg[kTileMaxRegs];
  auto splat_of = [&](float x, int slot) {
    for (int l = 0; l < kSplat; ++l) splat[slot][l] = x;
    return Src{splat[slot], 0};
  };
  // Runs every instruction on `rows` rows from row r0 (all of them, or one) and columns
  // [c0, c0 + width). Registers keep the tile's indexing (row i, column j at i * t.width + j),
  // so a strip reads and writes its part of each buffer.
  auto run = [&](int64_t r0, int64_t rows, int64_t c0, int64_t width) {
    const int64_t base = r0 * t.width + c0, count = rows * width;
    auto at_base = [&](Src s) { return Src{s.m == 0 ? s.p : s.p + base, s.m}; };
    // With prefetch_spread, the inputs read in place so far (the lines past this tile or strip
    // of each), and instruction pc's share of those lines: [pc P / n, (pc + 1) P / n).
    const char* ahead[4];
    int num_ahead = 0;
    auto share = [&](int pc) { return t.prefetch_lines * pc / t.num_code; };
    // Prefetch instructions never fault, so lines past the input's end are harmless.
    auto prefetch = [](const char* p, int l0, int l1) {
      for (int l = l0; l < l1; ++l) __builtin_prefetch(p + l * 64);
    };
    for (int pc = 0; pc < t.num_code; ++pc) {
      const TileInstr& in = t.code[pc];
      for (int k = 0; k < num_ahead; ++k) prefetch(ahead[k], share(pc), share(pc + 1));
      if (in.op == TileOpcode::kStore) {
        const TileOperandView v = from_column(t.outputs[in.operand], c0);
        if (width == t.width && v.row_step == t.width) {  // rows back to back: one run
          store_row(v, r0, rows * width, reg[in.a], r0 * t.width, t.stream);
        } else {
          for (int64_t i = r0; i < r0 + rows; ++i)
            store_row(v, i, width, reg[in.a], i * t.width + c0, t.stream);
        }
        continue;
      }
      float* buf = t.scratch + in.dst * t.capacity;
      if (in.op == TileOpcode::kLoad) {
        const TileOperandView& v = t.inputs[in.operand];
        if (v.col_stride == 0 && (t.rows == 1 || v.row_step == 0)) {
          reg[in.dst] = splat_of(load_one(v, 0), in.dst);
        } else if (v.dtype == TileDType::kF32 && (t.rows == 1 || v.row_step == t.width)) {
          reg[in.dst] = Src{static_cast<const float*>(v.ptr), -1};
          const char* next = static_cast<const char*>(v.ptr) + (base + count) * 4;
          if (t.prefetch_spread && num_ahead < 4) {
            ahead[num_ahead++] = next;
            prefetch(next, 0, share(pc + 1));  // the shares of the instructions before
          } else {
            prefetch(next, 0, t.prefetch_lines);
          }
        } else if (v.row_step == 0 && rows > 1) {
          // One row for every row (a per-channel operand of a blocked NCHWc value: rows of 16):
          // read once and copied on by vectors; a gather per row took 3.6x the whole program.
          float* first = buf + r0 * t.width + c0;
          gather_row(from_column(v, c0), r0, width, first);
          for (int64_t i = 1; i < rows; ++i)
            for (int64_t j = 0; j < width; j += L) {
              const int k = static_cast<int>(width - j < L ? width - j : L);
              Vec::load(first + j, k).store(first + i * t.width + j, k);
            }
          reg[in.dst] = Src{buf, -1};
        } else {
          const TileOperandView from = from_column(v, c0);
          for (int64_t i = r0; i < r0 + rows; ++i)
            gather_row(from, i, width, buf + i * t.width + c0);
          reg[in.dst] = Src{buf, -1};
        }
        continue;
      }
      if (in.op == TileOpcode::kConst) {
        reg[in.dst] = splat_of(in.imm0, in.dst);
        continue;
      }
      Src a = in.a >= 0 ? reg[in.a] : Src{nullptr, 0};
      Src b = in.b >= 0 ? reg[in.b] : Src{nullptr, 0};
      Src c = in.c >= 0 ? reg[in.c] : Src{nullptr, 0};
      if (in.op == TileOpcode::kBinaryImm || in.op == TileOpcode::kCompareImm) {
        b = splat_of(in.imm0, kTileMaxRegs);
        if (in.imm_left) std::swap(a, b);
      }
      if (in.op == TileOpcode::kRowReduce) {  // whole tiles only (TileArgs::strip)
        row_reduce(static_cast<TileReduce>(in.fn), t.rows, t.width, buf, a);
        reg[in.dst] = Src{buf, -1};
        continue;
      }
      // Every source a splat: compute one vector into the destination's splat.
      const bool uniform = a.m == 0 && b.m == 0 && c.m == 0;
      float* y = buf;
      // Straight into the output: with `stream`, only where nothing but its store reads the
      // result (TileArgs::direct_stream), which then has nothing left to do; the stores past
      // the cache are then the instruction's own, not a pass of their own over the register.
      bool streamed = false;
      if (uniform) {
        y = splat[in.dst];
      } else if (t.direct && t.direct[pc] >= 0 &&
                 (!t.stream || (t.direct_stream && t.direct_stream[pc]))) {
        const TileOperandView& o = t.outputs[t.direct[pc]];
        if (o.dtype == TileDType::kF32 && (t.rows == 1 || o.row_step == t.width)) {
          y = static_cast<float*>(const_cast<void*>(o.ptr));
          streamed = t.stream;
        }
      }
      const int64_t m = uniform ? kSplat : count;
      float* out = uniform ? y : y + base;
      if (!uniform) a = at_base(a), b = at_base(b), c = at_base(c);
      compute(in, m, out, streamed, a, b, c);
      reg[in.dst] = Src{y, uniform ? 0 : -1};
    }
  };
  if (t.strip > 0 && t.rows == 1 && t.width > t.strip) {
    if (exec_strips(t)) {
      if (t.stream && t.fence) stream_fence();
      return;
    }
    for (int64_t c0 = 0; c0 < t.width; c0 += t.strip)
      run(0, 1, c0, std::min(t.strip, t.width - c0));
  } else {
    run(0, t.rows, 0, t.width);
  }
  if (t.stream && t.fence) stream_fence();
}

}  // namespace pto::cpu::PTO_ISA_NS
