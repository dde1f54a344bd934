// Reference RNN, GRU and LSTM: one batch row and one time step at a time, in double precision,
// exactly as the ONNX equations read (gate orders: GRU z r h, LSTM i o f c; peepholes i o f);
// LinearAttention's recurrence one token at a time and CausalConvWithState one output at a time,
// in double precision too.
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

// LinearAttention: per batch row and KV head, the state S [dk, dv] (past_state, or zeros) for
// each token t is decayed (gated rules: S *= exp(decay), per head or per key dimension), updated
// (S += k (x) v, or with the delta rule S += k (x) beta (v - S^T k)), and read by each query head
// of the KV head's group: o = scale q^T S.
std::vector<Tensor> linear_attention(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &Q = c.input(0), &K = c.input(1), &V = c.input(2);
  const auto& a = c.attrs();
  const int64_t hq = a.get_int("q_num_heads"), hkv = a.get_int("kv_num_heads");
  const std::string rule = a.get_string("update_rule", "gated_delta");
  if (rule != "linear" && rule != "gated" && rule != "delta" && rule != "gated_delta")
    throw ValueError(
        cat(w, ": update_rule '", rule, "' is not one of linear, gated, delta, gated_delta"));
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0)
    throw ValueError(
        cat(w, ": q_num_heads ", hq, " must be a positive multiple of kv_num_heads ", hkv));
  const bool gated = rule == "gated" || rule == "gated_delta";
  const bool delta = rule == "delta" || rule == "gated_delta";
  if (gated != c.has_input(4))
    throw ValueError(
        cat(w, ": update_rule '", rule, "' ", gated ? "needs" : "takes no", " decay input"));
  if (delta != c.has_input(5))
    throw ValueError(
        cat(w, ": update_rule '", rule, "' ", delta ? "needs" : "takes no", " beta input"));
  if (Q.rank() != 3 || K.rank() != 3 || V.rank() != 3)
    throw ValueError(cat(w, ": query, key and value must be 3-D [batch, tokens, heads * size]"));
  const int64_t B = Q.dim(0), T = Q.dim(1);
  if (Q.dim(2) % hq != 0 || V.dim(2) % hkv != 0)
    throw ValueError(cat(w, ": the last dimensions of query ", Q.str(), " and value ", V.str(),
                         " must divide by q_num_heads and kv_num_heads"));
  const int64_t dk = Q.dim(2) / hq, dv = V.dim(2) / hkv, group = hq / hkv;
  if (K.shape() != Dims{B, T, hkv * dk} || V.dim(0) != B || V.dim(1) != T)
    throw ValueError(cat(w, ": key ", K.str(), " and value ", V.str(), " must be [", B, ", ", T,
                         ", ", hkv * dk, "] and [", B, ", ", T, ", ", hkv, " * dv]"));
  std::vector<double> q = to_doubles(Q, w), k = to_doubles(K, w), v = to_doubles(V, w);
  std::vector<double> g, beta, S(static_cast<size_t>(B * hkv * dk * dv), 0.0);
  int64_t g_width = 0, beta_width = 0;
  if (gated) {
    const Tensor& G = c.input(4);
    g_width = G.rank() == 3 ? G.dim(2) : 0;
    if (G.rank() != 3 || G.dim(0) != B || G.dim(1) != T || (g_width != hkv && g_width != hkv * dk))
      throw ValueError(cat(w, ": decay ", G.str(), " must be [", B, ", ", T, ", ", hkv, "] or [", B,
                           ", ", T, ", ", hkv * dk, "]"));
    g = to_doubles(G, w);
  }
  if (delta) {
    const Tensor& Bt = c.input(5);
    beta_width = Bt.rank() == 3 ? Bt.dim(2) : 0;
    if (Bt.rank() != 3 || Bt.dim(0) != B || Bt.dim(1) != T ||
        (beta_width != hkv && beta_width != 1))
      throw ValueError(cat(w, ": beta ", Bt.str(), " must be [", B, ", ", T, ", ", hkv, "] or [", B,
                           ", ", T, ", 1]"));
    beta = to_doubles(Bt, w);
  }
  if (c.has_input(3)) {
    const Tensor& P = c.input(3);
    if (P.shape() != Dims{B, hkv, dk, dv})
      throw ValueError(
          cat(w, ": past_state ", P.str(), " must be [", B, ", ", hkv, ", ", dk, ", ", dv, "]"));
    S = to_doubles(P, w);
  }
  const double scale_attr = a.get_float("scale", 0.0);
  const double scale = scale_attr == 0.0 ? 1.0 / std::sqrt(static_cast<double>(dk)) : scale_attr;
  std::vector<double> out(static_cast<size_t>(B * T * hq * dv)), u(dv);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < hkv; ++h) {
        double* s = &S[((b * hkv + h) * dk) * dv];
        const double* kt = &k[((b * T + t) * hkv + h) * dk];
        const double* vt = &v[((b * T + t) * hkv + h) * dv];
        if (gated)
          for (int64_t d = 0; d < dk; ++d) {
            const double e = std::exp(g[(b * T + t) * g_width + (g_width == hkv ? h : h * dk + d)]);
            for (int64_t m = 0; m < dv; ++m) s[d * dv + m] *= e;
          }
        for (int64_t m = 0; m < dv; ++m) u[m] = vt[m];
        if (delta) {
          const double bt = beta[(b * T + t) * beta_width + (beta_width == 1 ? 0 : h)];
          for (int64_t m = 0; m < dv; ++m) {
            double r = 0;
            for (int64_t d = 0; d < dk; ++d) r += s[d * dv + m] * kt[d];
            u[m] = bt * (vt[m] - r);
          }
        }
        for (int64_t d = 0; d < dk; ++d)
          for (int64_t m = 0; m < dv; ++m) s[d * dv + m] += kt[d] * u[m];
        for (int64_t j = h * group; j < (h + 1) * group; ++j) {
          const double* qt = &q[((b * T + t) * hq + j) * dk];
          for (int64_t m = 0; m < dv; ++m) {
            double o = 0;
            for (int64_t d = 0; d < dk; ++d) o += qt[d] * s[d * dv + m];
            out[((b * T + t) * hq + j) * dv + m] = scale * o;
          }
        }
      }
  std::vector<Tensor> result = {from_doubles(Q.dtype(), {B, T, hq * dv}, out, w)};
  if (c.num_outputs > 1)
    result.push_back(
        from_doubles(c.has_input(3) ? c.input(3).dtype() : Q.dtype(), {B, hkv, dk, dv}, S, w));
  return result;
}

