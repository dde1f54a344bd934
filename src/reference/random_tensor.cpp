// Random tensors for the tools that run a model on made-up inputs (pto/random_tensor.h).
#include "pto/random_tensor.h"

#include <type_traits>

namespace pto {

Tensor random_tensor(DType dtype, const Dims& shape, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(dtype, shape);
  dispatch(dtype, kAllTypes, "random input", [&]<class T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint64_t r = rng();
      if constexpr (std::is_same_v<T, bool>) {
        p[i] = (r >> 63) != 0;
      } else if constexpr (std::is_integral_v<T>) {
        p[i] = static_cast<T>(r % 10);
      } else {
        double u = static_cast<double>(r >> 11) * 0x1.0p-53 * 2.0 - 1.0;  // [-1, 1)
        if constexpr (std::is_same_v<T, double>)
          p[i] = u;
        else
          p[i] = static_cast<T>(static_cast<float>(u));
      }
    }
  });
  return t;
}

}  // namespace pto
