#include "backend/cpu/attention_impl.h"
