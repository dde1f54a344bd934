#include "backend/cpu/gemm/igemm_impl.h"
