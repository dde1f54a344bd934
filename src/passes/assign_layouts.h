// AssignLayouts with an explicit channel block, for tests that need a block other than the
// machine's (the registered pass uses the active ISA's float lanes; see assign_layouts.cpp).
#pragma once

#include "pto/passes.h"

namespace pto::passes {

// The channel block the registered pass uses on this machine: the float lanes of the ISA the
// kernels run with (16 with AVX-512, 8 with AVX2), 0 where there are no vectors (no blocking).
int machine_channel_block();

// AssignLayouts with channel block `block` (>= 2; anything else leaves the graph as it was).
// Without `cost_rule`, every conv the blocked kernel can run is blocked (kernel tests).
Graph assign_layouts(Graph g, const PassContext& ctx, int block, bool cost_rule = true);

}  // namespace pto::passes
