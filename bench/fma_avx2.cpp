#include "fma_impl.h"  // compiled for avx2 (bench/CMakeLists.txt)
