#include "backend/cpu/nbits_impl.h"
