#include "transpose_impl.h"
