// Stages (src/runtime/stages.h): independent small steps run at the same time. Results equal the
// reference interpreter's and, bit for bit, the sequential run's, on 1 and 2 threads; the memory
// plan never gives two steps of one stage the same bytes (offsets checked directly), in particular
// an in-place step never writes over what a sibling reads; run_as_on_pool cuts work as the pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "env_guard.h"
#include "pto/executable.h"
#include "pto/liveness.h"
#include "pto/op_registry.h"
#include "pto/parallel.h"
#include "pto/reference.h"
#include "random_tensor.h"
#include "runtime/memory_plan.h"
#include "runtime/stages.h"

namespace pto {
namespace {

using testing::constant;
using testing::random_tensor;

struct ThreadsScope {
  int saved = num_threads();
  explicit ThreadsScope(int n) { set_num_threads(n); }
  ~ThreadsScope() { set_num_threads(saved); }
};

void expect_near(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); ++i)
    ASSERT_NEAR(a.item_as_double(i), b.item_as_double(i), tol * (1 + std::abs(b.item_as_double(i))))
        << what << " element " << i;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  EXPECT_EQ(std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()), 0) << what;
}

// x -> {MatMul a, MatMul b, Relu c, Sigmoid(Neg) d} -> Concat, then a second layer of the same
// over the concatenation: independent branches twice.
Graph branches() {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({7, 24})});
  ValueId cur = x;
  int64_t width = 24;
  for (int layer = 0; layer < 2; ++layer) {
    const std::string l = std::to_string(layer);
    ValueId wa = constant(g, "wa" + l, {width, 24}, 10 + layer);
    ValueId wb = constant(g, "wb" + l, {width, 16}, 20 + layer);
    ValueId a = g.add_value("a" + l), b = g.add_value("b" + l), c = g.add_value("c" + l),
            n = g.add_value("n" + l), d = g.add_value("d" + l), y = g.add_value("y" + l);
    g.add_node("MatMul", {cur, wa}, {a}, {}, "mm_a" + l);
    g.add_node("MatMul", {cur, wb}, {b}, {}, "mm_b" + l);
    g.add_node("Relu", {cur}, {c}, {}, "relu" + l);
    g.add_node("Neg", {cur}, {n}, {}, "neg" + l);
    g.add_node("Sigmoid", {n}, {d}, {}, "sigmoid" + l);
    Attributes axis;
    axis.set("axis", int64_t{1});
    g.add_node("Concat", {a, b, c, d}, {y}, axis, "concat" + l);
    cur = y;
    width = 24 + 16 + 2 * width;
  }
  g.add_output(cur);
  return g;
}

Executable compile_with(const Graph& g, bool concurrent) {
  CompileOptions o;
  o.concurrent_kernels = concurrent;
  return compile(g, o);
}

TEST(Stages, BranchesMatchReferenceAndSequentialRun) {
  const Graph g = branches();
  Graph typed = g;
  infer_types(typed);
  const Tensor x = random_tensor({7, 24}, 1);
  const Tensor want = reference::run(typed, {x})[0];
  for (int threads : {1, 2}) {
    ThreadsScope scope(threads);
    Executable on = compile_with(g, true), off = compile_with(g, false);
    EXPECT_EQ(off.stats().stages, 0u);
    if (threads == 1) {
      EXPECT_EQ(on.stats().stages, 0u);  // one thread: nothing to share
    } else {
      EXPECT_EQ(on.stats().stages, 2u);  // one per layer: the four branches
      EXPECT_GE(on.stats().staged_kernels, 6u);
    }
    const Tensor seq = off.run({x})[0];
    for (int round = 0; round < 3; ++round) {
      const Tensor got = on.run({x})[0];
      expect_near(got, want, 1e-5, cat(threads, " threads"));
      expect_same_bits(got, seq, cat(threads, " threads, round ", round));
    }
    expect_near(seq, want, 1e-5, "sequential");
    // Without the memory plan's arena the stages still run (every buffer from the pool).
    CompileOptions unplanned;
    unplanned.memory_optimization = false;
    Executable pooled = compile(g, unplanned);
    EXPECT_EQ(pooled.stats().stages, on.stats().stages);
    expect_same_bits(pooled.run({x})[0], seq, cat(threads, " threads, no arena"));
  }
  // Compiled for two threads, run on one: steps in order, the same bits.
  Executable on = [&] {
    ThreadsScope two(2);
    return compile_with(g, true);
  }();
  const Tensor two = [&] {
    ThreadsScope scope(2);
    return on.run({x})[0];
  }();
  ThreadsScope one(1);
  expect_same_bits(on.run({x})[0], two, "compiled on 2 threads, run on 1");
}

