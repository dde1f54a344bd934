#include "backend/cpu/conv/conv_transpose_impl.h"
