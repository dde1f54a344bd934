// The low-level runtime API, in the spirit of the ACL examples users know (aclrtCreateStream,
// aclrtMemcpyAsync, aclrtMalloc with ACL_MEM_MALLOC_HUGE_FIRST), on the CPU device:
//
//   pto::MemoryPool pool;
//   void* buf = pool.allocate(bytes, pto::kAllocHugeFirst | pto::kAllocPrefetch);
//   pto::Stream copy, compute;
//   pto::Event copied;
//   copy.memcpy_async(buf, host, bytes);
//   copied.record(copy);
//   compute.wait(copied);                    // compute starts after the copy
//   compute.launch([&] { exe.run(...); });
//   compute.synchronize();
//   float ms = pto::Event::elapsed_ms(start, stop);
//
// A Stream is an in-order queue served by its own thread; work on different streams runs
// concurrently. An exception thrown by work on a stream is rethrown by the next synchronize();
// until then the stream skips later work (which may depend on what failed) but still completes
// event records and waits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "pto/memory_policy.h"
#include "pto/tensor.h"

namespace pto {

// ---- memory pool ----

enum AllocFlags : uint32_t {
  kAllocDefault = 0,
  kAllocHugeFirst = 1u << 0,  // ask for 2 MiB pages (transparent huge pages) for large blocks
  kAllocPrefetch = 1u << 1,   // touch every page now, so the first kernel does not fault
  kAllocZero = 1u << 2,       // zero-filled
};
inline AllocFlags operator|(AllocFlags a, AllocFlags b) {
  return static_cast<AllocFlags>(static_cast<uint32_t>(a) | static_cast<uint32_t>(b));
}

struct MemoryPoolStats {
  size_t reserved_bytes = 0;        // held from the system, in use or cached
  size_t in_use_bytes = 0;          // handed out and not yet returned
  size_t peak_in_use_bytes = 0;     // high-water mark of in_use_bytes
  uint64_t system_allocations = 0;  // blocks taken from the system (misses)
  uint64_t pool_hits = 0;           // requests served from cached blocks
};

// A caching allocator: a returned block is kept and handed out again for a request of the same
// size class. Steady-state runs of an Executable therefore take nothing from the system.
// Thread-safe. Blocks still cached when the pool dies are freed; blocks still in use keep the pool
// alive (tensors hold a reference to it through their Storage).
class MemoryPool : public Allocator, public std::enable_shared_from_this<MemoryPool> {
 public:
  explicit MemoryPool(AllocFlags default_flags = kAllocDefault);
  ~MemoryPool() override;

  void* allocate(size_t nbytes) override { return allocate(nbytes, default_flags_); }
  void* allocate(size_t nbytes, AllocFlags flags);
  void deallocate(void* p, size_t nbytes) noexcept override;
  void release_cached();  // gives every cached (unused) block back to the system
  MemoryPoolStats stats() const;

 private:
  static size_t size_class(size_t nbytes);
  AllocFlags default_flags_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> cached blocks
  MemoryPoolStats stats_;
};

// ---- the pools compiled models allocate from ----
//
// Each Executable allocates its arenas and unplanned buffers from a MemoryPool. By default each
// has its own: its blocks stay cached for its next run. After enable_memory_pool(true), the
// executables compiled from then on share one process-wide pool, so blocks one model's run gave
// back serve the next model's: several models run in turn hold about the memory of the largest
// run instead of the sum. Executables compiled before keep the pool they have.
void enable_memory_pool(bool enabled = true);
bool memory_pool_enabled();
// The pool a newly compiled Executable takes: the shared one when enabled, else a new one.
std::shared_ptr<MemoryPool> executable_memory_pool();
// The counters of every live pool an Executable took, summed (the shared pool once).
// peak_in_use_bytes is the sum of each pool's own peak: an upper bound on the process's.
MemoryPoolStats memory_stats();

// ---- streams and events ----

class Stream;

// A point in a stream's queue. record() enqueues it; it completes (and takes its time stamp)
// when the stream reaches it.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(Stream& stream);
  void synchronize() const;  // blocks until the last record() has completed
  bool query() const;        // true when completed (or never recorded)
  // Milliseconds between two completed events; throws ValueError if either has not completed.
  static double elapsed_ms(const Event& start, const Event& end);

 private:
  friend class Stream;
  struct State;
  std::shared_ptr<State> state_;
};

class Stream {
 public:
  Stream();
  ~Stream();  // waits for queued work
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void launch(std::function<void()> fn);  // enqueues any host function (a graph run, a kernel)
  void memcpy_async(void* dst, const void* src, size_t nbytes);
  // Copies src into dst (same dtype and element count); both must stay alive until it runs.
  void copy_async(const Tensor& dst, const Tensor& src);
  void wait(const Event& event);  // later work on this stream starts after `event` completes
  void synchronize();             // blocks until the queue is empty; rethrows the first error
  bool query() const;             // true when the queue is empty

 private:
  friend class Event;
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pto
