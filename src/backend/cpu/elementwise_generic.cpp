#include "backend/cpu/elementwise_impl.h"
