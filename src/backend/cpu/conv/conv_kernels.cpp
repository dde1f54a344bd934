// Registers the CPU Conv kernel: float32, NCHW, 1-D and 2-D (conv.h), fp32, bf16 or bf16x3
// products (precision="bf16" or "bf16x3": always an implicit GEMM, see conv.h). 3-D convolutions
// reach it as 2-D ones over depth windows (the LowerConv3D pass, level 2); at levels 0 and 1, and
// in other dtypes, they are declined and run on the reference interpreter. The blocked-layout
// kernels are in conv_blocked.cpp.
#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>

#include "backend/cpu/conv/conv.h"
#include "backend/cpu/conv/winograd.h"
#include "backend/cpu/isa/isa.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/tile_exec.h"
#include "backend/cpu/tile_kernel.h"
#include "ir/ops/blocked_layout.h"
#include "ir/ops/op_params.h"
#include "pto/error.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

// The calling thread's scratch slot of the blocked path's input and output copies.
constexpr int kBlockedScratch = 2;

bool accepts(const NodeInfo& info) {
  if (!accepts_f32_conv(info) || !precision_of(info.node)) return false;
  // bf16x3 products run as an implicit GEMM; a grouped conv with one input channel per group (a
  // depthwise one, never marked by ConvPrecision: memory bound) has no such kernel here.
  if (!params::split_bf16_products(info.node) || info.node.attrs.get_int("group", 1) == 1)
    return true;
  const auto& w = info.inputs[1].shape;
  return w && w->size() >= 2 && (*w)[1].value > 1;
}

// A constant W packed once per group as the GEMM's A operand, and W's shape to give it back; or,
// for a conv on a small plane (conv_algo), W in the blocked layout instead, with the input shape
// that path was chosen for, and for Winograd (the knob conv.algo {2}) also its transformed U.
// The blocked weights of a conv whose plane is known only at run time (a model exported with
// dynamic height and width), made from the packed ones the first time a small plane comes.
struct LateBlocked {
  std::once_flag once;
  Tensor w;
};

// The small-output kernel's weights (pack_small_weights) of a conv whose plane is known only at
// run time, made from the packed ones the first time a plane small_output_wins for comes.
struct LateSmall {
  std::once_flag once;
  Tensor w;
};

// The taps kernel's weights (pack_taps_weights) of a bf16 or bf16x3 conv: packed in prepare() where
// the compile-time shapes take that kernel, else from the packed ones the first time a run takes
// it (taps_conv_applies: the machine and the plane decide).
struct LateTaps {
  std::once_flag once;
  PackedA w;
  int64_t group = 1;
};

// The implicit GEMM's weights (pack_weights) of a conv whose weights prepare() packed for the taps
// kernel only, made from those the first time a run does not take it (another plane, the tiles
// or the kernel turned off).
struct LateGroups {
  std::once_flag once;
  std::vector<PackedA> groups;
};

struct PreparedW {
  std::vector<PackedA> groups;
  Dims shape;
  // Defined: the small-output kernel (conv_small), the weights as pack_small_weights lays them
  // out (`groups` then empty).
  Tensor small;
  std::shared_ptr<LateSmall> late_small;  // set: the plane is unknown at compile time
  std::shared_ptr<LateTaps> taps;         // set: bf16 or bf16x3 products, one group
  bool taps_expected = false;  // the compile-time shapes take the taps kernel on this machine
  std::shared_ptr<LateGroups> late_groups;  // set: `groups` dropped for the taps weights
  // Set: the plane is unknown at compile time, the channels fit the blocked kernel, and a run
  // whose output plane is small (small_plane_blocked) takes it, with weights made on first use.
  std::shared_ptr<LateBlocked> late;
  int late_block = 0;
  Tensor blocked;  // defined: the blocked path
  Dims x_chw;      // the input's [C, H, W] it was chosen for (the batch may vary)
  int block = 0;
  bool depthwise = false;
  std::optional<WinogradWeights> winograd;  // set: Winograd on the blocked tensors
};

// The algorithms of the NCHW Conv kernel, as the "conv.algo" knob names them.
enum ConvAlgo : int64_t {
  kImplicitGemm = 0,
  kBlockedDirect = 1,
  kBlockedWinograd = 2,
  kSmallOutput = 3
};

// The channel block of the blocked kernel on this machine (its vectors' float lanes), 0: none.
int channel_block() {
  switch (active_isa()) {
    case Isa::kAvx512:
      return 16;
    case Isa::kAvx2:
      return 8;
    default:
      return 0;
  }
}

