// Recording (include/pto/profiler.h). Each thread appends to its own buffer, so recording a task
// or a kernel takes no lock; a call takes the session's mutex once, to register itself (and the
// model's facts, once per executable and input shapes). A session object is never freed while the
// process runs (they are kept, emptied, in a list), so a thread that loaded the pointer just as
// stop() ran still touches valid memory: it registers as in flight, sees the session stopped and
// backs out; stop() waits for the calls in flight before it collects the buffers.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "pto/error.h"
#include "pto/parallel.h"
#include "runtime/profiler_hooks.h"

namespace pto::profiler {

struct ThreadBuffer {
  std::string name;
  std::vector<Event> events;
  std::vector<size_t> open_ranges;  // indices into events of ranges not ended yet
};

class Session {
 public:
  uint64_t id = 0;
  Options options;
  int pool_threads = 1;
  std::chrono::steady_clock::time_point t0;
  std::atomic<int> in_flight{0};

  std::mutex mutex;  // guards what follows
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;
  std::map<std::pair<uint64_t, std::vector<Dims>>, int32_t> model_index;
  std::vector<ModelInfo> models;
  std::vector<Call> calls;
  std::vector<std::string> labels;
  std::map<std::string, int32_t> label_index;
  int unnamed_threads = 0;
};

namespace detail {
std::atomic<Session*> g_session{nullptr};
constinit thread_local TaskContext t_context;

int64_t now_ns(const Session* s) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              s->t0)
      .count();
}
}  // namespace detail

namespace {

std::mutex g_control;  // start/stop
std::vector<std::unique_ptr<Session>> g_sessions;
uint64_t g_next_id = 1;

thread_local std::string t_thread_name;
thread_local std::string t_call_stack;
struct BufferCache {
  uint64_t session = 0;
  ThreadBuffer* buffer = nullptr;
};
thread_local BufferCache t_buffer;

ThreadBuffer& buffer(Session* s) {
  if (t_buffer.session != s->id) {
    std::lock_guard lock(s->mutex);
    auto b = std::make_unique<ThreadBuffer>();
    b->name = t_thread_name.empty() ? cat("caller ", ++s->unnamed_threads) : t_thread_name;
    b->events.reserve(4096);  // no reallocation in the first calls
    t_buffer = {s->id, b.get()};
    s->buffers.push_back(std::move(b));
  }
  return *t_buffer.buffer;
}

// Registers an operation in flight on `s`; null when `s` stopped meanwhile.
Session* enter(Session* s) {
  if (s == nullptr) return nullptr;
  s->in_flight.fetch_add(1);
  if (detail::g_session.load() != s) {
    s->in_flight.fetch_sub(1);
    return nullptr;
  }
  return s;
}
void leave(Session* s) {
  s->in_flight.fetch_sub(1, std::memory_order_release);
}

}  // namespace

void detail::record_task(const TaskContext& c, int64_t task, int64_t start_ns) {
  Event e;
  e.kind = Event::Kind::kTask;
  e.start_ns = start_ns;
  e.end_ns = now_ns(c.session);
  e.call = c.call;
  e.step = c.step;
  e.task = task;
  buffer(c.session).events.push_back(e);
}

void start(const Options& options) {
  std::lock_guard lock(g_control);
  if (detail::g_session.load())
    throw ValueError("profiler: a session is already recording (profiles do not nest)");
  auto s = std::make_unique<Session>();
  s->id = g_next_id++;
  s->options = options;
  s->pool_threads = num_threads();
  s->t0 = std::chrono::steady_clock::now();
  detail::g_session.store(s.get());
  g_sessions.push_back(std::move(s));
}

bool recording() {
  return detail::g_session.load() != nullptr;
}

