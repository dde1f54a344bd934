#include "backend/cpu/tile_exec_impl.h"
