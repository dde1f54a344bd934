// When `auto` threading runs a job on PyTorch's OpenMP team and when on PyPTO's own threads.
//
// Beside PyTorch the team is the right place: after a torch op its workers spin waiting for the
// next region, and PyPTO's own threads woken next to them make three runnable threads on two cores
// (GPT-2's generate() on 2 threads: 22.9-26.6 ms a step on own threads, 18.2-20.8 on the team,
// bench/generate.py). But an
// OpenMP region ends in a barrier that waits for every member of the team, so where other
// processes hold the cores a member the OS has descheduled holds the caller for its time slice
// after all the tasks are done (the call after a torch op 14-60 ms on the team beside four busy
// loops, 0.7 ms on own threads, whose caller waits only for the tasks). The guard watches that
// wait: a job whose region ended more than `stall_limit` after its last task sends the jobs to
// own threads for a backoff, which doubles at each stall that follows a return to the team (up to
// `max_backoff`) and goes back to `first_backoff` after `forgive` on the team without a stall.
// When a backoff ends, the team is tried again only if the machine is not crowded (the cores
// cannot hold the pool's threads beside the threads other processes have runnable: the stall
// would come back at once); a crowded machine starts the next backoff as a stall would.
#pragma once

#include <algorithm>
#include <chrono>

namespace pto::detail {

class TeamGuard {
 public:
  using Clock = std::chrono::steady_clock;

  struct Limits {
    std::chrono::microseconds stall_limit{200};
    std::chrono::milliseconds first_backoff{50};
    std::chrono::milliseconds max_backoff{5000};
    std::chrono::milliseconds forgive{2000};
  };

  TeamGuard() = default;
  explicit TeamGuard(Limits limits) : limits_(limits), backoff_(limits.first_backoff) {}

  // Whether a job starting at `now` goes to the team. `crowded()` is asked only when a backoff
  // has just ended.
  template <class Crowded>
  bool use_team(Clock::time_point now, Crowded crowded) {
    if (now < own_until_) return false;
    if (!retrying_) return true;
    retrying_ = false;
    if (!crowded()) return true;
    back_off(now);
    return false;
  }

  // After a job on the team whose region returned at `now`, `stall` after its last task ended.
  // Returns whether the jobs go to own threads from now on (for backoff()).
  bool judge(Clock::time_point now, Clock::duration stall) {
    if (stalls_ > 0 && now - own_until_ >= limits_.forgive) backoff_ = limits_.first_backoff;
    if (stall <= limits_.stall_limit) return false;
    back_off(now);
    return true;
  }

  // The backoff the last stall (or crowded retry) started, and their number so far.
  std::chrono::milliseconds backoff() const { return last_backoff_; }
  long stalls() const { return stalls_; }

 private:
  void back_off(Clock::time_point now) {
    ++stalls_;
    retrying_ = true;
    own_until_ = now + backoff_;
    last_backoff_ = backoff_;
    backoff_ = std::min<std::chrono::milliseconds>(backoff_ * 2, limits_.max_backoff);
  }

  Limits limits_{};
  std::chrono::milliseconds backoff_{limits_.first_backoff};
  std::chrono::milliseconds last_backoff_{0};
  Clock::time_point own_until_{};
  long stalls_ = 0;
  bool retrying_ = false;  // a backoff started: ask crowded() when it ends
};

}  // namespace pto::detail
