// CPU RNN, GRU and LSTM (float32, the default activations). Per direction, one GEMM projects
// every time step's input at once (X W^T + biases, W packed at compile time when constant); then
// each step multiplies the hidden state by R^T (packed in panels of 32 columns, so one row of h is
// a vector multiply-add per k: recurrent_matvec) and applies the gate math with the vector
// sigmoid and tanh (recurrent_impl.h; docs/backend/recurrent.md). A step is split over the pool by
// ranges of hidden units when it is large enough (each range reads the whole previous state: two
// state buffers, swapped per step); two directions run as two tasks. Semantics as the reference
// (reference/ops/recurrent.cpp): gate orders GRU z r h and LSTM i o f c, peepholes i o f, clip on
// the activations' inputs but not on the cell state's tanh, zeros in Y past a row's sequence
// length. Other activations decline.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <iterator>

#include "backend/cpu/kernel.h"
#include "backend/cpu/recurrent_kernels.h"
#include "backend/cpu/scratch.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

enum class Cell { kRnn, kGru, kLstm };

int64_t gates_of(Cell cell) {
  return cell == Cell::kLstm ? 4 : cell == Cell::kGru ? 3 : 1;
}

// W and R of every direction as the run reads them.
struct Weights {
  std::vector<PackedB> w;              // per direction: X W^T, K = I, N = G * H
  std::vector<std::vector<float>> rt;  // per direction: R^T in panels (pack_r)
  int64_t hidden = 0;
};

// Panels of one gate's hidden units, zero-padded to whole panels.
int64_t panels_per_gate(int64_t H) {
  return (H + kRecurrentPanel - 1) / kRecurrentPanel;
}

// R[d] (G * H x H) transposed into panels (recurrent_kernels.h): gate g's panel q holds
// R[g * H + q * W + c][k] at (g * P + q) * H * W + k * W + c, W = kRecurrentPanel.
std::vector<float> pack_r(const Tensor& R, int64_t d) {
  const int64_t GH = R.dim(1), H = R.dim(2), G = GH / H, P = panels_per_gate(H);
  constexpr int64_t W = kRecurrentPanel;
  std::vector<float> rt(static_cast<size_t>(G * P * H * W), 0.0f);
  const float* r = R.data<float>() + d * GH * H;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t j = 0; j < H; ++j)
      for (int64_t k = 0; k < H; ++k)
        rt[((g * P + j / W) * H + k) * W + j % W] = r[(g * H + j) * H + k];
  return rt;
}

Weights pack_weights(const Tensor& W, const Tensor& R) {
  const int64_t D = W.dim(0), GH = W.dim(1), I = W.dim(2);
  Weights p;
  p.hidden = R.dim(2);
  for (int64_t d = 0; d < D; ++d) {
    p.w.push_back(pack_b(I, GH, W.data<float>() + d * GH * I, I, /*trans_b=*/true));
    p.rt.push_back(pack_r(R, d));
  }
  return p;
}

// W (input 1) or R (input 2) as it was before packing, for running the node on another kernel
// once the runtime released the originals (Kernel::unpack).
Tensor unpack_weights(const std::any& state, size_t input) {
  const auto& p = std::any_cast<const Weights&>(state);
  PTO_CHECK(input == 1 || input == 2) << "RNN/GRU/LSTM: only W and R are packed";
  const auto D = static_cast<int64_t>(p.w.size());
  const int64_t GH = p.w[0].n(), I = p.w[0].k(), H = p.hidden;
  Tensor t = Tensor::empty(DType::kF32, input == 1 ? Dims{D, GH, I} : Dims{D, GH, H});
  float* out = t.data<float>();
  for (int64_t d = 0; d < D; ++d) {
    if (input == 1) {  // the panels unpack to N x K: W[d] itself
      const std::vector<float> w = p.w[d].unpack();
      std::copy(w.begin(), w.end(), out + d * GH * I);
      continue;
    }
    constexpr int64_t W = kRecurrentPanel;
    const int64_t P = panels_per_gate(H);
    for (int64_t g = 0; g < GH / H; ++g)
      for (int64_t j = 0; j < H; ++j)
        for (int64_t k = 0; k < H; ++k)
          out[(d * GH + g * H + j) * H + k] = p.rt[d][((g * P + j / W) * H + k) * W + j % W];
  }
  return t;
}

