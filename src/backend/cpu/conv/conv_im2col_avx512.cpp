#include "backend/cpu/conv/conv_im2col_impl.h"
