// The profiler (include/pto/profiler.h): what a session records from Executable runs, checked
// against facts computed here from the graph (every step once per call, FLOPs of a MatMul, data
// dependencies, the memory plan's peaks), the nesting of calls, kernels and tasks, self times
// that partition a call, sessions that start and stop while other threads run, and the errors.
// The trace's format is checked by tests/python/test_profiler.py (a Trace Event Format validator).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/profiler.h"
#include "random_tensor.h"

namespace pto {
namespace {

using profiler::Event;
using testing::constant;
using testing::random_tensor;

struct ThreadsScope {
  int saved = num_threads();
  explicit ThreadsScope(int n) { set_num_threads(n); }
  ~ThreadsScope() { set_num_threads(saved); }
};

// Stops a session a failed assertion left running.
struct StopAtExit {
  ~StopAtExit() {
    if (profiler::recording()) profiler::stop();
  }
};

// x[64, 192] -> MatMul w1[192, 256] -> Relu -> {MatMul w2, MatMul w3} -> Add: a kernel large
// enough to be cut into tasks and two independent branches.
Graph model() {
  Graph g;
  g.name = "mlp";
  ValueId x = g.add_input("x", {DType::kF32, to_shape({64, 192})});
  ValueId w1 = constant(g, "w1", {192, 256}, 1), w2 = constant(g, "w2", {256, 128}, 2),
          w3 = constant(g, "w3", {256, 128}, 3);
  ValueId h = g.add_value("h"), r = g.add_value("r"), a = g.add_value("a"), b = g.add_value("b"),
          y = g.add_value("y");
  g.add_node("MatMul", {x, w1}, {h}, {}, "fc1");
  g.add_node("Relu", {h}, {r}, {}, "relu");
  g.add_node("MatMul", {r, w2}, {a}, {}, "fc2");
  g.add_node("MatMul", {r, w3}, {b}, {}, "fc3");
  g.add_node("Add", {a, b}, {y}, {}, "add");
  g.add_output(y);
  return g;
}

profiler::Profile profile_runs(const Executable& exe, const Tensor& x, int calls,
                               profiler::Options o = {true, true}) {
  profiler::start(o);
  for (int i = 0; i < calls; ++i) exe.run({x});
  return profiler::stop();
}

TEST(Profiler, RecordsEveryKernelOfEveryCallWithItsTasksInside) {
  ThreadsScope threads(2);
  StopAtExit stop;
  const Executable exe = compile(model());
  const Tensor x = random_tensor({64, 192}, 7);
  exe.run({x});
  const profiler::Profile p = profile_runs(exe, x, 3);
  ASSERT_EQ(p.calls.size(), 3u);
  ASSERT_EQ(p.models.size(), 1u);
  const profiler::ModelInfo& m = p.models[0];
  EXPECT_EQ(m.name, "mlp");
  ASSERT_EQ(m.kernels.size(), exe.num_steps());
  EXPECT_EQ(p.pool_threads, 2);

  std::map<std::pair<int32_t, int32_t>, const Event*> kernels;  // (call, step)
  std::map<int32_t, const Event*> calls;
  for (const Event& e : p.events) {
    if (e.kind == Event::Kind::kKernel) {
      EXPECT_TRUE(kernels.insert({{e.call, e.step}, &e}).second);
    }
    if (e.kind == Event::Kind::kCall) calls[e.call] = &e;
    EXPECT_LE(e.start_ns, e.end_ns);
  }
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(kernels.size(), 3 * exe.num_steps());
  std::set<int32_t> task_threads;
  for (const Event& e : p.events) {
    if (e.kind == Event::Kind::kKernel) {  // inside its call's span
      EXPECT_GE(e.start_ns, calls.at(e.call)->start_ns);
      EXPECT_LE(e.end_ns, calls.at(e.call)->end_ns);
    }
    if (e.kind != Event::Kind::kTask) continue;
    const Event& k = *kernels.at({e.call, e.step});
    task_threads.insert(e.thread);
    if (e.thread == k.thread) {  // on the kernel's thread: inside the kernel's span
      EXPECT_GE(e.start_ns, k.start_ns);
      EXPECT_LE(e.end_ns, k.end_ns);
    } else {  // on another: inside the call's
      EXPECT_GE(e.start_ns, calls.at(e.call)->start_ns);
      EXPECT_LE(e.end_ns, calls.at(e.call)->end_ns);
    }
  }
  EXPECT_FALSE(task_threads.empty());
  EXPECT_EQ(p.threads[static_cast<size_t>(calls.begin()->second->thread)], "caller 1");
  for (size_t t = 0; t < p.threads.size(); ++t)
    EXPECT_TRUE(p.threads[t] == "caller 1" || p.threads[t] == "pto worker 1") << p.threads[t];

  // Per step: the nodes it covers, FLOPs counted here, and its consumers from the graph.
  const Graph& g = exe.graph();
  for (size_t s = 0; s < exe.num_steps(); ++s) {
    const profiler::KernelInfo& k = m.kernels[s];
    ASSERT_EQ(k.sources.size(), exe.step(s).nodes.size());
    double flops = 0;
    std::set<int32_t> consumers;
    for (size_t i = 0; i < k.sources.size(); ++i) {
      const Node& n = g.nodes()[exe.step(s).nodes[i]];
      EXPECT_EQ(k.sources[i], n.name);
      if (n.op == "MatMul") {
        const Shape& a = *g.value(n.inputs[0]).type.shape;
        const Shape& b = *g.value(n.inputs[1]).type.shape;
        flops += 2.0 * a[0].value * a[1].value * b[1].value;
      }
    }
    for (size_t t = 0; t < exe.num_steps(); ++t)
      for (ValueId v : exe.step(t).inputs)
        if (g.value(v).producer >= 0 && exe.step_of_node(g.value(v).producer) == s && t != s)
          consumers.insert(static_cast<int32_t>(t));
    EXPECT_DOUBLE_EQ(k.flops, flops) << k.name;
    EXPECT_EQ(std::set<int32_t>(k.consumers.begin(), k.consumers.end()), consumers) << k.name;
    EXPECT_EQ(k.input_shapes.size(), exe.step(s).inputs.size());
  }

  // Memory: the counters' maxima are the plan's peaks.
  const ExecutableStats st = exe.stats();
  size_t live = 0, top = 0;
  for (const auto& k : m.kernels) {
    live = std::max(live, k.live_bytes);
    top = std::max(top, k.arena_top);
  }
  EXPECT_EQ(live, st.live_peak_bytes);
  EXPECT_EQ(top, st.peak_bytes);
  EXPECT_EQ(m.peak_bytes, st.peak_bytes);
}

TEST(Profiler, SelfTimesPartitionACallOnOneThread) {
  ThreadsScope threads(1);
  StopAtExit stop;
  const Executable exe = compile(model());
  const Tensor x = random_tensor({64, 192}, 7);
  exe.run({x});
  const profiler::Profile p = profile_runs(exe, x, 4, {});
  const auto rows = profiler::key_averages(p);
  int64_t kernel_self = 0, kernel_total = 0;
  const profiler::Average* call = nullptr;
  for (const auto& r : rows) {
    if (r.kind == "kernel") {
      kernel_self += r.self_ns;
      kernel_total += r.total_ns;
      EXPECT_EQ(r.calls, 4);
    }
    if (r.kind == "call") call = &r;
  }
  ASSERT_NE(call, nullptr);
  EXPECT_EQ(call->calls, 4);
  EXPECT_EQ(kernel_self, kernel_total);  // nothing nests in a kernel but its tasks
  EXPECT_EQ(kernel_self + call->self_ns, call->total_ns);
  EXPECT_EQ(rows.size(), exe.num_steps() + 1);
}

TEST(Profiler, RangesNestAndTakeTheirCallsOutOfTheirSelfTime) {
  ThreadsScope threads(1);
  StopAtExit stop;
  const Executable exe = compile(model());
  const Tensor x = random_tensor({64, 192}, 7);
  profiler::end_range();  // not recording: nothing happens
  profiler::start();
  profiler::begin_range("outer");
  exe.run({x});
  profiler::begin_range("inner");
  exe.run({x});
  profiler::end_range();
  profiler::end_range();
  profiler::end_range();  // none open: ignored
  profiler::begin_range("left open");
  const profiler::Profile p = profiler::stop();
  std::map<std::string, profiler::Average> by_name;
  for (const auto& r : profiler::key_averages(p)) by_name[r.name] = r;
  ASSERT_TRUE(by_name.count("outer") && by_name.count("inner") && by_name.count("left open"));
  const auto& call = by_name.at("call mlp");
  EXPECT_EQ(call.calls, 2);
  const auto &outer = by_name.at("outer"), &inner = by_name.at("inner");
  std::vector<int64_t> call_ns;  // one thread: in time order
  for (const Event& e : p.events)
    if (e.kind == Event::Kind::kCall) call_ns.push_back(e.end_ns - e.start_ns);
  ASSERT_EQ(call_ns.size(), 2u);
  EXPECT_EQ(inner.self_ns, inner.total_ns - call_ns[1]);
  EXPECT_EQ(outer.self_ns, outer.total_ns - call_ns[0] - inner.total_ns);
  EXPECT_EQ(by_name.at("left open").calls, 1);  // cut where the session stopped
  EXPECT_LE(by_name.at("left open").total_ns, p.duration_ns);
}

TEST(Profiler, ErrorsAndStateChanges) {
  StopAtExit stop;
  EXPECT_FALSE(profiler::recording());
  EXPECT_THROW(profiler::stop(), ValueError);
  profiler::start();
  EXPECT_TRUE(profiler::recording());
  EXPECT_THROW(profiler::start(), ValueError);
  const profiler::Profile empty = profiler::stop();
  EXPECT_TRUE(empty.events.empty());
  EXPECT_TRUE(profiler::key_averages(empty).empty());
  EXPECT_THROW(profiler::table(empty, {}, {.sort_by = "bogus"}), ValueError);
  EXPECT_THROW(profiler::timeline_svg(empty, 10), ValueError);
  EXPECT_THROW(profiler::write_chrome_trace(empty, "/nonexistent/dir/t.json"), ValueError);
  // Runs outside a session record nothing in the next one.
  const Executable exe = compile(model());
  exe.run({random_tensor({64, 192}, 7)});
  profiler::start();
  EXPECT_TRUE(profiler::stop().events.empty());
}

TEST(Profiler, StopWhileOtherThreadsRunLeavesCompleteCalls) {
  ThreadsScope threads(2);
  StopAtExit stop;
  const Executable exe = compile(model());
  const Tensor x = random_tensor({64, 192}, 7);
  std::atomic<bool> done{false};
  size_t recorded = 0;
  std::vector<std::thread> runners;
  for (int t = 0; t < 2; ++t)
    runners.emplace_back([&] {
      while (!done.load()) exe.run({x});
    });
  // 20 windows of 0-0.8 ms, then longer ones until one holds a whole call: under a sanitizer on a
  // loaded machine a call can outlast every short window.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int round = 0; round < 20 || (recorded == 0 && std::chrono::steady_clock::now() < give_up);
       ++round) {
    profiler::start({true, true});
    std::this_thread::sleep_for(
        std::chrono::microseconds(200 * (round < 20 ? round % 5 : round - 16)));
    const profiler::Profile p = profiler::stop();
    // Every call recorded is complete: its event and one kernel event per step.
    std::map<int32_t, size_t> kernels_of_call;
    size_t call_events = 0;
    for (const Event& e : p.events) {
      if (e.kind == Event::Kind::kKernel) ++kernels_of_call[e.call];
      if (e.kind == Event::Kind::kCall) ++call_events;
    }
    EXPECT_EQ(call_events, p.calls.size());
    for (const auto& [call, n] : kernels_of_call) EXPECT_EQ(n, exe.num_steps()) << call;
    EXPECT_EQ(kernels_of_call.size(), p.calls.size());
    for (const auto& c : p.calls) EXPECT_GE(c.event, 0);
    recorded += p.calls.size();
  }
  EXPECT_GT(recorded, 0u);
  done.store(true);
  for (auto& r : runners) r.join();
}

}  // namespace
}  // namespace pto