// When a conv runs on the blocked direct kernel inside this NCHW kernel (input reordered in, output
// out): on small output planes, where the implicit GEMM wastes work on short rows (a 7x7 plane
// is 49 columns of 64-wide panels) and the reorders are cheap. Measured on ResNet-50 and
// MobileNetV2 at level 2, 1 thread, one process, per layer against the NCHW kernels: 3x3 convs
// on 14x14 planes 12% faster, every conv on 7x7 planes 10-27% faster, depthwise convs with 14x14
// and 7x7 outputs 1.2-2.7x; but 1x1 convs on 14x14 planes 4-12% slower (the GEMM wastes little
// on 196 columns and the output reorder costs more) and a depthwise conv with a 28x28 output
// 1.6x slower. Convs with a 3x3 (or larger) window win up to 80x80 outputs, reorders included
// (3x3 + ReLU alone, min of 30-40, two rounds, against the 16x16 rule): 128 -> 128 @28 2.30 ->
// 2.09 ms, 256 -> 256 @28 9.4 -> 8.7, 96 @36 2.10 -> 1.98, 64 @40 1.16 -> 1.12, 32 @40 0.31 ->
// 0.29, stride 2 56 -> 28 1.19 -> 1.08, 112 -> 56 1.25 -> 1.15, YOLOv8's 16 -> 32 160 -> 80 0.75
// -> 0.64, 16 @80 0.32 -> 0.31; at par on 64 @56 and 48 @64 (YOLOv8n at level 2: kernel sum -4%,
// its 80x80 layers at par inside the model).
constexpr int64_t kBlockedPlane = 80 * 80, kBlockedPointwisePlane = 8 * 8,
                  kBlockedDepthwisePlane = 14 * 14;

// Whether the plane-size rule puts a conv of this kernel (kh x kw, group 1 or depthwise) with
// this output plane on the blocked kernel.
bool small_plane_blocked(int64_t plane, int64_t kh, int64_t kw, bool depthwise) {
  if (depthwise) return plane <= kBlockedDepthwisePlane;
  return plane <= (kh * kw > 1 ? kBlockedPlane : kBlockedPointwisePlane);
}

// A stem (group 1, fewer input channels than a block, a window larger than 1x1) can run on the
// blocked kernel reading its NCHW input as it is (x_nchw, no reorder in; the "conv.algo" knob
// {1}), but the planner leaves it on the GEMM: alone, at stride 2 with filled output blocks, it
// was 3-8% faster (YOLOv8's 3 -> 16 @320 493 -> 473 us, MobileNetV2's 3 -> 32 @224 333 -> 305,
// ResNet's 7x7 3 -> 64 @224 2.49 -> 2.33 ms; 1 thread, min of 30), but inside the models, where
// its output goes on to the next kernel, MobileNetV2's stem was 2-8% slower, ResNet-18's within
// noise and YOLOv8n's 9% faster: no rule that holds. Larger outputs (3 -> 32 @640: 3.9 -> 4.4-4.8
// ms) and partly empty blocks (3 -> 24 at stride 1: 84 -> 123 us) lose alone too.

// Whether Conv `info` (W constant, f32, group 1) could take the blocked kernel for channel block
// `block` but its output plane is unknown at compile time: then run() decides per call.
bool late_blockable(const NodeInfo& info, const Tensor& w, int64_t group, int block) {
  const auto& xs = info.inputs[0].shape;
  if (block == 0 || group != 1 || w.rank() != 4 || !xs || xs->size() != 4) return false;
  if (!(*xs)[1].is_known() || ((*xs)[2].is_known() && (*xs)[3].is_known())) return false;
  if (info.knob("conv.algo")) return false;
  const int64_t c = (*xs)[1].value;
  return c >= block && c == w.dim(1) &&
         info.node.attrs.get_string("auto_pad", "NOTSET") == "NOTSET";
}

// The output plane of Conv `info` (W constant, f32) when the blocked kernel can run it for channel
// block `block` (a depthwise conv, or one of group 1, on at least `block` input channels).
std::optional<int64_t> blocked_plane(const NodeInfo& info, const Tensor& w, int64_t group,
                                     int block) {
  const auto& xs = info.inputs[0].shape;
  if (block == 0 || w.rank() != 4 || !xs || xs->size() != 4) return std::nullopt;
  for (size_t d = 1; d < 4; ++d)  // the batch may be symbolic
    if (!(*xs)[d].is_known()) return std::nullopt;
  const int64_t c = (*xs)[1].value;
  if (c != w.dim(1) * group) return std::nullopt;  // a mismatch
  if (c < block && (group != 1 || w.dim(2) * w.dim(3) == 1)) return std::nullopt;
  if (info.node.attrs.get_string("auto_pad", "NOTSET") != "NOTSET") return std::nullopt;
  if (group != 1 && !(group == c && w.dim(0) == c && w.dim(1) == 1)) return std::nullopt;
  try {
    const ConvGeometry g =
        conv_geometry(info.node.attrs, {1, c, (*xs)[2].value, (*xs)[3].value}, w.shape(), "");
    // Sizes whose plane overflows (a damaged model) take no blocked kernel; run() reports them.
    if (g.ow > 0 && g.oh > std::numeric_limits<int64_t>::max() / g.ow) return std::nullopt;
    return g.out_plane();
  } catch (const ValueError&) {
    return std::nullopt;  // run() reports it
  }
}

