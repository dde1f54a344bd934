// The runtime's side of the profiler (include/pto/profiler.h): what Executable::run and the thread
// pool call. Off, each hook is one load and one branch on a value that does not change during a
// run: active() per call, the recorder's session per kernel step (KernelScope), the task context's
// session per task.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pto/profiler.h"

namespace pto::profiler {

class Session;

namespace detail {
extern std::atomic<Session*> g_session;
// The kernel step this thread runs while recording: tile tasks started here (or in a pool job
// started here) belong to it. Trivially constructed, so reading it costs no TLS wrapper call.
struct TaskContext {
  Session* session = nullptr;
  int32_t call = -1;
  int32_t step = -1;
};
extern constinit thread_local TaskContext t_context;
int64_t now_ns(const Session* s);
void record_task(const TaskContext& c, int64_t task, int64_t start_ns);
}  // namespace detail

// The recording session, or null (one atomic load).
inline Session* active() {
  return detail::g_session.load(std::memory_order_acquire);
}

// Runs a tile task, recording it when `c` belongs to a recording session.
template <typename F>
inline void run_task(const detail::TaskContext& c, int64_t task, F&& fn) {
  if (c.session == nullptr) [[likely]] {
    fn();
    return;
  }
  const int64_t t0 = detail::now_ns(c.session);
  fn();
  detail::record_task(c, task, t0);
}

// One Executable call while recording: begin() registers the call (and the model's facts for
// these shapes, made by `describe` once per session), end() records its span. Kernel steps are
// recorded through KernelScope.
class CallRecorder {
 public:
  CallRecorder() = default;
  CallRecorder(const CallRecorder&) = delete;
  CallRecorder& operator=(const CallRecorder&) = delete;
  ~CallRecorder();

  // False when the session stopped in the meantime (nothing is recorded then).
  bool begin(Session* s, uint64_t executable, const std::vector<Dims>& shapes,
             const std::function<ModelInfo(const Options&)>& describe);
  void end();

 private:
  friend class KernelScope;
  Session* session_ = nullptr;
  int32_t call_ = -1;
  int64_t start_ = 0;
};

// A kernel step on this thread: sets the task context and records the step's span.
class KernelScope {
 public:
  KernelScope(const CallRecorder& call, size_t step) {
    if (call.session_ != nullptr) [[unlikely]]
      open(call, step);
  }
  ~KernelScope() {
    if (start_ >= 0) [[unlikely]]
      close();
  }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  void open(const CallRecorder& call, size_t step);
  void close();
  detail::TaskContext saved_;
  int64_t start_ = -1;
};

}  // namespace pto::profiler
