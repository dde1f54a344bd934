#include "infer_util.h"

namespace pto {

void register_indexing_ops(OpRegistry& r) {
  (void)r;
}

}  // namespace pto