// The geometry of Conv `info` (W constant, f32, rank 3 or 4; batch 1) when the small-output
// kernel can run it (not depthwise) and X's channels and spatial sizes are known at compile time.
std::optional<ConvGeometry> small_output_geometry(const NodeInfo& info, const Tensor& w,
                                                  int64_t group) {
  const auto& xs = info.inputs[0].shape;
  if (!xs || xs->size() != static_cast<size_t>(w.rank()) || (w.dim(1) == 1 && group > 1))
    return std::nullopt;
  Dims x = {1};
  for (size_t d = 1; d < xs->size(); ++d) {
    if (!(*xs)[d].is_known()) return std::nullopt;
    x.push_back((*xs)[d].value);
  }
  try {
    const ConvGeometry g = conv_geometry(info.node.attrs, x, w.shape(), "");
    if (g.ow > 0 && g.oh > std::numeric_limits<int64_t>::max() / g.ow) return std::nullopt;
    return g;
  } catch (const ValueError&) {
    return std::nullopt;  // run() reports it
  }
}

// Whether Winograd F(4x4, 3x3) computes Conv `info` (blocked_plane holds for it): group 1, 3x3,
// stride 1, dilation 1.
bool winograd_fits(const NodeInfo& info, const Tensor& w, int64_t group) {
  if (group != 1 || w.rank() != 4) return false;
  const Shape& xs = *info.inputs[0].shape;
  BlockedConv b;
  static_cast<ConvWindow&>(b) =
      conv_geometry(info.node.attrs, {1, w.dim(1), xs[2].value, xs[3].value}, w.shape(), "");
  return winograd_applies(b);
}

// Whether depthwise conv `info` (output plane `plane`) takes the blocked kernel. With the flat
// kernel on (conv.h depthwise_flat_applies, PTO_DEPTHWISE_FLAT not 0), a stride-1 conv does not
// unless half its taps or more read padding: no reorders, and faster alone than the blocked
// kernel on the planes the plane-size rule gave that (Conv 3x3 + Clip, 1 thread, p50 of 300
// calls x3, blocked -> flat, us: 192 @12 21.0 -> 15.6, 576 @6 22.8 -> 13.0, 384 @6 15.6 -> 9.1,
// 960 @3 15.6 -> 11.4, 576 @14 84.7 -> 64.5, 960 @7 46.4 -> 35.7), but not on 2x2 planes, whose
// padding taps the blocked kernel skips (EfficientNet-B0 at 64x64: 1152 @2 3x3 + SiLU 16.8 vs
// 42.8, 5x5 21 vs 63). Strided ones keep the rule: on small planes the flat kernel's phase split
// costs more than the reorders (alone, blocked / flat: 576 @6 s2 11.1 / 20.6, 192 @12 9.9 /
// 12.3, 960 @7 25.2 / 36.4); on 24x24 and 28x28 outputs the blocked kernel was faster alone (96
// @48 58.7 / 67.4, 144 @56 120 / 128, before the split's divisions went) but not inside
// MobileNetV2 (96x96 at par, 224x224 1% slower), so the rule's 14x14 bound stays.
bool depthwise_blocked(const NodeInfo& info, const Tensor& w, int64_t plane) {
  const bool by_rule = small_plane_blocked(plane, w.dim(2), w.dim(3), true);
  if (!depthwise_flat_enabled()) return by_rule;
  const bool rows = depthwise_rows_enabled();  // (outside the try: a bad value is an error)
  const auto& xs = info.inputs[0].shape;
  try {
    const ConvGeometry g = conv_geometry(
        info.node.attrs, {1, (*xs)[1].value, (*xs)[2].value, (*xs)[3].value}, w.shape(), "");
    // Tiny planes where most taps read padding (2x2 planes: 1152 @2 3x3 + SiLU 16.8 blocked,
    // 42.8 us flat; 5x5 21 / 63) keep the blocked kernel, which skips those taps.
    // Strided convs the rows kernel takes (conv.h depthwise_rows_applies) skip the reorders:
    // alone, blocked -> rows kernel, 144 @24 s2 23.0 -> 12.9 us, 576 @14 s2 38.5 -> 29.4.
    if (by_rule && rows && depthwise_rows_applies(g)) return false;
    return by_rule &&
           !(g.sh == 1 && g.sw == 1 && depthwise_flat_applies(g) && valid_tap_share(g) >= 0.5);
  } catch (const ValueError&) {
    return by_rule;  // run() reports it
  }
}

// The algorithm of Conv `info` (W constant, f32) for channel block `block`: the "conv.algo"
// knob when set, else the plane-size rule (which never picks Winograd inside this kernel: the
// reorders around it and its rounding are the tuner's to weigh, per machine).
ConvAlgo conv_algo(const NodeInfo& info, const Tensor& w, int64_t group, int block) {
  const std::optional<int64_t> plane = blocked_plane(info, w, group, block);
  if (const std::vector<int64_t>* algo = info.knob("conv.algo")) {
    if ((*algo)[0] == kSmallOutput) return kSmallOutput;  // check_conv_knob: it applies
    return plane ? static_cast<ConvAlgo>((*algo)[0]) : kImplicitGemm;
  }
  // The blocked kernel is the alternative for a 2-D conv of group 1 on a block of inputs or more.
  const bool blocked = plane && group == 1 && w.dim(1) >= block;
  if (const std::optional<ConvGeometry> small = small_output_geometry(info, w, group);
      small && small_output_wins(*small, blocked))
    return kSmallOutput;
  if (!plane) return kImplicitGemm;
  if (w.dim(1) * group < block) return kImplicitGemm;  // a stem: see above
  if (group != 1) return depthwise_blocked(info, w, *plane) ? kBlockedDirect : kImplicitGemm;
  return small_plane_blocked(*plane, w.dim(2), w.dim(3), group != 1) ? kBlockedDirect
                                                                     : kImplicitGemm;
}

