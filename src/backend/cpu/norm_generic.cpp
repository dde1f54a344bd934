#include "backend/cpu/norm_impl.h"
