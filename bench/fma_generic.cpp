#include "fma_impl.h"  // compiled for generic (bench/CMakeLists.txt)