// The "conv.cols" knob: {columns} per GEMM of the implicit-GEMM path, which the conv must take
// (not depthwise, not the shifted path, not the blocked kernels).
std::string check_conv_cols(const NodeInfo& info, const std::vector<int64_t>& v,
                            const std::string& where) {
  if (v.size() != 1 || v[0] < 16 || v[0] > (int64_t{1} << 30))
    throw ValueError(
        cat(where, ": knob conv.cols must be {columns in [16, 2^30]}, got ", dims_str(v)));
  const auto& xs = info.inputs[0].shape;
  const auto& ws = info.inputs[1].shape;
  bool known = xs && ws && xs->size() == 4 && ws->size() == 4;
  for (size_t d = 1; known && d < 4; ++d) known = (*xs)[d].is_known() && (*ws)[d].is_known();
  if (!known || !(*ws)[0].is_known())
    throw ValueError(cat(where, ": knob conv.cols needs a 2-D conv of known channels and sizes"));
  Dims wd;
  for (const Dim& d : *ws) wd.push_back(d.value);
  ConvGeometry g = conv_geometry(info.node.attrs,
                                 {1, (*xs)[1].value, (*xs)[2].value, (*xs)[3].value}, wd, where);
  int64_t group = 1;
  const Tensor* w = constant_conv_weight(info, &group);
  const ConvAlgo algo = w && precision_of(info.node) == Precision::kF32
                            ? conv_algo(info, *w, group, channel_block())
                            : kImplicitGemm;
  if (algo != kImplicitGemm || conv_column_block(g) == 0)
    throw ValueError(cat(where, ": knob conv.cols: the conv does not run on the implicit GEMM (",
                         algo == kSmallOutput    ? "small-output kernel"
                         : algo != kImplicitGemm ? "blocked kernel"
                         : g.depthwise()         ? "depthwise"
                                                 : "shifted path",
                         ")"));
  g.cols = v[0];
  return cat("knob conv.cols: ", conv_column_block(g), " output columns per GEMM");
}

// The "conv.algo" knob: {0} the implicit GEMM, {1} the blocked direct kernel, {2} Winograd
// F(4x4, 3x3) on the blocked tensors; {1} and {2} must apply. And "conv.cols" (check_conv_cols)
// and "conv.threads".
std::string check_conv_knob(const NodeInfo& info, const std::string& knob,
                            const std::vector<int64_t>& v, const std::string& where) {
  if (knob == "conv.cols") return check_conv_cols(info, v, where);
  if (knob == "conv.threads") {
    // {1}: the whole conv (and its epilogue) on the thread that runs the step, its work cut as on
    // the pool (run_as_on_pool), so the result is the same bits; with one thread that is what
    // runs anyway, so the knob would change nothing.
    if (v.size() != 1 || v[0] != 1)
      throw ValueError(cat(where, ": knob conv.threads must be {1} (the conv on the calling ",
                           "thread only), got ", dims_str(v)));
    if (num_threads() < 2)
      throw ValueError(cat(where, ": knob conv.threads {1} changes nothing on one thread"));
    return "knob conv.threads: the calling thread only";
  }
  if (knob != "conv.algo") throw ValueError(cat(where, ": takes no knob '", knob, "'"));
  if (v.size() != 1 || v[0] < kImplicitGemm || v[0] > kSmallOutput)
    throw ValueError(cat(where, ": knob conv.algo must be {0} (implicit GEMM), {1} (blocked ",
                         "direct), {2} (blocked Winograd) or {3} (small output), got ",
                         dims_str(v)));
  const bool f32 = precision_of(info.node) == Precision::kF32;
  const int64_t group = info.node.attrs.get_int("group", 1);
  if (v[0] == kSmallOutput) {
    // Any plane computes; the knob applies to a constant fp32 W of a conv that is not depthwise.
    int64_t g = 1;
    const Tensor* w = constant_conv_weight(info, &g);
    if (!w || !f32 || (w->dim(1) == 1 && g > 1))
      throw ValueError(cat(where, ": knob conv.algo {3}: the small-output kernel needs a constant ",
                           "fp32 W and a conv that is not depthwise"));
    return "knob conv.algo: small output";
  }
  if (v[0] != kImplicitGemm && (!info.is_constant(1) || !f32 ||
                                !blocked_plane(info, *info.constants[1], group, channel_block())))
    throw ValueError(
        cat(where, ": knob conv.algo ", dims_str(v), ": the blocked kernel does not apply"));
  if (v[0] == kBlockedWinograd && (!winograd_fits(info, *info.constants[1], group) ||
                                   (*info.inputs[0].shape)[1].value < channel_block()))
    throw ValueError(cat(where, ": knob conv.algo {2}: Winograd F(4x4, 3x3) needs a 3x3 kernel, ",
                         "stride 1, dilation 1, group 1 and at least a block of input channels"));
  const char* names[] = {"implicit GEMM", "blocked direct", "blocked Winograd F(4x4,3x3)",
                         "small output"};
  return cat("knob conv.algo: ", names[v[0]]);
}

