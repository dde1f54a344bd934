#include "backend/cpu/epilogue_impl.h"
