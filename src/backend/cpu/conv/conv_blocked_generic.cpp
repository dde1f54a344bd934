#include "backend/cpu/conv/conv_blocked_impl.h"
