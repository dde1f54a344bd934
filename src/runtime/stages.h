// Stages: plan steps that run at the same time, one per thread (DESIGN.md section 4: independent
// kernels may run at once on different cores; dependencies come from data, not source order).
//
// A stage is a run of consecutive steps none of which reads what another of them writes, each too
// small to fill the machine on its own: such a kernel spends much of its time splitting work and
// waiting for the pool, while two of them side by side each keep one core busy. The memory plan
// takes a stage as one point in time, so no two steps of a stage share bytes.
#pragma once

#include <cstddef>
#include <vector>

#include "pto/kernel_graph.h"

namespace pto {

// What a kernel costs, from the static shapes of its values (known = false when a size is not).
struct KernelCost {
  double flops = 0;  // multiply-adds count two: MatMul, Gemm, Conv, ConvTranspose
  double bytes = 0;  // read and written: every input and output of the kernel
  bool known = true;
};
// `types`: a copy of `g` typed for concrete input shapes whose value ids are g's (its nodes may
// differ); null: g's own types.
KernelCost kernel_cost(const Graph& g, const KernelGroup& k, const Graph* types = nullptr);

// The "too small to fill the machine" rule: a kernel is small when it does less than
// kStageFlopsPerThread FLOPs and moves less than kStageBytesPerThread bytes per thread of the
// pool. Measured on the 2-core development VM (docs/backend/runtime.md).
constexpr double kStageFlopsPerThread = 4e6;
constexpr double kStageBytesPerThread = 512.0 * 1024;
bool is_small(const KernelCost& c, int threads);

// Balance: a kernel alone on the pool takes about t / threads plus one region's overhead; kernels
// side by side take the longest of them (or their sum / threads) plus one overhead. So a tiny
// kernel beside a much longer one loses: the longer one runs on one core while the others wait.
// Estimates, not measurements of each machine: time from FLOPs at kStageFlopsPerNs and bytes at
// kStageBytesPerNs on one core, kStageRegionNs for a parallel region's start and join.
constexpr double kStageFlopsPerNs = 50;
constexpr double kStageBytesPerNs = 10;
constexpr double kStageRegionNs = 5000;
double estimated_ns(const KernelCost& c);
// Nanoseconds saved by running kernels of these times as one stage instead of one after another;
// 0 for one kernel.
double stage_gain(const std::vector<double>& ns, int threads);

struct Stages {
  std::vector<size_t> order;      // new position -> old kernel index (a topological order)
  std::vector<size_t> begin;      // stage i holds the steps [begin[i], begin[i + 1]) of `order`
  std::vector<int32_t> stage_of;  // per step of the new order
  size_t concurrent_stages = 0;   // stages of more than one step
  size_t concurrent_steps = 0;    // steps in them
};

// Groups the kernels of `kg` (in a valid order) into stages. The step first in the plan that is
// not placed yet opens a stage; a small one takes with it each later small step, at most `window`
// steps further in the plan, whose producers are all in earlier stages and which raises the
// stage's stage_gain. So steps move forward by at most `window` places, which bounds how much
// longer their outputs live. `ns[s]`: estimated_ns of step s when it is small, < 0 when not.
// window 0: no stages (every step alone, the order unchanged).
Stages plan_stages(const Graph& g, const KernelGraph& kg, const std::vector<double>& ns,
                   size_t window, int threads);

}  // namespace pto