Profile stop() {
  std::lock_guard lock(g_control);
  Session* s = detail::g_session.load();
  if (!s) throw ValueError("profiler: no session is recording");
  detail::g_session.store(nullptr);
  while (s->in_flight.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  Profile p;
  p.options = s->options;
  p.pool_threads = s->pool_threads;
  p.duration_ns = detail::now_ns(s);
  std::lock_guard data(s->mutex);
  p.models = std::move(s->models);
  p.calls = std::move(s->calls);
  p.labels = std::move(s->labels);
  std::vector<std::unique_ptr<ThreadBuffer>> buffers = std::move(s->buffers);
  s->model_index.clear();
  s->label_index.clear();
  // Kind order at equal start and end: the outer first.
  auto rank = [](Event::Kind k) {
    switch (k) {
      case Event::Kind::kRange:
        return 0;
      case Event::Kind::kCall:
        return 1;
      case Event::Kind::kKernel:
        return 2;
      case Event::Kind::kTask:
        return 3;
    }
    return 4;
  };
  for (size_t t = 0; t < buffers.size(); ++t) {
    ThreadBuffer& b = *buffers[t];
    for (size_t r : b.open_ranges) b.events[r].end_ns = p.duration_ns;  // still open: cut here
    if (b.events.empty()) continue;
    const auto thread = static_cast<int32_t>(p.threads.size());
    p.threads.push_back(b.name);
    for (Event& e : b.events) e.thread = thread;
    std::stable_sort(b.events.begin(), b.events.end(), [&](const Event& x, const Event& y) {
      if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
      if (x.end_ns != y.end_ns) return x.end_ns > y.end_ns;
      return rank(x.kind) < rank(y.kind);
    });
    p.events.insert(p.events.end(), b.events.begin(), b.events.end());
  }
  // A worker that ran no task still gets its (empty) track: an idle core is worth seeing.
  for (int i = 1; i < p.pool_threads; ++i) {
    std::string name = cat("pto worker ", i);
    if (std::find(p.threads.begin(), p.threads.end(), name) == p.threads.end())
      p.threads.push_back(std::move(name));
  }
  for (size_t i = 0; i < p.events.size(); ++i)
    if (p.events[i].kind == Event::Kind::kCall) p.calls[p.events[i].call].event = int32_t(i);
  return p;
}

void begin_range(const std::string& name) {
  Session* s = enter(active());
  if (!s) return;
  int32_t label;
  {
    std::lock_guard lock(s->mutex);
    auto [it, added] = s->label_index.emplace(name, static_cast<int32_t>(s->labels.size()));
    if (added) s->labels.push_back(name);
    label = it->second;
  }
  ThreadBuffer& b = buffer(s);
  Event e;
  e.kind = Event::Kind::kRange;
  e.start_ns = e.end_ns = detail::now_ns(s);
  e.label = label;
  b.open_ranges.push_back(b.events.size());
  b.events.push_back(e);
  leave(s);
}

void end_range() {
  Session* s = enter(active());
  if (!s) return;
  if (t_buffer.session == s->id && !t_buffer.buffer->open_ranges.empty()) {
    ThreadBuffer& b = *t_buffer.buffer;
    b.events[b.open_ranges.back()].end_ns = detail::now_ns(s);
    b.open_ranges.pop_back();
  }
  leave(s);
}

void set_call_stack(std::string stack) {
  t_call_stack = std::move(stack);
}

void set_thread_name(std::string name) {
  t_thread_name = std::move(name);
}

CallRecorder::~CallRecorder() {
  if (session_) end();
}

bool CallRecorder::begin(Session* s, uint64_t executable, const std::vector<Dims>& shapes,
                         const std::function<ModelInfo(const Options&)>& describe) {
  s = enter(s);
  if (!s) return false;
  try {
    std::lock_guard lock(s->mutex);
    auto key = std::make_pair(executable, shapes);
    auto it = s->model_index.find(key);
    if (it == s->model_index.end()) {
      ModelInfo m = describe(s->options);
      m.executable = executable;
      m.input_shapes = shapes;
      it = s->model_index.emplace(key, static_cast<int32_t>(s->models.size())).first;
      s->models.push_back(std::move(m));
    }
    call_ = static_cast<int32_t>(s->calls.size());
    s->calls.push_back({it->second, -1, std::move(t_call_stack)});
    t_call_stack.clear();
  } catch (...) {
    leave(s);
    throw;
  }
  session_ = s;
  start_ = detail::now_ns(s);
  return true;
}

void CallRecorder::end() {
  Event e;
  e.kind = Event::Kind::kCall;
  e.start_ns = start_;
  e.end_ns = detail::now_ns(session_);
  e.call = call_;
  buffer(session_).events.push_back(e);
  leave(session_);
  session_ = nullptr;
}

void KernelScope::open(const CallRecorder& call, size_t step) {
  saved_ = detail::t_context;
  detail::t_context = {call.session_, call.call_, static_cast<int32_t>(step)};
  start_ = detail::now_ns(call.session_);
}

void KernelScope::close() {
  const detail::TaskContext c = detail::t_context;
  detail::t_context = saved_;
  Event e;
  e.kind = Event::Kind::kKernel;
  e.start_ns = start_;
  e.end_ns = detail::now_ns(c.session);
  e.call = c.call;
  e.step = c.step;
  buffer(c.session).events.push_back(e);
}

}  // namespace pto::profiler