TEST(Stages, SymbolicBatchStagesOnlyWhereSmall) {
  // Stages are candidates at compile time and active per shape: a large batch makes the
  // MatMuls too big to share the machine, so its plan runs them one after another. The two
  // MatMuls are the independent steps under test: MergeSiblingMatMuls would make them one.
  testing::EnvGuard apart("PTO_DISABLE_PASSES", "MergeSiblingMatMuls");
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("n"), Dim(64)}});
  ValueId wa = constant(g, "wa", {64, 64}, 2), wb = constant(g, "wb", {64, 64}, 3);
  ValueId a = g.add_value("a"), b = g.add_value("b"), y = g.add_value("y");
  g.add_node("MatMul", {x, wa}, {a}, {}, "mm_a");
  g.add_node("MatMul", {x, wb}, {b}, {}, "mm_b");
  Attributes axis;
  axis.set("axis", int64_t{1});
  g.add_node("Concat", {a, b}, {y}, axis, "concat");
  g.add_output(y);
  ThreadsScope scope(2);
  Executable on = compile_with(g, true), off = compile_with(g, false);
  for (int64_t n : {1, 5, 4096}) {
    const Tensor x_n = random_tensor({n, 64}, 4);
    Graph typed = g;
    typed.value(x).type.shape = to_shape({n, 64});
    infer_types(typed);
    const Tensor got = on.run({x_n})[0];
    expect_near(got, reference::run(typed, {x_n})[0], 1e-4, cat("n ", n));
    expect_same_bits(got, off.run({x_n})[0], cat("n ", n));
    EXPECT_EQ(on.stats({{n, 64}}).stages, n == 4096 ? 0u : 1u) << n;
  }
}

// For a plan made with `stage_of`: no output of a step shares bytes with another output of its
// stage or with a buffer another step of its stage reads.
void expect_stages_apart(const Graph& g, const KernelGraph& kg, const Liveness& live,
                         const MemoryPlan& plan, const std::vector<int32_t>& stage_of) {
  // A slot is a step's when a node of the step makes its value. (A view step reading a view of a
  // root made elsewhere also gets a slot for that root, from liveness taking it for a product of
  // the group; the view allocates nothing, so that slot is never used.)
  auto made_by = [&](size_t step, ValueId v) {
    const auto& nodes = kg.kernels[step].nodes;
    return std::find(nodes.begin(), nodes.end(), g.value(v).producer) != nodes.end();
  };
  std::map<ValueId, std::pair<size_t, size_t>> where;  // value -> [offset, end)
  for (size_t step = 0; step < plan.step_slots.size(); ++step)
    for (const auto& s : plan.step_slots[step])
      if (made_by(step, s.value)) where[s.value] = {s.offset, s.offset + s.bytes};
  auto bytes_of = [&](ValueId v) -> std::optional<std::pair<size_t, size_t>> {
    auto it = where.find(live.root[v]);
    if (it == where.end()) return std::nullopt;
    return it->second;
  };
  auto apart = [](std::pair<size_t, size_t> a, std::pair<size_t, size_t> b) {
    return a.second <= b.first || b.second <= a.first;
  };
  size_t checked = 0;
  for (size_t s = 0; s < kg.kernels.size(); ++s)
    for (size_t t = 0; t < kg.kernels.size(); ++t) {
      if (s == t || stage_of[s] != stage_of[t]) continue;
      for (const auto& out : plan.step_slots[s]) {
        if (!made_by(s, out.value)) continue;
        const std::pair<size_t, size_t> mine{out.offset, out.offset + out.bytes};
        for (const auto& other : plan.step_slots[t]) {
          if (!made_by(t, other.value)) continue;
          EXPECT_TRUE(apart(mine, {other.offset, other.offset + other.bytes}))
              << "steps " << s << " and " << t << " of one stage write the same bytes";
          ++checked;
        }
        for (ValueId in : kg.kernels[t].inputs) {
          auto b = in == kNoValue ? std::nullopt : bytes_of(in);
          if (!b) continue;
          EXPECT_TRUE(apart(mine, *b)) << "step " << s << " writes over '" << g.value(in).name
                                       << "', which step " << t << " of its stage reads";
          ++checked;
        }
      }
    }
  EXPECT_GT(checked, 0u);
}

