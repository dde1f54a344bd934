#include "backend/cpu/grid_sample_impl.h"