bool is_default_activations(const Node& n, Cell cell) {
  if (!n.attrs.has("activations")) return true;
  const std::vector<std::string> dflt =
      cell == Cell::kLstm  ? std::vector<std::string>{"sigmoid", "tanh", "tanh"}
      : cell == Cell::kGru ? std::vector<std::string>{"sigmoid", "tanh"}
                           : std::vector<std::string>{"tanh"};
  const std::vector<std::string> names = n.attrs.get_strings("activations");
  if (names.empty() || names.size() % dflt.size() != 0) return false;
  for (size_t i = 0; i < names.size(); ++i) {
    std::string s = names[i];
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    if (s != dflt[i % dflt.size()]) return false;
  }
  return true;
}

bool accepts(const NodeInfo& n, Cell cell) {
  const std::string dir = n.node.attr_string("direction");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional") return false;
  if (!is_default_activations(n.node, cell)) return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 7})
    if (n.dtype(i) != DType::kF32 && !(i >= 3 && n.dtype(i) == DType::kUndefined)) return false;
  const DType lens = n.dtype(4);
  if (lens != DType::kUndefined && lens != DType::kI32 && lens != DType::kI64) return false;
  return n.outputs.empty() || n.outputs[0].dtype == DType::kF32 ||
         n.outputs[0].dtype == DType::kUndefined;
}

std::any prepare(const NodeInfo& n) {
  if (!n.is_constant(1) || !n.is_constant(2)) return {};
  const Tensor &W = *n.constants[1], &R = *n.constants[2];
  if (W.rank() != 3 || R.rank() != 3 || W.dim(0) != R.dim(0) || W.dim(1) != R.dim(1) ||
      R.dim(2) == 0 || W.dim(1) % R.dim(2) != 0)
    return {};  // the run hands it to the reference, which says what is wrong
  return pack_weights(W, R);
}

// The shapes and options of one node, as the reference reads them.
struct Problem {
  Cell cell = Cell::kRnn;
  int64_t G = 1, D = 1, S = 0, B = 0, I = 0, H = 0;
  bool batch_first = false, reverse_only = false;
  bool clip = false, linear_before_reset = false, input_forget = false;
  float clip_value = 0.0f;
  std::vector<int64_t> lens;

  int64_t x_row(int64_t t, int64_t b) const { return batch_first ? b * S + t : t * B + b; }
  int64_t state_at(int64_t d, int64_t b) const { return (batch_first ? b * D + d : d * B + b) * H; }
  int64_t y_at(int64_t t, int64_t d, int64_t b) const {
    return (batch_first ? (b * S + t) * D + d : (t * D + d) * B + b) * H;
  }
};

// The problem of node `c`, or nullopt when the shapes are not the reference's (which then says
// what is wrong).
std::optional<Problem> read_problem(const KernelContext& c, Cell cell) {
  Problem p;
  p.cell = cell;
  p.G = gates_of(cell);
  const std::string dir = c.node.attr_string("direction");
  p.D = dir == "bidirectional" ? 2 : 1;
  p.reverse_only = dir == "reverse";
  p.batch_first = c.node.attr_int("layout") == 1;
  const Tensor &X = c.input(0), &W = c.input(1), &R = c.input(2);
  if (X.rank() != 3 || W.rank() != 3 || R.rank() != 3) return std::nullopt;
  p.S = X.dim(p.batch_first ? 1 : 0), p.B = X.dim(p.batch_first ? 0 : 1), p.I = X.dim(2);
  p.H = c.attrs().get_int("hidden_size", R.dim(2));
  const int64_t GH = p.G * p.H;
  if (p.H <= 0) return std::nullopt;  // nothing to compute: the reference's empty outputs
  if (W.shape() != Dims{p.D, GH, p.I} || R.shape() != Dims{p.D, GH, p.H}) return std::nullopt;
  const Dims state = p.batch_first ? Dims{p.B, p.D, p.H} : Dims{p.D, p.B, p.H};
  auto shape_is = [&](size_t i, const Dims& s) {
    return !c.has_input(i) || c.input(i).shape() == s;
  };
  if (!shape_is(3, {p.D, 2 * GH}) || !shape_is(5, state)) return std::nullopt;
  if (cell == Cell::kLstm && (!shape_is(6, state) || !shape_is(7, {p.D, 3 * p.H})))
    return std::nullopt;
  p.lens.assign(static_cast<size_t>(p.B), p.S);
  if (c.has_input(4)) {
    const Tensor& l = c.input(4);
    if (l.numel() != p.B) return std::nullopt;
    for (int64_t b = 0; b < p.B; ++b) {
      p.lens[b] = static_cast<int64_t>(l.item_as_double(b));
      if (p.lens[b] < 0 || p.lens[b] > p.S) return std::nullopt;
    }
  }
  p.clip = c.attrs().has("clip");
  p.clip_value = static_cast<float>(c.attrs().get_float("clip", 0.0));
  p.linear_before_reset = cell == Cell::kGru && c.node.attr_int("linear_before_reset") != 0;
  p.input_forget = cell == Cell::kLstm && c.node.attr_int("input_forget") != 0;
  return p;
}