TEST(Stages, InPlaceStepNeverWritesOverWhatASiblingReads) {
  // s0: t = Relu(x); s1: u = Neg(t); s2: v = Sigmoid(t), which may write over t (t dies there);
  // s3: y = Add(u, v). With s1 and s2 in one stage, s1 reads t while s2 runs: not in place.
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({4, 64})});
  ValueId t = g.add_value("t"), u = g.add_value("u"), v = g.add_value("v"), y = g.add_value("y");
  g.add_node("Relu", {x}, {t}, {}, "relu");
  g.add_node("Neg", {t}, {u}, {}, "neg");
  g.add_node("Sigmoid", {t}, {v}, {}, "sigmoid");
  g.add_node("Add", {u, v}, {y}, {}, "add");
  g.add_output(y);
  infer_types(g);
  const KernelGraph kg = single_node_kernels(g);
  const Liveness live = analyze_liveness(g, kg);
  std::vector<bool> in_place;
  for (const KernelGroup& k : kg.kernels) in_place.push_back(may_run_in_place(g, k));
  ASSERT_TRUE(in_place[2]);
  auto offset_of = [](const MemoryPlan& p, size_t step) { return p.step_slots[step].at(0).offset; };
  const MemoryPlan alone = plan_memory(g, kg, live, in_place);
  EXPECT_EQ(offset_of(alone, 2), offset_of(alone, 0));  // one after another: v over t
  const std::vector<int32_t> stage_of = {0, 1, 1, 2};
  const MemoryPlan staged = plan_memory(g, kg, live, in_place, stage_of);
  EXPECT_NE(offset_of(staged, 2), offset_of(staged, 0));
  expect_stages_apart(g, kg, live, staged, stage_of);
  EXPECT_EQ(staged.stage_begin, (std::vector<size_t>{0, 1, 3, 4}));
  EXPECT_EQ(staged.concurrent_stages, 1u);
  EXPECT_EQ(staged.concurrent_steps, 2u);
}

TEST(MemoryPlan, InPlaceNeedsTheInputsExactSize) {
  // t = Not(x) [7, 1] dies at y = And(t, m) [7, 7]: both round up to 64 bytes, but t is broadcast
  // (read after y's first row is written), so y gets a buffer of its own: in place, y's rows 1..
  // read a t that y's row 0 overwrote (BERT's padding mask at batch 1 came out wrong so).
  Graph g;
  ValueId x = g.add_input("x", {DType::kBool, to_shape({7, 1})});
  ValueId m = g.add_input("m", {DType::kBool, to_shape({1, 7})});
  ValueId t = g.add_value("t"), y = g.add_value("y"), z = g.add_value("z");
  g.add_node("Not", {x}, {t}, {}, "not");
  g.add_node("And", {t, m}, {y}, {}, "and");
  g.add_node("Not", {y}, {z}, {}, "out");  // a graph output is not planned: y is read by a step
  g.add_output(z);
  infer_types(g);
  const KernelGraph kg = single_node_kernels(g);
  const Liveness live = analyze_liveness(g, kg);
  ASSERT_TRUE(may_run_in_place(g, kg.kernels[1]));
  const MemoryPlan plan = plan_memory(g, kg, live, {false, true, false});
  EXPECT_NE(plan.step_slots[1].at(0).offset, plan.step_slots[0].at(0).offset);
}

