// Single-precision GEMM with a fused epilogue:
//
//   C[m, n] = act(alpha * sum_k A[m, k] * B[k, n] + bias + residual_scale * R[m, n])
//
// A is M x K (or K x M when trans_a), B is K x N (or N x K when trans_b), all row-major with
// leading dimensions in elements. Packed panels, register-blocked micro-kernels per ISA, cache
// blocking from the machine's cache sizes, parallel over both M and N (gemm/README in
// docs/architecture.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pto::cpu {

enum class Activation {
  kNone,
  kRelu,
  kClip,       // min(max(x, lo), hi): ReLU6 and Clip
  kLeakyRelu,  // x < 0 ? slope * x : x (slope in `lo`)
  kSigmoid,
  kTanh,
  kGelu,      // exact (erf) GELU
  kGeluTanh,  // tanh approximation
  kSilu,      // x * sigmoid(x)
  kHardSwish,
};

// What is applied to each output element after the dot product, before it is stored.
class TileKernel;        // tile_kernel.h
struct EpilogueOperand;  // tile_kernel.h

struct Epilogue {
  enum class Bias { kNone, kPerRow, kPerCol, kScalar };
  Bias bias_kind = Bias::kNone;
  const float* bias = nullptr;      // M values (kPerRow), N (kPerCol) or 1 (kScalar)
  const float* residual = nullptr;  // M x N added before the activation
  int64_t ldr = 0;                  // residual leading dimension
  float residual_scale = 1.0f;
  Activation act = Activation::kNone;
  float lo = 0.0f, hi = 0.0f;  // activation parameters (see Activation)
  // The result is rounded to bf16 or f16 right after (GemmArgs::c_half): kGelu then takes the
  // rational erf (vmath.h gelu_erf_half: 2.1x faster, error 4.3e-7 max(1, |x|) absolute, far
  // below the rounding that follows) instead of the one accurate to a few ulp everywhere.
  // apply_fused sets it from the fused group's store, unless PTO_GELU_HALF=0.
  bool half_store = false;
  // A general elementwise chain (tile/lower.h lower_epilogue) run on each C block while it is in
  // L1, instead of residual and act (which are then ignored); a bias (a conv's own) is added
  // first: program input 0 is the accumulator (alpha and bias applied), input k >= 1 is
  // tile_operands[k - 1].
  const TileKernel* tile = nullptr;
  const EpilogueOperand* tile_operands = nullptr;
};

// ep.tile->run_block(...) (tile_kernel.cpp): the general epilogue on one block.
void run_tile_epilogue(const Epilogue& ep, float* c, int64_t ldc, int64_t m0, int64_t m, int64_t n0,
                       int64_t n);

inline constexpr int kGemmRowsSlack = 8;