// One direction's recurrence over every batch row, writing Y, Y_h and Y_c (any may be null).
class Direction {
 public:
  Direction(const Problem& p, int64_t d, const KernelContext& c, const PackedB* w, const float* rt)
      : p_(p), d_(d), c_(c), w_(w), rt_(rt) {}

  void run(float* y, float* yh, float* yc);

 private:
  void project_inputs();
  void step(int64_t s, float* y, int64_t j0, int64_t j1, int phase);
  int64_t time_of(int64_t s, int64_t b) const { return reverse_ ? p_.lens[b] - 1 - s : s; }

  const Problem& p_;
  int64_t d_;
  const KernelContext& c_;
  const PackedB* w_;  // null: W unpacked, read from the input
  const float* rt_;
  bool reverse_ = false;
  // In the thread's scratch (one block, carved by take_workspace): no allocation or page fault
  // per call once it has grown.
  float *gx_ = nullptr, *gh_ = nullptr, *h_ = nullptr, *h_next_ = nullptr, *cs_ = nullptr,
        *rh_ = nullptr, *xbias_ = nullptr, *hbias_ = nullptr;
  void take_workspace(bool two_phase);
};

// gx = X W^T + Wb + Rb for every step at once; the GRU's Rb_h stays with h R^T when
// linear_before_reset (it is inside the reset gate's product).
void Direction::project_inputs() {
  const int64_t GH = p_.G * p_.H, H = p_.H;
  std::fill_n(xbias_, GH, 0.0f);
  std::fill_n(hbias_, GH, 0.0f);
  if (c_.has_input(3)) {
    const float* wb = c_.input(3).data<float>() + d_ * 2 * GH;
    const float* rb = wb + GH;
    for (int64_t g = 0; g < GH; ++g) {
      const bool apart = p_.linear_before_reset && g >= 2 * H;
      xbias_[g] = apart ? wb[g] : wb[g] + rb[g];
      hbias_[g] = apart ? rb[g] : 0.0f;
    }
  }
  GemmArgs g;
  g.m = p_.S * p_.B, g.n = GH, g.k = p_.I;
  g.a = c_.input(0).data<float>(), g.lda = p_.I;
  g.c = gx_, g.ldc = GH;
  g.epilogue.bias_kind = Epilogue::Bias::kPerCol;
  g.epilogue.bias = xbias_;
  if (g.m == 0 || g.n == 0) return;
  if (w_) {
    sgemm_packed(g, *w_);
  } else {
    g.b = c_.input(1).data<float>() + d_ * GH * p_.I, g.ldb = p_.I, g.trans_b = true;
    sgemm(g);
  }
}