// A random DAG of elementwise ops (in-place ones among them), views and MatMuls, each reading one
// or two earlier values: many branches, buffers dying inside stages, views of them read later.
Graph random_dag(uint32_t seed, int nodes) {
  std::mt19937 rng(seed);
  Graph g;
  std::vector<ValueId> values = {g.add_input("x", {DType::kF32, to_shape({6, 32})})};
  ValueId w = constant(g, "w", {32, 32}, seed + 1);
  ValueId flat = g.add_value("flat_shape"), back = g.add_value("back_shape");
  g.set_initializer(flat, Tensor::from_vector<int64_t>({192, 1}, {2}));
  g.set_initializer(back, Tensor::from_vector<int64_t>({6, 32}, {2}));
  std::set<ValueId> read;
  for (int i = 0; i < nodes; ++i) {
    auto pick = [&] {
      // Mostly recent values, sometimes old ones: long lives and many branches.
      const size_t n = values.size();
      const size_t back_by = rng() % 4 == 0 ? rng() % n : rng() % std::min<size_t>(n, 4);
      return values[n - 1 - back_by];
    };
    ValueId a = pick(), out = g.add_value(cat("v", i));
    const std::string name = cat("n", i);
    switch (rng() % 7) {
      case 0:
        g.add_node("Relu", {a}, {out}, {}, name);
        break;
      case 1:
        g.add_node("Sigmoid", {a}, {out}, {}, name);
        break;
      case 2:
        g.add_node("Neg", {a}, {out}, {}, name);
        break;
      case 3: {
        ValueId b = pick();
        g.add_node("Add", {a, b}, {out}, {}, name);
        read.insert(b);
        break;
      }
      case 4:
        g.add_node("MatMul", {a, w}, {out}, {}, name);
        break;
      case 5: {  // a view and back: a dependency through a view
        ValueId mid = g.add_value(cat("flat", i));
        g.add_node("Reshape", {a, flat}, {mid}, {}, name + "_flat");
        g.add_node("Reshape", {mid, back}, {out}, {}, name);
        break;
      }
      default:
        g.add_node("Mul", {a, a}, {out}, {}, name);
        break;
    }
    read.insert(a);
    values.push_back(out);
  }
  std::vector<ValueId> outs;  // every value nobody reads, summed into the one output
  for (ValueId v : values)
    if (!read.count(v) && v != values[0]) outs.push_back(v);
  ValueId sum = outs[0];
  for (size_t i = 1; i < outs.size(); ++i) {
    ValueId s = g.add_value(cat("sum", i));
    g.add_node("Add", {sum, outs[i]}, {s}, {}, cat("sum", i));
    sum = s;
  }
  g.add_output(sum);
  return g;
}

