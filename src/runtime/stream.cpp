// Stream and Event on the CPU device.
//
// A stream is a queue of items served in order by one thread of its own. An item is either work
// (a launched function, a copy) or a marker (an event record, a wait on an event). Once work has
// failed, the stream skips later work until synchronize() rethrows the error, since it may depend
// on what failed; markers still run, so nothing waiting on this stream's events hangs.
//
// An event counts its records and its completions; record() hands the stream a marker carrying the
// record's number, which completes it (and stamps the time) when the stream reaches it.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <thread>
#include <utility>

#include "pto/error.h"
#include "pto/runtime.h"

namespace pto {

using Clock = std::chrono::steady_clock;

struct Event::State {
  mutable std::mutex mutex;
  mutable std::condition_variable done;
  uint64_t recorded = 0;   // record() calls so far
  uint64_t completed = 0;  // the highest record number the stream has reached
  Clock::time_point stamp;

  void complete(uint64_t number) {
    {
      std::lock_guard lock(mutex);
      if (number <= completed) return;
      completed = number;
      stamp = Clock::now();
    }
    done.notify_all();
  }
  void wait_for(uint64_t number) const {
    std::unique_lock lock(mutex);
    done.wait(lock, [&] { return completed >= number; });
  }
};

struct Stream::State {
  struct Item {
    std::function<void()> fn;
    bool is_marker;  // runs even after an error
  };

  std::mutex mutex;
  std::condition_variable wake;  // the worker: an item arrived, or stop
  std::condition_variable idle;  // synchronize(): the queue ran empty
  std::deque<Item> queue;
  bool busy = false;  // the worker is running an item it took off the queue
  bool stop = false;
  std::exception_ptr error;  // the first failure since the last synchronize()
  std::thread worker;

  void push(std::function<void()> fn, bool is_marker) {
    {
      std::lock_guard lock(mutex);
      queue.push_back({std::move(fn), is_marker});
    }
    wake.notify_one();
  }

  void serve() {
    std::unique_lock lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop, and everything queued has run
      Item item = std::move(queue.front());
      queue.pop_front();
      bool skip = error && !item.is_marker;
      busy = true;
      lock.unlock();
      std::exception_ptr failure;
      if (!skip) {
        try {
          item.fn();
        } catch (...) {
          failure = std::current_exception();
        }
      }
      item.fn = nullptr;  // drop captured tensors before reporting idle
      lock.lock();
      if (failure && !error) error = failure;
      busy = false;
      if (queue.empty()) idle.notify_all();
    }
  }

  bool empty_locked() const { return queue.empty() && !busy; }
};

// ---- Event ----

Event::Event() : state_(std::make_shared<State>()) {}
Event::~Event() = default;

void Event::record(Stream& stream) {
  uint64_t number;
  {
    std::lock_guard lock(state_->mutex);
    number = ++state_->recorded;
  }
  stream.state_->push([s = state_, number] { s->complete(number); }, /*is_marker=*/true);
}

void Event::synchronize() const {
  uint64_t number;
  {
    std::lock_guard lock(state_->mutex);
    number = state_->recorded;
  }
  state_->wait_for(number);
}

bool Event::query() const {
  std::lock_guard lock(state_->mutex);
  return state_->completed >= state_->recorded;
}

double Event::elapsed_ms(const Event& start, const Event& end) {
  auto stamp = [](const Event& e, const char* which) {
    std::lock_guard lock(e.state_->mutex);
    if (e.state_->recorded == 0 || e.state_->completed < e.state_->recorded)
      throw ValueError(cat("Event::elapsed_ms: the ", which, " event ",
                           e.state_->recorded == 0 ? "was never recorded" : "has not completed"));
    return e.state_->stamp;
  };
  auto t0 = stamp(start, "start"), t1 = stamp(end, "end");
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// ---- Stream ----

Stream::Stream() : state_(std::make_unique<State>()) {
  state_->worker = std::thread([s = state_.get()] { s->serve(); });
}

Stream::~Stream() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;  // the worker drains the queue first
  }
  state_->wake.notify_one();
  state_->worker.join();
}

void Stream::launch(std::function<void()> fn) {
  if (!fn) throw ValueError("Stream::launch: empty function");
  state_->push(std::move(fn), /*is_marker=*/false);
}

void Stream::memcpy_async(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  if (!dst || !src) throw ValueError("Stream::memcpy_async: null pointer");
  state_->push([=] { std::memcpy(dst, src, nbytes); }, /*is_marker=*/false);
}

namespace {

// Copies src into dst element by element in row-major logical order (any strides).
void copy_tensor(const Tensor& dst, const Tensor& src) {
  Tensor s = src.contiguous();
  size_t item = s.itemsize();
  if (dst.is_contiguous()) {
    std::memcpy(dst.raw_data(), s.raw_data(), s.nbytes());
    return;
  }
  const Dims& shape = dst.shape();
  const Dims& strides = dst.strides();
  Dims index(shape.size(), 0);
  auto* out = static_cast<std::byte*>(dst.raw_data());
  const auto* in = static_cast<const std::byte*>(s.raw_data());
  int64_t offset = 0;  // of dst's element at `index`, in elements
  for (int64_t i = 0; i < dst.numel(); ++i) {
    std::memcpy(out + offset * static_cast<int64_t>(item), in + i * static_cast<int64_t>(item),
                item);
    for (size_t d = shape.size(); d-- > 0;) {  // next index, last dimension fastest
      offset += strides[d];
      if (++index[d] < shape[d]) break;
      offset -= strides[d] * shape[d];
      index[d] = 0;
    }
  }
}

}  // namespace

void Stream::copy_async(const Tensor& dst, const Tensor& src) {
  if (!dst.defined() || !src.defined()) throw ValueError("Stream::copy_async: undefined tensor");
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel())
    throw ValueError(cat("Stream::copy_async: cannot copy ", src.str(), " into ", dst.str(),
                         " (dtype and element count must match)"));
  if (dst.numel() == 0) return;
  state_->push([dst, src] { copy_tensor(dst, src); }, /*is_marker=*/false);
}

void Stream::wait(const Event& event) {
  uint64_t number;
  {
    std::lock_guard lock(event.state_->mutex);
    number = event.state_->recorded;
  }
  if (number == 0) return;  // never recorded: nothing to wait for
  state_->push([s = event.state_, number] { s->wait_for(number); }, /*is_marker=*/true);
}

void Stream::synchronize() {
  std::unique_lock lock(state_->mutex);
  state_->idle.wait(lock, [&] { return state_->empty_locked(); });
  if (std::exception_ptr e = std::exchange(state_->error, nullptr)) std::rethrow_exception(e);
}

bool Stream::query() const {
  std::lock_guard lock(state_->mutex);
  return state_->empty_locked();
}

}  // namespace pto
