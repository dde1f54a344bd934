// What the tuning cache keys a kernel on (docs/tuning.md "What it keys on"): the kernel's
// signature, a readable string of everything its best knobs may depend on besides the machine.
#pragma once

#include <string>

#include "pto/graph.h"
#include "pto/kernel_graph.h"

namespace pto::tune {

// The fusion rule; per node its op, attributes and where each input comes from (a group input by
// position, or an earlier node's output); every group input's and output's type, and which inputs
// are constants. A symbolic dimension is written by name ("f32[batch, 768]"): such a kernel is
// tuned at the sizes of one run and its knobs serve every size. "" when a rank is unknown: such
// kernels are not tuned. The knobs pinned on `group` are not part of it.
std::string kernel_signature(const Graph& g, const KernelGroup& group);

// Pins tuned knobs on a group: "tile" onto KernelGroup::tile, the others onto KernelGroup::knobs.
void apply_knobs(KernelGroup& group, const Knobs& knobs);

// "gemm.blocks=[256, 96, 4096] tile=[4, 768]", or "planner" when empty.
std::string knobs_str(const Knobs& knobs);

}  // namespace pto::tune
