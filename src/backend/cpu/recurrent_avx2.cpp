#include "backend/cpu/recurrent_impl.h"
