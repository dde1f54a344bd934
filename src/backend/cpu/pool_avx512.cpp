#include "backend/cpu/pool_impl.h"
