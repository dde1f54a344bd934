#include "lanes_impl.h"
