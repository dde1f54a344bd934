#include "backend/cpu/isa/fma_impl.h"