TEST(Stages, RandomGraphsPlanApartAndMatch) {
  ThreadsScope scope(2);
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    Graph g = random_dag(seed, 40);
    infer_types(g);
    // The plan directly: every step small, stages as wide as they come.
    const KernelGraph kg0 = single_node_kernels(g);
    const Stages st =
        plan_stages(g, kg0, std::vector<double>(kg0.kernels.size(), 1000.0), 16, num_threads());
    KernelGraph kg;
    for (size_t old : st.order) kg.kernels.push_back(kg0.kernels[old]);
    const Liveness live = analyze_liveness(g, kg);
    std::vector<bool> in_place;
    for (const KernelGroup& k : kg.kernels) in_place.push_back(may_run_in_place(g, k));
    ASSERT_GT(st.concurrent_stages, 0u);
    expect_stages_apart(g, kg, live, plan_memory(g, kg, live, in_place, st.stage_of), st.stage_of);
    // The order is topological: every step's producers come before it.
    std::vector<int32_t> done(g.nodes().size(), 0);
    for (const KernelGroup& k : kg.kernels) {
      for (ValueId v : k.inputs)
        if (g.value(v).producer >= 0) {
          EXPECT_TRUE(done[g.value(v).producer]);
        }
      for (int32_t n : k.nodes) done[n] = 1;
    }
    // And end to end, against the reference and the sequential run.
    const Tensor x = random_tensor({6, 32}, seed);
    const Tensor want = reference::run(g, {x})[0];
    Executable on = compile_with(g, true), off = compile_with(g, false);
    EXPECT_GT(on.stats().stages, 0u);
    const Tensor seq = off.run({x})[0];
    for (int round = 0; round < 3; ++round) {
      const Tensor got = on.run({x})[0];
      expect_same_bits(got, seq, cat("round ", round));
      expect_near(got, want, 1e-4, "reference");
    }
  }
}

TEST(Stages, GainFavoursKernelsOfLikeLength) {
  EXPECT_EQ(stage_gain({1000}, 2), 0);
  EXPECT_GT(stage_gain({1000, 1000}, 2), 0);           // each saves a region's overhead
  EXPECT_GT(stage_gain({20000, 20000, 20000}, 2), 0);  // three on two threads still balance
  EXPECT_LT(stage_gain({1000, 100000}, 2), 0);         // the long one would run on one core
  // In the plan: of three independent small steps, the much longer one stays out of the stage.
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({64, 64})});
  ValueId a = g.add_value("a"), b = g.add_value("b"), c = g.add_value("c");
  g.add_node("Relu", {x}, {a}, {}, "a");
  g.add_node("Neg", {x}, {b}, {}, "b");
  g.add_node("Exp", {x}, {c}, {}, "c");
  g.add_output(a);
  g.add_output(b);
  g.add_output(c);
  infer_types(g);
  const KernelGraph kg = single_node_kernels(g);
  const Stages st = plan_stages(g, kg, {1000, 100000, 1200}, 16, 2);
  EXPECT_EQ(st.order, (std::vector<size_t>{0, 2, 1}));
  EXPECT_EQ(st.stage_of, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(st.concurrent_stages, 1u);
}

TEST(Stages, RunAsOnPoolCutsWorkAsThePool) {
  ThreadsScope scope(2);
  auto chunks = [](int64_t n, int64_t grain) {
    std::mutex m;
    std::vector<std::pair<int64_t, int64_t>> seen;
    parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
      std::lock_guard lock(m);
      seen.push_back({b, e});
    });
    std::sort(seen.begin(), seen.end());
    return seen;
  };
  for (int64_t n : {1, 7, 100, 1000003}) {
    const auto pool = chunks(n, 3);
    std::vector<std::pair<int64_t, int64_t>> here;
    bool region = true;
    run_as_on_pool([&] {
      region = in_parallel_region();
      here = chunks(n, 3);
    });
    EXPECT_FALSE(region);
    EXPECT_EQ(here, pool) << n;
  }
  // Inside it, a region runs on the calling thread; nested regions are serial as on the pool.
  int nested_chunks = 0;
  run_as_on_pool([&] {
    parallel_tasks(2, [&](int64_t) {
      EXPECT_TRUE(in_parallel_region());
      parallel_for(0, 100, 1, [&](int64_t, int64_t) { ++nested_chunks; });
    });
  });
  EXPECT_EQ(nested_chunks, 2);
  EXPECT_THROW(run_as_on_pool([] { set_num_threads(1); }), ValueError);
}

