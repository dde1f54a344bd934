#include "backend/cpu/conv/conv_depthwise_impl.h"
