#include "infer_util.h"

namespace pto {

void register_image_ops(OpRegistry& r) { (void)r; }

}  // namespace pto