// The bytes each planned buffer holds are not written by another step while the buffer is still
// to be read: a simulation of the run, step by step, with readers taken from the graph (a value
// read through a chain of views counts as a read of the value under them), not from Liveness.
void expect_live_buffers_apart(const Graph& g, const KernelGraph& kg, const MemoryPlan& plan,
                               const std::vector<bool>& in_place) {
  auto under_views = [&](ValueId v) {
    for (int32_t p = g.value(v).producer; p >= 0 && g.nodes()[p].def->has(kView);
         p = g.value(v).producer)
      v = g.nodes()[p].inputs.at(0);
    return v;
  };
  std::map<ValueId, size_t> last_read;  // value -> last step reading it or a view of it
  for (size_t t = 0; t < kg.kernels.size(); ++t)
    for (ValueId in : kg.kernels[t].inputs)
      if (in != kNoValue) last_read[under_views(in)] = t;
  struct Held {
    size_t lo, hi;
    ValueId value;
  };
  std::vector<Held> held;
  size_t checked = 0;
  for (size_t s = 0; s < kg.kernels.size(); ++s) {
    const auto& nodes = kg.kernels[s].nodes;
    for (const auto& slot : plan.step_slots[s]) {
      if (std::find(nodes.begin(), nodes.end(), g.value(slot.value).producer) == nodes.end())
        continue;  // a view step's slot for a root made elsewhere: never allocated
      const size_t lo = slot.offset, hi = slot.offset + slot.bytes;
      for (const Held& h : held) {
        if (h.hi <= lo || hi <= h.lo || h.value == slot.value) continue;
        auto it = last_read.find(h.value);
        const size_t until = it == last_read.end() ? 0 : it->second;
        const auto& ins = kg.kernels[s].inputs;
        const bool over_own_input =
            until == s && in_place[s] && std::find(ins.begin(), ins.end(), h.value) != ins.end();
        EXPECT_TRUE(until < s || over_own_input)
            << "step " << s << " writes '" << g.value(slot.value).name << "' over '"
            << g.value(h.value).name << "', read until step " << until;
        ++checked;
      }
      std::erase_if(held, [&](const Held& h) { return h.lo < hi && lo < h.hi; });
      held.push_back({lo, hi, slot.value});
    }
  }
  EXPECT_GT(checked, 0u);
}

TEST(MemoryPlan, ReuseDistanceKeepsLiveBuffersApart) {
  // reuse_distance 0 is the best-fit plan; k > 0 moves buffers into recently freed places, which
  // must still never hold two buffers needed at once.
  size_t moved = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    Graph g = random_dag(seed, 40);
    infer_types(g);
    const KernelGraph kg = single_node_kernels(g);
    const Liveness live = analyze_liveness(g, kg);
    std::vector<bool> in_place;
    for (const KernelGroup& k : kg.kernels) in_place.push_back(may_run_in_place(g, k));
    const MemoryPlan best_fit = plan_memory(g, kg, live, in_place, {}, 0);
    for (int k : {0, 1, 2, 8}) {
      SCOPED_TRACE(k);
      const MemoryPlan plan = plan_memory(g, kg, live, in_place, {}, k);
      expect_live_buffers_apart(g, kg, plan, in_place);
      EXPECT_LE(plan.arena_bytes, best_fit.arena_bytes * 21 / 20);  // the 5% gate
      for (size_t s = 0; s < plan.step_slots.size(); ++s)
        for (size_t i = 0; i < plan.step_slots[s].size(); ++i) {
          const bool same = plan.step_slots[s][i].offset == best_fit.step_slots[s][i].offset;
          if (k == 0) {
            EXPECT_TRUE(same);
          }
          moved += !same;
        }
    }
  }
  EXPECT_GT(moved, 0u);  // k > 0 changed some plans
}

}  // namespace
}  // namespace pto
