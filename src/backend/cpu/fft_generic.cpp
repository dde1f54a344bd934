#include "backend/cpu/fft_impl.h"
