// The profiler (docs/profiling.md): what ran, where and when, while a session is recording.
//
//   pto::profiler::start({.record_shapes = true, .profile_memory = true});
//   exe.run(inputs);
//   pto::profiler::Profile p = pto::profiler::stop();
//   std::cout << pto::profiler::table(pto::profiler::key_averages(p), {.sort_by = "self"});
//   pto::profiler::write_chrome_trace(p, "trace.json");
//
// Executable::run records a call, each kernel step of it (with the source nodes it covers, its
// shapes, FLOPs and the memory plan's bytes) and each tile task of each kernel on the thread that
// ran it. Off, the runtime pays one predictable branch per call, kernel step and task. Recording
// is process-wide: every Executable run on any thread between start() and stop() is recorded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pto/shape.h"

namespace pto::profiler {

struct Options {
  bool record_shapes = false;   // input and output shapes of every kernel
  bool profile_memory = false;  // bytes each kernel allocates and the live intermediate memory
};

// What one kernel step of a model is, for the input shapes of a call.
struct KernelInfo {
  std::string name;                  // the fusion rule ("Conv+Bias+Relu") or the op ("MaxPool")
  std::vector<std::string> sources;  // the names of the nodes it covers, in graph order
  std::string backend;               // "cpu", "reference"
  // The algorithm the kernel runs on these shapes when it says so in a line ("direct",
  // "winograd F(4x4,3x3)"): Winograd does fewer multiplications than `flops` counts.
  std::string algorithm;
  std::vector<Dims> input_shapes, output_shapes;  // record_shapes
  double flops = 0;                // multiply-adds count two; 0 when the kernel has no FLOPs
  bool flops_known = true;         // false when a shape or an op's FLOP count is not known
  std::vector<int32_t> consumers;  // later steps that read an output of this one
  size_t alloc_bytes = 0;          // arena bytes its outputs take (profile_memory)
  size_t live_bytes = 0;           // planned intermediate bytes live while it runs
  size_t arena_top = 0;            // the highest arena byte in use while it runs
};

// A model (an Executable) for one input-shape signature.
struct ModelInfo {
  std::string name;         // the graph's name
  uint64_t executable = 0;  // which Executable (one id per compile() in this process)
  std::vector<Dims> input_shapes;
  std::vector<KernelInfo> kernels;
  bool memory_planned = false;
  size_t peak_bytes = 0;       // the planned arena (ExecutableStats::peak_bytes)
  size_t live_peak_bytes = 0;  // the most planned bytes live at once
};

struct Event {
  enum class Kind : uint8_t { kCall, kKernel, kTask, kRange };
  Kind kind = Kind::kCall;
  int32_t thread = 0;    // index into Profile::threads
  int64_t start_ns = 0;  // since start()
  int64_t end_ns = 0;
  int32_t call = -1;   // index into Profile::calls (calls, kernels, tasks)
  int32_t step = -1;   // the kernel step (kernels, tasks)
  int64_t task = -1;   // the task index within its kernel's parallel region (tasks)
  int32_t label = -1;  // index into Profile::labels (ranges)
};

struct Call {
  int32_t model = 0;  // index into Profile::models
  int32_t event = 0;  // index of its kCall event in Profile::events
  std::string stack;  // the caller's stack when one was given (set_call_stack), "" otherwise
};

struct Profile {
  Options options;
  int pool_threads = 1;              // num_threads() at start()
  std::vector<std::string> threads;  // each thread that recorded something, then idle workers
  std::vector<ModelInfo> models;
  std::vector<Call> calls;
  std::vector<std::string> labels;  // names of the ranges (record_function)
  std::vector<Event> events;        // by thread, then by start time (outer before inner)
  int64_t duration_ns = 0;          // from start() to stop()
};

// Starts recording (ValueError when a session is already recording).
void start(const Options& options = {});
// Stops recording and returns what was recorded (ValueError when none is recording). Waits for
// the calls in flight to finish.
Profile stop();
bool recording();

// A named range on this thread (pypto.profiler.record_function); no-ops when not recording.
// end_range ends the innermost range this thread opened during the session.
void begin_range(const std::string& name);
void end_range();
// The next call this thread makes while recording carries this stack (Python's call site).
void set_call_stack(std::string stack);
// The name this thread's track gets ("pto worker 1"); threads not named are "caller <n>".
void set_thread_name(std::string name);

// --- Reports ---

// One row of key_averages: the calls of one kernel step of one model (and with group_by_shape,
// of one input-shape signature), of a model call, or of a range.
struct Average {
  std::string kind;  // "kernel", "call", "range"
  std::string name;
  std::string sources;  // kernels: their nodes, comma-separated
  std::string shapes;   // record_shapes: "[1, 64, 56, 56], [64, 64, 3, 3]"
  std::string backend;
  int64_t calls = 0;
  int64_t self_ns = 0;   // total less the time of events nested in it on the same thread
  int64_t total_ns = 0;  // the sum of its durations
  double flops = 0;      // over all calls; 0 when not known
  size_t alloc_bytes = 0;
  int64_t tasks = 0;  // tile tasks over all calls
};
std::vector<Average> key_averages(const Profile& p, bool group_by_shape = false);

struct TableOptions {
  // self (self_time_total, self_cpu_time_total), total (cpu_time_total, time_total), avg
  // (cpu_time), calls (count), flops, gflops, alloc (self_cpu_memory_usage), name. ValueError
  // for another key.
  std::string sort_by = "self";
  int64_t row_limit = 100;  // <= 0: every row
  double peak_gflops = 0;   // the FMA ceiling of the whole pool; 0: the column is left out
};
// The key averages as PyTorch's profiler prints them: Name, Self %, Self total, Total, Avg, Calls,
// (Shapes), (Alloc), GFLOP/s, % of FMA peak, Source ops; then the total self time.
std::string table(const Profile& p, const std::vector<Average>& rows,
                  const TableOptions& options = {});
// The FMA ceiling of `threads` cores (fma_ceiling().gflops x threads).
double fma_peak_gflops(int threads);

// Trace Event Format (chrome://tracing, Perfetto): a track per thread, an X slice per kernel and
// tile task, B/E slices for calls and ranges, flow arrows from each kernel to the kernels reading
// its outputs, a "memory" counter (profile_memory). Throws ValueError when the file cannot be
// written.
std::string chrome_trace(const Profile& p);
void write_chrome_trace(const Profile& p, const std::string& path);
// An SVG picture: a row per thread, a box per tile task colored by kernel, a legend of the kernels
// that took the most time, a time axis.
std::string timeline_svg(const Profile& p, int width = 1400);
void write_timeline_svg(const Profile& p, const std::string& path, int width = 1400);

}  // namespace pto::profiler