std::any prepare(const NodeInfo& info) {
  int64_t group = 1;
  const Tensor* wp = constant_conv_weight(info, &group);
  if (!wp) return {};
  const Tensor& w = *wp;
  // bf16 products always take the implicit GEMM (the blocked kernel is fp32).
  const Precision precision = *precision_of(info.node);
  const int block = channel_block();
  const ConvAlgo algo =
      precision == Precision::kF32 ? conv_algo(info, w, group, block) : kImplicitGemm;
  if (algo == kSmallOutput) {
    PreparedW p;
    p.shape = w.shape();
    p.small = pack_small_weights(w.data<float>(), w.dim(0), w.dim(1), w.rank() == 4 ? w.dim(2) : 1,
                                 w.dim(-1), group);
    return p;
  }
  if (algo != kImplicitGemm) {
    PreparedW p;
    p.shape = w.shape();
    p.depthwise = group > 1;
    p.blocked = blocked_conv_weights(w, p.depthwise, block);
    p.block = block;
    for (size_t d = 1; d < 4; ++d) p.x_chw.push_back((*info.inputs[0].shape)[d].value);
    if (algo == kBlockedWinograd) {
      WinogradWeights u;
      u.always = true;  // the knob chose it for this conv: at every batch
      prepare_winograd(p.blocked.data<float>(), (w.dim(0) + block - 1) / block,
                       (w.dim(1) + block - 1) / block, block, w.dim(1), u);
      p.winograd = std::move(u);
    }
    return p;
  }
  std::vector<PackedA> packed =
      pack_weights(w.data<float>(), w.dim(0), w.dim(1), w.rank() == 4 ? w.dim(2) : 1, w.dim(-1),
                   group, precision);
  if (packed.empty()) return {};
  PreparedW p{std::move(packed), w.shape()};
  if (precision == Precision::kBF16 || precision == Precision::kBF16x3) {
    p.taps = std::make_shared<LateTaps>();
    p.taps->group = group;
    const std::optional<ConvGeometry> g = small_output_geometry(info, w, group);
    p.taps_expected = g && g->ih > 0 && taps_conv_applies(*g);
    if (p.taps_expected)  // packed now, so the first run is not slower and stats count them
      std::call_once(p.taps->once,
                     [&] { p.taps->w = pack_taps_weights(w.data<float>(), *g, precision); });
    p.taps_expected = p.taps_expected && p.taps->w.m() == w.dim(0);  // else the GEMM's
    // The weights held once: the GEMM's packing only where a run needs it.
    if (p.taps_expected) {
      p.groups.clear();
      p.late_groups = std::make_shared<LateGroups>();
    }
  }
  if (precision == Precision::kF32 && late_blockable(info, w, group, block)) {
    p.late = std::make_shared<LateBlocked>();
    p.late_block = block;
  }
  // The plane unknown at compile time (Silero VAD's convs, inside an If): a run on a small one
  // takes the small-output kernel, its weights made on first use.
  if (precision == Precision::kF32 && !info.knob("conv.algo") &&
      !small_output_geometry(info, w, group))
    p.late_small = std::make_shared<LateSmall>();
  return p;
}

// The taps kernel's layout of K for the weights p holds (W [m, cg, (kh,) kw]).
TapsLayout taps_layout_of(const PreparedW& p) {
  const int64_t kh = p.shape.size() == 4 ? p.shape[2] : 1;
  return taps_layout(p.shape[1] * p.taps->group, p.shape[0], p.taps->group, kh, p.shape.back());
}