// What the products are computed in. kBF16: A and B rounded to bf16 (to nearest even) and the
// products accumulated in fp32, as torch.autocast and oneDNN's bf16 math compute a bf16 matmul;
// AMX tiles where the CPU has AMX-BF16 and A has 16 rows or more (TDPBF16PS: 16 times
// VDPBF16PS's work per instruction), VDPBF16PS where it has AVX512_BF16 (twice the FMA rate,
// half the packed bytes), else the fp32 kernels on the rounded values (same results up to the
// order of additions). kF16: A and B
// rounded to IEEE half (nearest even) and the products accumulated in fp32, as torch.autocast's
// fp16 matmul; x86 without AVX512_FP16 has no fp16 arithmetic, so the operands are rounded while
// packed (F16C: VCVTPS2PH and back) and the fp32 kernels run: fp32 speed, fp16 results.
//
// kBF16x3 ("split bf16", what torch.set_float32_matmul_precision("high") allows and JAX calls
// Precision.HIGH): each fp32 operand is split into a bf16 head h = bf16(x) and a bf16 tail
// l = bf16(x - h) (16 of fp32's 24 significand bits), and C = Ah Bh + Al Bh + Ah Bl, accumulated
// in fp32: the one product of the tails left out and the bits past the tail make a relative error
// of about 2^-16 per product (fp32: 2^-24, bf16: 2^-8). Each operand is packed as the bf16 panels
// of its heads, then of its tails (PackedPanels::parts: 4 bytes a weight, as fp32), and the AMX
// micro-kernel multiplies all three pairs of parts per chunk: on the tiles three bf16 products
// cost less than one fp32 product on the FMA units (what it is for), at any row count; without
// AMX, three passes of the bf16 kernels, slower than fp32.
enum class Precision { kF32, kBF16, kF16, kBF16x3 };
const char* precision_name(Precision p);  // "f32", "bf16", "f16", "bf16x3"

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t lda = 0;
  bool trans_a = false;
  const float* b = nullptr;
  int64_t ldb = 0;
  bool trans_b = false;
  // When set (B not transposed), row p of B starts at b + b_rows[p] and ldb is unused: the
  // shifted input rows of an implicit-GEMM convolution, read in place. The table holds
  // k + kGemmRowsSlack entries (the last ones are only prefetched: any offset will do).
  const int64_t* b_rows = nullptr;
  float* c = nullptr;
  int64_t ldc = 0;
  float alpha = 1.0f;
  Epilogue epilogue;
  // kBF16, kF16, kBF16x3: B is always packed (b_rows: from the rows); kBF16x3: no a_half
  Precision precision = Precision::kF32;
  // Half-precision storage (kBF16 or kF16 bits): A's elements at a_half instead of `a` (same
  // lda and trans_a), widened exactly block by block before packing; and C's result also stored
  // rounded at c_half (C's layout: ldc), each block right after its epilogue while it is in
  // cache, with `c` the caller's float scratch for the accumulators.
  const uint16_t* a_half = nullptr;
  Precision a_half_type = Precision::kF32;
  uint16_t* c_half = nullptr;
  Precision c_half_type = Precision::kF32;
  // Block sizes in place of the cache model's (the "gemm.blocks" knob, docs/tuning.md): KC
  // (rounded to 8), MC and NC (rounded to the register block); 0 keeps the planner's.
  int64_t block_kc = 0, block_mc = 0, block_nc = 0;
  // The task grid in place of choose_task_grid's (the "gemm.grid" knob): rows cut into grid_tm
  // ranges and columns into grid_tn, each at most its panels; 0 keeps the planner's.
  int64_t grid_tm = 0, grid_tn = 0;
};

// Rounds n floats to what products in `p` see, kept in fp32: bf16 (round_to_bf16, elementwise.h),
// IEEE half (round_to_f16: F16C where the CPU has it); fp32 values stay. kBF16x3: the head, bf16.
void round_to_precision(Precision p, float* v, int64_t n);

// C = epilogue(alpha * op(A) op(B)); parallel over the thread pool unless called from inside a
// parallel region (then it runs on the calling thread).
void sgemm(const GemmArgs& args);

// An operand packed once into the panels of `width` rows or columns (MR for A, NR for B) that
// the micro-kernel of one ISA reads: panel i at data + i * steps * width, `width` values per
// step; a step is one k (fp32, or bf16 or f16 values rounded in fp32 slots) or a pair of k (bf16
// pairs for VDPBF16PS, see gemm_kernel.h). A B packed for f16 products where the CPU has F16C,
// or for bf16 products where VDPBF16PS does not run, holds half bits instead (half_panels():
// `width` halves per step, widened in registers).
class PackedPanels {
 public:
  int64_t k() const { return k_; }
  const float* data() const { return data_.get(); }
  int isa() const { return isa_; }
  Precision precision() const { return precision_; }
  int k_per_step() const { return unit_; }
  int64_t width() const { return width_; }
  // Steps grouped in chunks of this many, each holding its steps row after row (A for AMX:
  // gemm_kernel.h), or 0: step after step, `width` values each.
  int chunk_steps() const { return chunk_; }
  // kF16 / kBF16: the values are stored as those half bits; kF32: as floats.
  Precision half_panels() const { return half_; }
  size_t bytes() const { return bytes_; }  // what the panels hold in memory
  // 2 for kBF16x3: the panels of the values' bf16 heads, then (part_size() elements on: floats,
  // or halves) the same panels of their tails; else 1.
  int parts() const { return parts_; }
  int64_t part_size() const { return part_size_; }
  // The operand back as a plain row-major len x k matrix (rows of A; columns of B, so B comes
  // back transposed): for running without the packing, or giving the original back. kBF16x3:
  // head + tail of each value (its 16 significant bits), a value that splits into them again.
  std::vector<float> unpack() const;