// Step s for hidden units [j0, j1) of every batch row. Phase 0 is the whole step but for GRU
// without linear_before_reset, which takes phase 1 (z and r products, r . h) and phase 2 (the
// product with the reset state, the gates) with every unit's phase 1 done between.
void Direction::step(int64_t s, float* y, int64_t j0, int64_t j1, int phase) {
  const int64_t H = p_.H, GH = p_.G * H, B = p_.B, n = j1 - j0;
  const int64_t gates = phase == 1 ? 2 : phase == 2 ? 0 : p_.G;
  // Gate g's panels from unit j0 (a whole panel: j0 is a multiple of kUnits).
  auto panels = [&](int64_t g) {
    return rt_ + (g * panels_per_gate(H) + j0 / kRecurrentPanel) * H * kRecurrentPanel;
  };
  for (int64_t g = 0; g < gates; ++g)
    PTO_ISA_DISPATCH(recurrent_matvec, h_, H, B, H, panels(g), hbias_ + g * H + j0,
                     gh_ + g * H + j0, GH, n);
  if (phase == 2)
    PTO_ISA_DISPATCH(recurrent_matvec, rh_, H, B, H, panels(2), nullptr, gh_ + 2 * H + j0, GH, n);
  for (int64_t b = 0; b < B; ++b) {
    float* hn = h_next_ + b * H;
    if (s >= p_.lens[b]) {  // past this row's sequence: the state stays
      if (phase != 1) std::copy(h_ + b * H + j0, h_ + b * H + j1, hn + j0);
      continue;
    }
    const int64_t t = time_of(s, b);
    CellRow r{.gx = gx_ + p_.x_row(t, b) * GH,
              .gh = gh_ + b * GH,
              .h_prev = h_ + b * H,
              .h = hn,
              .c = cs_ ? cs_ + b * H : nullptr,
              .peep = c_.has_input(7) ? c_.input(7).data<float>() + d_ * 3 * H : nullptr,
              .hidden = H,
              .clip = p_.clip,
              .clip_value = p_.clip_value,
              .input_forget = p_.input_forget,
              .reset_applied = phase == 2};
    if (phase == 1) {
      PTO_ISA_DISPATCH(gru_reset, r, rh_ + b * H, j0, j1);
      continue;
    }
    if (p_.cell == Cell::kRnn)
      PTO_ISA_DISPATCH(rnn_cell, r, j0, j1);
    else if (p_.cell == Cell::kGru)
      PTO_ISA_DISPATCH(gru_cell, r, j0, j1);
    else
      PTO_ISA_DISPATCH(lstm_cell, r, j0, j1);
    if (y) std::copy(hn + j0, hn + j1, y + p_.y_at(t, d_, b) + j0);
  }
}

// gx, gh, the two states, the cell state (LSTM), r . h (GRU in two phases) and the biases, each
// from a 64-byte boundary; states zeroed (initial_h and initial_c are copied in after).
void Direction::take_workspace(bool two_phase) {
  const int64_t H = p_.H, B = p_.B, GH = p_.G * H;
  const auto round = [](int64_t n) { return (n + 15) / 16 * 16; };
  const int64_t state = round(B * H);
  const int64_t sizes[] = {
      round(p_.S * B * GH),  round(B * GH), state,    state, p_.cell == Cell::kLstm ? state : 0,
      two_phase ? state : 0, round(GH),     round(GH)};
  float** parts[] = {&gx_, &gh_, &h_, &h_next_, &cs_, &rh_, &xbias_, &hbias_};
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  float* at = scratch_as<float>(static_cast<size_t>(total));
  for (size_t i = 0; i < std::size(parts); ++i) {
    *parts[i] = sizes[i] ? at : nullptr;
    at += sizes[i];
  }
  for (float* z : {h_, h_next_, cs_, rh_})
    if (z) std::fill_n(z, B * H, 0.0f);
}