// W [m, cg, kh, kw] is the groups' A matrices [m/group, cg*kh*kw] one after another, or the
// blocked weights blocked_conv_weights made.
Tensor unpack(const std::any& state, size_t input) {
  const auto& p = std::any_cast<const PreparedW&>(state);
  PTO_CHECK(input == 1) << "Conv: only W is packed";
  Tensor w = Tensor::empty(DType::kF32, p.shape);
  float* out = w.data<float>();
  if (p.small.defined()) {
    const int64_t r = static_cast<int64_t>(p.shape.size());
    unpack_small_weights(p.small.data<float>(), p.shape[0], p.shape[1], r == 4 ? p.shape[2] : 1,
                         p.shape[r - 1], p.small.dim(0), out);
    return w;
  }
  if (p.blocked.defined()) {
    const float* d = p.blocked.data<float>();
    const int64_t m = p.shape[0], c = p.shape[1], k = p.shape[2] * p.shape[3], b = p.block;
    const int64_t icb = (c + b - 1) / b;
    for (int64_t o = 0; o < m; ++o)
      for (int64_t i = 0; i < c; ++i)
        for (int64_t q = 0; q < k; ++q)
          out[(o * c + i) * k + q] =
              p.depthwise ? d[((o / b) * k + q) * b + o % b]
                          : d[((((o / b) * icb + i / b) * k + q) * b + i % b) * b + o % b];
    return w;
  }
  if (p.groups.empty() && p.taps) {  // [m, K] (TapsLayout) -> [m, cg, (kh,) kw]
    const std::vector<float> rows = p.taps->w.unpack();
    const TapsLayout l = taps_layout_of(p);
    const int64_t cg = l.c / l.group, taps = l.kh * l.kw;
    for (int64_t o = 0; o < l.m; ++o)
      for (int64_t i = 0; i < cg; ++i)
        for (int64_t t = 0; t < taps; ++t)
          out[(o * cg + i) * taps + t] = rows[o * l.k() + l.column(o, i, t / l.kw, t % l.kw)];
    return w;
  }
  for (const PackedA& a : p.groups) {
    const std::vector<float> rows = a.unpack();
    out = std::copy(rows.begin(), rows.end(), out);
  }
  return w;
}

// The conv on the blocked kernel: x reordered to [n, ceil(c/b), ih, iw, b] and the result back to
// NCHW in the calling thread's scratch, the bias in the accumulators, and the fused epilogue (any
// form) on the NCHW output.
void run_blocked(const ConvGeometry& g, const PreparedW& p, const float* x, const float* bias,
                 float* y, const Epilogue& ep) {
  const int64_t b = p.block, icb = (g.c + b - 1) / b, ocb = (g.m + b - 1) / b;
  BlockedConv k;
  static_cast<ConvWindow&>(k) = g;
  k.n = g.n;
  k.icb = icb;
  k.ocb = ocb;
  k.block = b;
  k.channels = g.c;
  k.depthwise = p.depthwise;
  // A stem (fewer input channels than a block, group 1) reads the NCHW input as it is.
  k.x_nchw = g.c < b && !p.depthwise;
  const int64_t xn = k.x_nchw ? 0 : g.n * icb * g.in_plane() * b,
                yn = g.n * ocb * g.out_plane() * b;
  float* xb = scratch_as<float>(static_cast<size_t>(xn + yn + ocb * b), kBlockedScratch);
  float *yb = xb + xn, *bp = yb + yn;
  std::fill(bp, bp + ocb * b, 0.0f);
  if (bias) std::copy(bias, bias + g.m, bp);
  const float* xs = xb;
  if (k.x_nchw)
    xs = x;
  else
    to_blocked(x, xb, g.n, g.c, g.in_plane(), b);
  // An activation alone runs on the blocked accumulators (ReLU and Clip in registers); a
  // residual (laid out NCHW) or a tile program, on the NCHW output.
  const bool act_only = !ep.tile && !ep.residual;
  if (p.winograd)
    winograd_conv(k, *p.winograd, xs, bp, yb, act_only ? ep : Epilogue{});
  else
    conv_blocked_rows(k, xs, p.blocked.data<float>(), bp, yb, act_only ? ep : Epilogue{});
  const int64_t hw = g.out_plane();
  from_blocked(yb, y, g.n, g.m, hw, b);
  if (act_only) return;
  parallel_for(0, g.n * g.m, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1;) {  // rows [r, e) of image n
      const int64_t n = r / g.m, i0 = r % g.m, e = std::min(r1, (n + 1) * g.m);
      float* c = y + r * hw;
      if (ep.tile) {
        EpilogueOperand operands[kTileMaxRegs];
        apply_epilogue(epilogue_at(ep, n, 0, 0, operands), c, hw, i0, e - r, 0, hw);
      } else {
        Epilogue a = ep;
        if (a.residual) a.residual += r * hw;
        a.ldr = hw;
        apply_epilogue(a, c, hw, 0, e - r, 0, hw);
      }
      r = e;
    }
  });
}

