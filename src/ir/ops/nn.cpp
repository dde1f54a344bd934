#include "infer_util.h"

namespace pto {

void register_nn_ops(OpRegistry& r) {
  (void)r;
}

}  // namespace pto
