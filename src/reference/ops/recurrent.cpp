// Reference RNN, GRU and LSTM: one batch row and one time step at a time, in double precision,
// exactly as the ONNX equations read (gate orders: GRU z r h, LSTM i o f c; peepholes i o f).
#include <algorithm>
#include <cctype>
#include <cmath>

#include "kernel_util.h"

namespace pto::reference {
namespace {

enum class Cell { kRnn, kGru, kLstm };

struct Activation {
  std::string name;  // lower case
  double alpha = 0, beta = 0;

  double operator()(double x) const {
    if (name == "sigmoid") return 1.0 / (1.0 + std::exp(-x));
    if (name == "tanh") return std::tanh(x);
    if (name == "relu") return std::max(0.0, x);
    if (name == "affine") return alpha * x + beta;
    if (name == "leakyrelu") return x >= 0 ? x : alpha * x;
    if (name == "thresholdedrelu") return x > alpha ? x : 0.0;
    if (name == "scaledtanh") return alpha * std::tanh(beta * x);
    if (name == "hardsigmoid") return std::clamp(alpha * x + beta, 0.0, 1.0);
    if (name == "elu") return x >= 0 ? x : alpha * (std::exp(x) - 1);
    if (name == "softsign") return x / (1 + std::fabs(x));
    return std::log1p(std::exp(x));  // softplus (names are checked when read)
  }
};

// The activations for all directions: `per_dir` functions each, from the attributes or defaults.
std::vector<Activation> read_activations(const KernelContext& c, std::vector<std::string> dflt,
                                         int64_t dirs) {
  const auto& a = c.attrs();
  const size_t per_dir = dflt.size();
  std::vector<std::string> names =
      a.has("activations") ? a.get_strings("activations") : std::vector<std::string>();
  if (names.empty())
    for (int64_t d = 0; d < dirs; ++d) names.insert(names.end(), dflt.begin(), dflt.end());
  if (names.size() != per_dir * static_cast<size_t>(dirs))
    throw ValueError(
        cat(c.where(), ": expected ", per_dir * dirs, " activations, got ", names.size()));
  std::vector<double> alphas = a.get_floats("activation_alpha", {});
  std::vector<double> betas = a.get_floats("activation_beta", {});
  size_t ia = 0, ib = 0;
  std::vector<Activation> out;
  for (std::string n : names) {
    std::transform(n.begin(), n.end(), n.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    Activation act{n};
    auto alpha = [&](double d) { return ia < alphas.size() ? alphas[ia++] : d; };
    auto beta = [&](double d) { return ib < betas.size() ? betas[ib++] : d; };
    if (n == "affine" || n == "scaledtanh") {
      act.alpha = alpha(1.0);
      act.beta = beta(n == "affine" ? 0.0 : 1.0);
    } else if (n == "hardsigmoid") {
      act.alpha = alpha(0.2);
      act.beta = beta(0.5);
    } else if (n == "leakyrelu") {
      act.alpha = alpha(0.01);
    } else if (n == "thresholdedrelu" || n == "elu") {
      act.alpha = alpha(1.0);
    } else if (n != "sigmoid" && n != "tanh" && n != "relu" && n != "softsign" && n != "softplus") {
      throw UnsupportedError(cat(c.where(), ": activation '", n, "' is not supported"));
    }
    out.push_back(act);
  }
  return out;
}

std::vector<Tensor> recurrent(const KernelContext& c, Cell cell) {
  const std::string w = c.where();
  const auto& a = c.attrs();
  const Tensor &X = c.input(0), &W = c.input(1), &R = c.input(2);
  if (!is_floating(X.dtype())) throw_unsupported_dtype(X.dtype(), w);
  const int64_t G = cell == Cell::kLstm ? 4 : cell == Cell::kGru ? 3 : 1;
  const std::string direction = c.node.attr_string("direction");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    throw ValueError(cat(w, ": unknown direction '", direction, "'"));
  const int64_t D = direction == "bidirectional" ? 2 : 1;
  const bool batch_first = c.node.attr_int("layout") == 1;
  if (X.rank() != 3 || W.rank() != 3 || R.rank() != 3)
    throw ValueError(
        cat(w, ": X, W and R must be 3-D, got ", X.str(), ", ", W.str(), ", ", R.str()));
  const int64_t S = X.dim(batch_first ? 1 : 0), B = X.dim(batch_first ? 0 : 1), I = X.dim(2);
  const int64_t H = a.get_int("hidden_size", R.dim(2));
  if (W.shape() != Dims{D, G * H, I} || R.shape() != Dims{D, G * H, H})
    throw ValueError(cat(w, ": W ", W.str(), " and R ", R.str(), " should be [", D, ", ", G * H,
                         ", ", I, "] and [", D, ", ", G * H, ", ", H, "]"));
  auto optional = [&](size_t i, const Dims& shape, const char* what) {
    if (!c.has_input(i)) return std::vector<double>();
    if (c.input(i).shape() != shape)
      throw ValueError(cat(w, ": ", what, " ", c.input(i).str(), " should be ", dims_str(shape)));
    return to_doubles(c.input(i), w);
  };
  const Dims state_shape = batch_first ? Dims{B, D, H} : Dims{D, B, H};
  std::vector<double> bias = optional(3, {D, 2 * G * H}, "B");
  std::vector<double> h0 = optional(5, state_shape, "initial_h");
  std::vector<double> c0 = cell == Cell::kLstm ? optional(6, state_shape, "initial_c") : bias;
  std::vector<double> peep = cell == Cell::kLstm ? optional(7, {D, 3 * H}, "P") : bias;
  if (cell != Cell::kLstm) c0.clear(), peep.clear();
  std::vector<int64_t> lens(B, S);
  if (c.has_input(4)) {
    lens = to_int64s(c.input(4), w);
    if (static_cast<int64_t>(lens.size()) != B)
      throw ValueError(cat(w, ": sequence_lens must have ", B, " entries"));
    for (int64_t l : lens)
      if (l < 0 || l > S)
        throw ValueError(cat(w, ": sequence length ", l, " is outside [0, ", S, "]"));
  }
  const std::vector<std::string> dflt =
      cell == Cell::kLstm  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
      : cell == Cell::kGru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                           : std::vector<std::string>{"Tanh"};
  const std::vector<Activation> acts = read_activations(c, dflt, D);
  const bool has_clip = a.has("clip");
  const double clip = a.get_float("clip", 0.0);
  const bool linear_before_reset =
      cell == Cell::kGru && c.node.attr_int("linear_before_reset") != 0;
  const bool input_forget = cell == Cell::kLstm && c.node.attr_int("input_forget") != 0;

  const std::vector<double> x = to_doubles(X, w), wt = to_doubles(W, w), rt = to_doubles(R, w);
  auto xat = [&](int64_t t, int64_t b, int64_t i) {
    return x[(batch_first ? b * S + t : t * B + b) * I + i];
  };
  auto state_index = [&](int64_t d, int64_t b) {
    return (batch_first ? b * D + d : d * B + b) * H;
  };
  auto y_index = [&](int64_t t, int64_t d, int64_t b) {
    return (batch_first ? (b * S + t) * D + d : (t * D + d) * B + b) * H;
  };
  std::vector<double> y(static_cast<size_t>(S * D * B * H), 0.0);
  std::vector<double> yh(static_cast<size_t>(D * B * H)), yc(yh.size());
  std::vector<double> gx(G * H), gh(G * H), h(H), cs(H), hn(H);
  for (int64_t d = 0; d < D; ++d) {
    const bool reverse = direction == "reverse" || d == 1;
    const Activation* act = &acts[d * dflt.size()];
    auto f = [&](int k, double v) { return act[k](has_clip ? std::clamp(v, -clip, clip) : v); };
    const double* Wd = wt.data() + d * G * H * I;
    const double* Rd = rt.data() + d * G * H * H;
    const double* Wb = bias.empty() ? nullptr : bias.data() + d * 2 * G * H;
    const double* Rb = Wb ? Wb + G * H : nullptr;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < H; ++j) {
        h[j] = h0.empty() ? 0.0 : h0[state_index(d, b) + j];
        cs[j] = c0.empty() ? 0.0 : c0[state_index(d, b) + j];
      }
      for (int64_t step = 0; step < lens[b]; ++step) {
        const int64_t t = reverse ? lens[b] - 1 - step : step;
        // gx = W x + Wb and gh = R h + Rb, per gate row.
        for (int64_t g = 0; g < G * H; ++g) {
          double sx = Wb ? Wb[g] : 0.0, sh = Rb ? Rb[g] : 0.0;
          for (int64_t i = 0; i < I; ++i) sx += Wd[g * I + i] * xat(t, b, i);
          for (int64_t k = 0; k < H; ++k) sh += Rd[g * H + k] * h[k];
          gx[g] = sx;
          gh[g] = sh;
        }
        if (cell == Cell::kRnn) {
          for (int64_t j = 0; j < H; ++j) hn[j] = f(0, gx[j] + gh[j]);
        } else if (cell == Cell::kGru) {
          for (int64_t j = 0; j < H; ++j) {
            const double z = f(0, gx[j] + gh[j]);
            const double r = f(0, gx[H + j] + gh[H + j]);
            double pre;
            if (linear_before_reset) {
              pre = gx[2 * H + j] + r * gh[2 * H + j];
            } else {  // (r * h) R_h + Rb_h, recomputed with the reset state
              pre = gx[2 * H + j] + (Rb ? Rb[2 * H + j] : 0.0);
              for (int64_t k = 0; k < H; ++k) {
                const double rk = f(0, gx[H + k] + gh[H + k]);
                pre += Rd[(2 * H + j) * H + k] * rk * h[k];
              }
            }
            hn[j] = (1 - z) * f(1, pre) + z * h[j];
          }
        } else {
          const double* P = peep.empty() ? nullptr : peep.data() + d * 3 * H;
          for (int64_t j = 0; j < H; ++j) {
            const double i_g = f(0, gx[j] + gh[j] + (P ? P[j] * cs[j] : 0.0));
            double f_g = f(0, gx[2 * H + j] + gh[2 * H + j] + (P ? P[2 * H + j] * cs[j] : 0.0));
            if (input_forget) f_g = 1 - i_g;
            const double c_g = f(1, gx[3 * H + j] + gh[3 * H + j]);
            const double c_new = f_g * cs[j] + i_g * c_g;
            const double o_g = f(0, gx[H + j] + gh[H + j] + (P ? P[H + j] * c_new : 0.0));
            hn[j] = o_g * act[2](c_new);
            cs[j] = c_new;
          }
        }
        h = hn;
        std::copy(h.begin(), h.end(), y.begin() + y_index(t, d, b));
      }
      std::copy(h.begin(), h.end(), yh.begin() + state_index(d, b));
      std::copy(cs.begin(), cs.end(), yc.begin() + state_index(d, b));
    }
  }
  const Dims yshape = batch_first ? Dims{B, S, D, H} : Dims{S, D, B, H};
  std::vector<Tensor> out;
  for (size_t o = 0; o < c.num_outputs; ++o)
    out.push_back(o == 0   ? from_doubles(X.dtype(), yshape, y, w)
                  : o == 1 ? from_doubles(X.dtype(), state_shape, yh, w)
                           : from_doubles(X.dtype(), state_shape, yc, w));
  return out;
}

}  // namespace

void register_recurrent_kernels(KernelRegistry& r) {
  r.add("RNN", [](const KernelContext& c) { return recurrent(c, Cell::kRnn); });
  r.add("GRU", [](const KernelContext& c) { return recurrent(c, Cell::kGru); });
  r.add("LSTM", [](const KernelContext& c) { return recurrent(c, Cell::kLstm); });
}

}  // namespace pto::reference