void Direction::run(float* y, float* yh, float* yc) {
  const int64_t H = p_.H, B = p_.B, GH = p_.G * H;
  reverse_ = p_.reverse_only || d_ == 1;
  const bool two_phase = p_.cell == Cell::kGru && !p_.linear_before_reset;
  take_workspace(two_phase);
  project_inputs();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t at = p_.state_at(d_, b);
    if (c_.has_input(5)) std::memcpy(h_ + b * H, c_.input(5).data<float>() + at, H * sizeof(float));
    if (cs_ && c_.has_input(6))
      std::memcpy(cs_ + b * H, c_.input(6).data<float>() + at, H * sizeof(float));
  }
  // Hidden units in blocks of whole vectors, one task each when a step has enough work to
  // pay for a parallel_for (~2 us).
  constexpr int64_t kUnits = 2 * kRecurrentPanel, kMinFlops = 1 << 17;
  const int64_t blocks = (H + kUnits - 1) / kUnits;
  const bool split = blocks > 1 && B * H * GH >= kMinFlops;
  const int64_t steps = B ? *std::max_element(p_.lens.begin(), p_.lens.end()) : 0;
  for (int64_t s = 0; s < steps; ++s) {
    for (int phase = two_phase ? 1 : 0; phase <= (two_phase ? 2 : 0); ++phase) {
      auto block = [&](int64_t b0, int64_t b1) {
        step(s, y, b0 * kUnits, std::min(H, b1 * kUnits), phase);
      };
      if (split)
        parallel_for(0, blocks, 1, block);
      else
        block(0, blocks);
    }
    std::swap(h_, h_next_);
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t at = p_.state_at(d_, b);
    if (yh) std::copy(h_ + b * H, h_ + (b + 1) * H, yh + at);
    if (yc) std::copy(cs_ + b * H, cs_ + (b + 1) * H, yc + at);
  }
}

std::vector<Tensor> recurrent(const KernelContext& c, Cell cell) {
  const std::optional<Problem> p = read_problem(c, cell);
  if (!p) return run_reference(c);
  const Weights* prepared = c.state && c.state->has_value() ? &c.prepared<Weights>() : nullptr;
  Weights local;
  if (!prepared)  // R transposed for this run; W read in place
    for (int64_t d = 0; d < p->D; ++d) local.rt.push_back(pack_r(c.input(2), d));
  const Weights& wts = prepared ? *prepared : local;
  const Dims yshape = p->batch_first ? Dims{p->B, p->S, p->D, p->H} : Dims{p->S, p->D, p->B, p->H};
  const Dims sshape = p->batch_first ? Dims{p->B, p->D, p->H} : Dims{p->D, p->B, p->H};
  std::vector<Tensor> out;
  for (size_t o = 0; o < c.num_outputs; ++o)
    out.push_back(Tensor::empty(DType::kF32, o == 0 ? yshape : sshape));
  float* y = !out.empty() ? out[0].data<float>() : nullptr;
  float* yh = out.size() > 1 ? out[1].data<float>() : nullptr;
  float* yc = out.size() > 2 && cell == Cell::kLstm ? out[2].data<float>() : nullptr;
  // Rows shorter than the sequence leave zeros in Y; a row of length 0 keeps its initial state.
  if (y && std::any_of(p->lens.begin(), p->lens.end(), [&](int64_t l) { return l < p->S; }))
    std::fill(y, y + out[0].numel(), 0.0f);
  auto direction = [&](int64_t d) {
    Direction dir(*p, d, c, prepared ? &prepared->w[d] : nullptr, wts.rt[d].data());
    dir.run(y, yh, yc);
  };
  if (p->D == 1)
    direction(0);  // keeps the pool for the steps
  else
    parallel_tasks(p->D, direction);
  return out;
}

}  // namespace

void register_recurrent_kernels(KernelRegistry& r) {
  for (Cell cell : {Cell::kRnn, Cell::kGru, Cell::kLstm}) {
    Kernel k;
    k.accepts = [cell](const NodeInfo& n) { return accepts(n, cell); };
    k.prepare = prepare;
    k.packed_inputs = [](const std::any& state) {
      return state.has_value() ? std::vector<size_t>{1, 2} : std::vector<size_t>{};
    };
    k.packed_bytes = [](const std::any& state) -> size_t {
      if (!state.has_value()) return 0;
      const auto& p = std::any_cast<const Weights&>(state);
      size_t bytes = 0;
      for (size_t d = 0; d < p.w.size(); ++d)
        bytes += p.w[d].bytes() + p.rt[d].size() * sizeof(float);
      return bytes;
    };
    k.unpack = unpack_weights;
    k.run = [cell](const KernelContext& c) { return recurrent(c, cell); };
    k.reference_at_run_time = true;  // shapes the reference rejects, and hidden size 0
    r.add(cell == Cell::kRnn ? "RNN" : cell == Cell::kGru ? "GRU" : "LSTM", std::move(k));
  }
}

}  // namespace pto::cpu