 protected:
  // Storage for `len` rows (A) or columns (B) of K in panels of `width`, for the active ISA,
  // `unit` values of K per step.
  float* allocate(int64_t len, int64_t k, int64_t width, Precision precision, int unit,
                  Precision half = Precision::kF32, int parts = 1);
  int64_t k_ = 0, len_ = 0;  // len_: rows of A or columns of B
  int64_t width_ = 0;        // MR or NR of the packing ISA
  size_t bytes_ = 0;
  int isa_ = 0;  // the cpu::Isa it was packed for
  Precision precision_ = Precision::kF32;
  int unit_ = 1;                      // values of K per step
  int chunk_ = 0;                     // chunk_steps()
  Precision half_ = Precision::kF32;  // stored as these half bits, not floats
  int parts_ = 1;
  int64_t part_size_ = 0;
  std::shared_ptr<float[]> data_;
};

// B packed once (a constant weight), for any later sgemm_packed with the same K, N and ISA.
class PackedB : public PackedPanels {
 public:
  int64_t n() const { return len_; }

 private:
  friend PackedB pack_b(int64_t k, int64_t n, const float* b, int64_t ldb, bool trans_b,
                        Precision precision);
};

// B packed for products in `precision` (bf16 and f16: half the bytes on the vector ISAs, as
// VDPBF16PS pairs or as halves widened in registers; f16 needs F16C).
PackedB pack_b(int64_t k, int64_t n, const float* b, int64_t ldb, bool trans_b,
               Precision precision = Precision::kF32);

// As sgemm with B taken from `packed` (args.b, ldb and trans_b are ignored; args.k and args.n
// must match the packing) in the packing's precision (args.precision is ignored). Falls back to
// unpacking when the active ISA or bf16 support differs from the packing's.
void sgemm_packed(const GemmArgs& args, const PackedB& packed);

// B packed for products in `precision` on the active ISA into caller memory (`dst`, 64-byte
// aligned, at least packed_b_floats(k, n, precision) floats), with no allocation: for a kernel
// that packs a block of B once into its own scratch and multiplies several A blocks against it
// (Attention's K and V chunks). bf16 where VDPBF16PS runs: its pair panels (which the AMX tiles
// read too); otherwise fp32 panels of values rounded to `precision`.
int64_t packed_b_floats(int64_t k, int64_t n, Precision precision = Precision::kF32);
void pack_b_into(float* dst, int64_t k, int64_t n, const float* b, int64_t ldb, bool trans_b,
                 Precision precision = Precision::kF32);

// As sgemm with B taken from panels that pack_b_into made on the active ISA for args.k x args.n
// in args.precision (args.b, ldb and trans_b are ignored). No allocation beyond sgemm's
// per-thread scratch.
void sgemm_prepacked(const GemmArgs& args, const float* packed_b);

// A packed once (a constant weight on the left, as Conv's), for any later sgemm_packed_a with
// the same M, K and ISA.
class PackedA : public PackedPanels {
 public:
  int64_t m() const { return len_; }

 private:
  friend PackedA pack_a(int64_t m, int64_t k, const float* a, int64_t lda, bool trans_a,
                        Precision precision);
};

