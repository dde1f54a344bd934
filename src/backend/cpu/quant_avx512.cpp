#include "backend/cpu/quant_impl.h"