std::vector<Tensor> run_conv(const KernelContext& c) {
  const std::string where = c.where();
  const Tensor &x = c.input(0), &w = c.input(1);
  ConvGeometry g = conv_geometry(c.attrs(), x.shape(), w.shape(), where);
  if (c.knobs)
    if (auto it = c.knobs->find("conv.cols"); it != c.knobs->end()) g.cols = it->second[0];
  const float* bias = nullptr;
  if (c.has_input(2)) {
    const Tensor& b = c.input(2);
    if (b.rank() != 1 || b.dim(0) != g.m)
      throw ValueError(cat(where, ": B must be 1-D with ", g.m, " elements, got ", b.str()));
    bias = b.data<float>();
  }
  Dims yshape = {g.n, g.m, g.oh, g.ow};
  if (x.rank() == 3) yshape.erase(yshape.begin() + 2);
  const Epilogue ep = conv_epilogue(c.epilogue, yshape, where);
  if (c.epilogue && c.epilogue->bias.defined())
    bias = c.epilogue->bias.data<float>();  // the group's bias (Conv had none)
  Tensor y = Tensor::empty(DType::kF32, yshape);
  const PackedA* packed = nullptr;
  const float* wp = w.data<float>();
  Tensor unpacked;
  if (c.state && c.state->has_value()) {  // then W's data may have been released
    const auto& p = c.prepared<PreparedW>();
    if (p.small.defined()) {
      PTO_CHECK(p.small.dim(0) == g.group)
          << where << ": W was packed for " << p.small.dim(0) << " groups";
      conv_small(g, x.data<float>(), p.small.data<float>(), bias, y.data<float>(), ep);
      return one(std::move(y));
    }
    if (p.late_small && small_output_wins(g, p.late && x.rank() == 4 && g.group == 1 &&
                                                 p.late_block == channel_block())) {
      std::call_once(p.late_small->once, [&] {
        const Tensor wu = unpack(*c.state, 1);
        p.late_small->w = pack_small_weights(wu.data<float>(), g.m, g.cg(), g.kh, g.kw, g.group);
      });
      conv_small(g, x.data<float>(), p.late_small->w.data<float>(), bias, y.data<float>(), ep);
      return one(std::move(y));
    }
    if (p.blocked.defined() && x.rank() == 4 &&
        Dims(x.shape().begin() + 1, x.shape().end()) == p.x_chw) {
      run_blocked(g, p, x.data<float>(), bias, y.data<float>(), ep);
      return one(std::move(y));
    }
    if (p.late && x.rank() == 4 && g.group == 1 && p.late_block == channel_block() &&
        small_plane_blocked(g.out_plane(), g.kh, g.kw, false)) {
      // A small plane that the compile could not see: the blocked kernel, as for a known one.
      std::call_once(p.late->once, [&] {
        p.late->w = blocked_conv_weights(unpack(*c.state, 1), false, p.late_block);
      });
      PreparedW b;
      b.blocked = p.late->w;
      b.block = p.late_block;
      run_blocked(g, b, x.data<float>(), bias, y.data<float>(), ep);
      return one(std::move(y));
    }
    if (p.blocked.defined()) {  // not the shape it was prepared for: the plain path on W
      unpacked = unpack(*c.state, 1);
      wp = unpacked.data<float>();
    } else {
      if (p.taps && taps_conv_applies(g)) {
        std::call_once(p.taps->once, [&] {
          p.taps->w =
              pack_taps_weights(unpack(*c.state, 1).data<float>(), g,
                                p.groups.empty() ? p.taps->w.precision() : p.groups[0].precision());
        });
        if (p.taps->w.m() == g.m) {
          conv_taps(g, x.data<float>(), p.taps->w, bias, y.data<float>(), ep);
          return one(std::move(y));
        }
      }
      if (p.late_groups)
        std::call_once(p.late_groups->once, [&] {
          const Tensor wu = unpack(*c.state, 1);
          p.late_groups->groups = pack_weights(wu.data<float>(), g.m, g.cg(), g.kh, g.kw, g.group,
                                               p.taps->w.precision());
        });
      const std::vector<PackedA>& groups = p.late_groups ? p.late_groups->groups : p.groups;
      PTO_CHECK(static_cast<int64_t>(groups.size()) == g.group && !g.depthwise())
          << where << ": W was packed for " << groups.size() << " groups";
      packed = groups.data();
    }
  }
  conv2d(g, x.data<float>(), wp, bias, y.data<float>(), ep, packed, *precision_of(c.node));
  return one(std::move(y));
}

// The "conv.threads" knob {1} runs the conv on the calling thread, as if it had the pool: on a
// small conv the pool's hand-off costs more than the second thread saves.
std::vector<Tensor> run(const KernelContext& c) {
  if (c.knobs && c.knobs->count("conv.threads") && !in_parallel_region()) {
    std::vector<Tensor> out;
    run_as_on_pool([&] { out = run_conv(c); });
    return out;
  }
  return run_conv(c);
}

}  // namespace

const Tensor* constant_conv_weight(const NodeInfo& info, int64_t* group) {
  if (!info.is_constant(1)) return nullptr;
  const Tensor& w = *info.constants[1];
  if ((w.rank() != 3 && w.rank() != 4) || w.dtype() != DType::kF32) return nullptr;
  *group = info.node.attrs.get_int("group", 1);
  if (*group < 1 || w.dim(0) % *group != 0) return nullptr;  // run() reports the error
  return &w;
}

bool accepts_f32_conv(const NodeInfo& info) {
  const size_t n = info.inputs.size();
  if (n < 2 || info.dtype(0) != DType::kF32 || info.dtype(1) != DType::kF32) return false;
  if (n > 2 && info.dtype(2) != DType::kF32 && info.dtype(2) != DType::kUndefined) return false;
  // X's rank, or W's where X's is not known (a value out of an If or a sequence: Silero VAD's
  // decoder Conv reads an If that squeezes a dimension or not): ONNX makes them equal, and run()
  // checks the ranks it is given.
  const auto &x = info.inputs[0].shape, &w = info.inputs[1].shape;
  const size_t rank = x ? x->size() : w ? w->size() : 0;
  return rank == 3 || rank == 4;
}

