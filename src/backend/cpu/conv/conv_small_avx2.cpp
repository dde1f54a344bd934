#include "backend/cpu/conv/conv_small_impl.h"
