#include "backend/cpu/conv/winograd_impl.h"
