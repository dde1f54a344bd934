#include "backend/cpu/reduce_impl.h"
