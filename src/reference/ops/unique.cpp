// Reference kernel for Unique: the distinct elements of the flattened input (or distinct slices
// along `axis`), with the index of each one's first occurrence, the inverse map from every input
// element (slice) to its unique entry, and the counts. sorted=1 orders the uniques ascending
// (slices lexicographically); sorted=0 keeps the order of first occurrence. NaNs compare equal
// to each other and above every number, so they collapse into one entry at the end (numpy's
// equal_nan).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "index_math.h"

namespace pto::reference {
namespace {

std::vector<Tensor> unique(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  const bool has_axis = c.attrs().has("axis");
  const int64_t axis = has_axis ? normalize_axis(c.attrs().get_int("axis"), x.rank(), w) : 0;
  const Dims& s = x.shape();
  // Slices: n of them, each `outer * inner` elements at (o * n + i) * inner + e.
  const int64_t n = has_axis ? s[axis] : x.numel();
  const int64_t outer = has_axis ? dims_product(s, 0, axis) : 1;
  const int64_t inner = has_axis ? dims_product(s, axis + 1, s.size()) : 1;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> group_start;  // positions in `order` where a new unique value begins
  dispatch(x.dtype(), kAllTypes, w, [&]<class T>() {
    using C = compute_t<T>;
    const T* p = x.data<T>();
    auto cmp3 = [](C a, C b) {  // -1, 0, 1 with NaN == NaN > everything
      if constexpr (std::is_floating_point_v<C>) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) - std::isnan(b);
      }
      return a < b ? -1 : (b < a ? 1 : 0);
    };
    auto compare = [&](int64_t i, int64_t j) {  // lexicographic over the slices' elements
      if (inner == 0) return 0;                 // empty slices (outer may still be huge)
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t e = 0; e < inner; ++e)
          if (int r = cmp3(static_cast<C>(p[(o * n + i) * inner + e]),
                           static_cast<C>(p[(o * n + j) * inner + e])))
            return r;
      return 0;
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t i, int64_t j) { return compare(i, j) < 0; });
    for (int64_t k = 0; k < n; ++k)
      if (k == 0 || compare(order[k - 1], order[k]) != 0) group_start.push_back(k);
  });
  const int64_t u = static_cast<int64_t>(group_start.size());
  group_start.push_back(n);
  // Each group's first occurrence is its first member: the sort is stable.
  std::vector<int64_t> groups(u);
  std::iota(groups.begin(), groups.end(), 0);
  if (c.node.attr_int("sorted") == 0)
    std::sort(groups.begin(), groups.end(),
              [&](int64_t a, int64_t b) { return order[group_start[a]] < order[group_start[b]]; });
  Dims y_shape = has_axis ? s : Dims{};
  if (has_axis)
    y_shape[axis] = u;
  else
    y_shape = {u};
  Tensor y = Tensor::empty(x.dtype(), y_shape);
  Tensor first = Tensor::empty(DType::kI64, {u});
  Tensor inverse = Tensor::empty(DType::kI64, {n});
  Tensor counts = Tensor::empty(DType::kI64, {u});
  for (int64_t g = 0; g < u; ++g) {
    const int64_t grp = groups[g], src = order[group_start[grp]];
    first.data<int64_t>()[g] = src;
    counts.data<int64_t>()[g] = group_start[grp + 1] - group_start[grp];
    for (int64_t k = group_start[grp]; k < group_start[grp + 1]; ++k)
      inverse.data<int64_t>()[order[k]] = g;
    for (int64_t o = 0; o < outer && inner > 0; ++o)
      copy_elems(y, (o * u + g) * inner, x, (o * n + src) * inner, inner);
  }
  std::vector<Tensor> out = {y, first, inverse, counts};
  out.resize(std::min<size_t>(c.num_outputs, out.size()));
  return out;
}

}  // namespace

void register_unique_kernels(KernelRegistry& r) {
  r.add("Unique", unique);
}

}  // namespace pto::reference