// A packed for products in `precision` (bf16: half the bytes where VDPBF16PS runs; for AMX tiles
// where the CPU has AMX-BF16 and m fills a tile).
PackedA pack_a(int64_t m, int64_t k, const float* a, int64_t lda, bool trans_a,
               Precision precision = Precision::kF32);

// As sgemm with A taken from `packed` (args.a, lda and trans_a are ignored; args.m and args.k
// must match the packing) in the packing's precision (args.precision is ignored). Falls back to
// unpacking when the active ISA or bf16 support differs from the packing's.
void sgemm_packed_a(const GemmArgs& args, const PackedA& packed);

// Batched: `batch` independent GEMMs at the given element strides (a stride of 0 broadcasts that
// operand over the batch). Parallel over batch, M and N together.
void sgemm_batched(const GemmArgs& args, int64_t batch, int64_t stride_a, int64_t stride_b,
                   int64_t stride_c, int64_t stride_r = 0);

// How sgemm blocks and splits a call (the cache model's block sizes, the task grid, how B is
// read), as run_gemm computes it before running.
struct GemmPlan {
  int64_t mr = 0, nr = 0;  // register block
  Precision precision = Precision::kF32;
  int k_per_step = 1;                  // 2: bf16 pairs (VDPBF16PS); KC counts steps
  bool amx = false;                    // the bf16 pairs multiplied on AMX tiles
  Precision b_half = Precision::kF32;  // B packed ahead as these halves, widened in registers
  int64_t kc = 0, k_slices = 1;        // K cut into equal slices of at most KC
  int64_t mc = 0, nc = 0;              // rows of A and columns of B packed per block
  int64_t batch = 1, tm = 1, tn = 1;   // tasks: items x row ranges x column ranges
  int64_t col_unit = 0;  // column ranges in multiples of this: NR, or a vector (B not packed ahead)
  int threads = 1;
  // How B is read: in place (row stride), packed by each task for its columns, packed once per
  // block for all threads (which then split the rows), or packed ahead (constant weights).
  enum class B { kInPlace, kPackedPerTask, kPackedShared, kPackedAhead } b = B::kInPlace;
  // A packed once for all threads, which then split the columns (B packed ahead, few rows).
  bool a_shared = false;
  // A read in place by the micro-kernel, not packed (fp32, tasks one B panel wide: gemm.cpp).
  bool a_in_place = false;
  std::string str() const;
};

// The plan of sgemm / sgemm_batched (batch > 1) / sgemm_packed (b_packed_ahead) for `args`'s
// shape and transposes on `threads` threads (0: the pool's).
GemmPlan plan_gemm(const GemmArgs& args, int64_t batch = 1, bool b_packed_ahead = false,
                   int threads = 0);

// How `items` products of M x N x K split over `threads` threads: tm row ranges by tn column
// ranges, in whole mr panels and nu-column units (nr panels, or vectors where a partial panel
// costs only its vectors), whose slowest wave of tasks (each costing its multiply-adds and the
// packing of its rows and columns) is cheapest; fewer threads where each would get less than
// `min_ops` operations (two per multiply-add); tn = 1 unless `split_n`. sgemm's split, and
// igemm's (nu = nr).
struct TaskGrid {
  int64_t tm = 1, tn = 1;
};
TaskGrid choose_task_grid(int64_t items, int64_t m, int64_t n, int64_t k, int64_t mr, int64_t nu,
                          int threads, double min_ops = 2e5, bool split_n = true);

// Applies the epilogue to an M x N block of C in place (row offset m0, column offset n0 within the
// full problem, for bias and residual indexing). Shared by every kernel that ends in an epilogue.
void apply_epilogue(const Epilogue& ep, float* c, int64_t ldc, int64_t m0, int64_t m, int64_t n0,
                    int64_t n);

}  // namespace pto::cpu