std::optional<EpilogueOperand> conv_operand_strides(const Dims& t, const Dims& y) {
  if (t.size() > y.size() || y.size() < 3) return std::nullopt;
  // Strides of t through y's dimensions (0 where t broadcasts).
  Dims s(y.size(), 0);
  int64_t step = 1;
  for (size_t d = t.size(); d-- > 0;) {
    const size_t yd = d + y.size() - t.size();
    if (t[d] != y[yd] && t[d] != 1) return std::nullopt;
    if (t[d] != 1) s[yd] = step;
    step *= t[d];
  }
  // The positions are the flattened spatial dimensions: t must step through them all by one, or
  // not at all (a dimension of size 1 steps either way).
  int64_t col = 0;
  for (size_t d = 2; d < y.size(); ++d)
    if (s[d] != 0) col = 1;
  int64_t inner = 1;  // positions per step of dimension d
  for (size_t d = y.size(); d-- > 2; inner *= y[d])
    if (y[d] > 1 && s[d] != col * inner) return std::nullopt;
  return EpilogueOperand{nullptr, s[1], col, s[0]};
}

Epilogue conv_epilogue(const FusedEpilogue* f, const Dims& yshape, const std::string& where) {
  Epilogue ep;
  if (!f) return ep;
  if (f->tile) {
    f->tile_operands.clear();
    for (const Tensor& t : f->tile_inputs) {
      std::optional<EpilogueOperand> o = conv_operand_strides(t.shape(), yshape);
      if (!o || t.dtype() != DType::kF32)
        throw KernelDeclined(cat(where, ": epilogue operand ", t.str(),
                                 " is not per channel, per position, per image or of the output ",
                                 dims_str(yshape)));
      o->data = t.data<float>();
      f->tile_operands.push_back(*o);
    }
    ep.tile = f->tile;
    ep.tile_operands = f->tile_operands.data();
    return ep;
  }
  if (f->residual.defined()) {
    if (f->residual.shape() != yshape)
      throw KernelDeclined(cat(where, ": fused residual ", f->residual.str(),
                               " does not match the output ", dims_str(yshape)));
    ep.residual = f->residual.data<float>();
  }
  ep.act = f->act;
  ep.lo = f->lo;
  ep.hi = f->hi;
  return ep;
}

void register_conv_kernels(KernelRegistry& r) {
  Kernel conv{accepts, prepare, run};
  conv.packed_inputs = [](const std::any& state) {
    return state.has_value() ? std::vector<size_t>{1} : std::vector<size_t>{};
  };
  conv.packed_bytes = [](const std::any& state) {
    size_t n = 0;
    if (!state.has_value()) return n;
    const auto& p = std::any_cast<const PreparedW&>(state);
    for (const PackedA& a : p.groups) n += a.bytes();
    if (p.blocked.defined()) n += p.blocked.nbytes();
    if (p.small.defined()) n += p.small.nbytes();
    if (p.winograd) n += p.winograd->bytes();
    if (p.taps_expected) n += p.taps->w.bytes();  // packed in prepare (else on a first run)
    return n;
  };
  conv.unpack = unpack;
  conv.check_knob = check_conv_knob;
  conv.describe = [](const std::any& state) {
    if (!state.has_value()) return std::string();
    const auto& p = std::any_cast<const PreparedW&>(state);
    if (p.small.defined())
      return std::string(
          "small output: output channels along the vector lanes, weights packed in panels of 16 "
          "output channels [M/16][K][16]");
    if (p.taps_expected)
      return cat(precision_name(p.taps->w.precision()),
                 taps_layout_of(p).fold > 0
                     ? " products: AMX taps kernel, folded (every kernel row's B tile loaded from "
                       "planes of pairs of (channel, kernel column) values), weights packed "
                       "chunk-major"
                     : " products: AMX taps kernel (every tap's B tile loaded from planes of "
                       "channel pairs), weights packed chunk-major");
    if (!p.blocked.defined())
      return !p.groups.empty() && p.groups[0].precision() != Precision::kF32
                 ? cat(precision_name(p.groups[0].precision()),
                       " products: implicit GEMM, weights packed as ",
                       p.groups[0].chunk_steps() > 0 ? "bf16 pairs for AMX tiles"
                       : p.groups[0].k_per_step() == 2
                           ? "bf16 pairs (vdpbf16ps)"
                           : cat(precision_name(p.groups[0].precision()), "-rounded fp32"))
                 : std::string();
    return cat(p.winograd ? "Winograd F(4x4,3x3)" : "small plane: blocked direct",
               p.depthwise ? " depthwise" : "", " convolution on ", p.block,
               "-channel blocks, input and output reordered inside the kernel");
  };
  r.add("Conv", std::move(conv));
  register_blocked_conv_kernels(r);
  register_conv_transpose_kernels(r);
  register_deform_conv_kernel(r);
}

}  // namespace pto::cpu
