#include "fma_impl.h"  // compiled for avx512 (bench/CMakeLists.txt)