// CausalConvWithState: each channel's row [past_state (or k - 1 zeros), input] convolved with
// its k taps, valid positions only, plus bias, then x sigmoid(x) for silu/swish; the row's last
// k - 1 values are the present state.
std::vector<Tensor> causal_conv_with_state(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &X = c.input(0), &W = c.input(1);
  const std::string act = c.attrs().get_string("activation", "none");
  if (act != "none" && act != "silu" && act != "swish")
    throw ValueError(cat(w, ": activation '", act, "' is not one of none, silu, swish"));
  if (X.rank() != 3 || W.rank() != 3 || W.dim(0) != X.dim(1) || W.dim(1) != 1 || W.dim(2) < 1)
    throw ValueError(cat(w, ": input ", X.str(), " must be [batch, channels, length] and weight ",
                         W.str(), " [channels, 1, k]"));
  const int64_t B = X.dim(0), C = X.dim(1), L = X.dim(2), k = W.dim(2), P = k - 1;
  std::vector<double> x = to_doubles(X, w), wt = to_doubles(W, w), bias, past;
  if (c.has_input(2)) {
    if (c.input(2).shape() != Dims{C})
      throw ValueError(cat(w, ": bias ", c.input(2).str(), " must be [", C, "]"));
    bias = to_doubles(c.input(2), w);
  }
  if (c.has_input(3)) {
    if (c.input(3).shape() != Dims{B, C, P})
      throw ValueError(
          cat(w, ": past_state ", c.input(3).str(), " must be [", B, ", ", C, ", ", P, "]"));
    past = to_doubles(c.input(3), w);
  }
  std::vector<double> y(x.size()), state(static_cast<size_t>(B * C * P)), row(L + P);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t ch = 0; ch < C; ++ch) {
      const int64_t r = b * C + ch;
      for (int64_t i = 0; i < P; ++i) row[i] = past.empty() ? 0.0 : past[r * P + i];
      for (int64_t i = 0; i < L; ++i) row[P + i] = x[r * L + i];
      for (int64_t t = 0; t < L; ++t) {
        double o = bias.empty() ? 0.0 : bias[ch];
        for (int64_t j = 0; j < k; ++j) o += wt[ch * k + j] * row[t + j];
        y[r * L + t] = act == "none" ? o : o / (1.0 + std::exp(-o));
      }
      for (int64_t i = 0; i < P; ++i) state[r * P + i] = row[L + i];
    }
  std::vector<Tensor> result = {from_doubles(X.dtype(), X.shape(), y, w)};
  if (c.num_outputs > 1) result.push_back(from_doubles(X.dtype(), {B, C, P}, state, w));
  return result;
}

}  // namespace

void register_recurrent_kernels(KernelRegistry& r) {
  r.add("LinearAttention", linear_attention);
  r.add("CausalConvWithState", causal_conv_with_state);
  r.add("RNN", [](const KernelContext& c) { return recurrent(c, Cell::kRnn); });
  r.add("GRU", [](const KernelContext& c) { return recurrent(c, Cell::kGru); });
  r.add("LSTM", [](const KernelContext& c) { return recurrent(c, Cell::kLstm); });
}

}  // namespace pto::reference
