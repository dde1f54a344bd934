#include "backend/cpu/gemm/gemm_impl.h"
