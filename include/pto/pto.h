// PyPTO's public C++ API in one include.
#pragma once

#include "pto/dtype.h"
#include "pto/error.h"
#include "pto/executable.h"
#include "pto/graph.h"
#include "pto/onnx.h"
#include "pto/op_registry.h"
#include "pto/reference.h"
#include "pto/shape.h"
#include "pto/tensor.h"
