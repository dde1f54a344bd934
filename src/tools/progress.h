// A one-line progress bar on stderr for long work (`pto bench`'s warm-up and iterations): drawn
// only when stderr is a terminal, at most ten times a second, and erased when done, so output
// piped to a file or a test stays clean.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace pto::cli {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total)
      : label_(std::move(label)), total_(total), on_(isatty(STDERR_FILENO) == 1 && total > 0) {}
  ~ProgressBar() { done(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(int64_t finished) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    if (finished < total_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const int width = 30;
    const int filled = static_cast<int>(width * finished / total_);
    std::fprintf(stderr, "\r%s [%s%s] %lld/%lld", label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), static_cast<long long>(finished),
                 static_cast<long long>(total_));
    std::fflush(stderr);
    drawn_ = true;
  }
  void done() {
    if (!drawn_) return;
    std::fprintf(stderr, "\r%s\r", std::string(label_.size() + 60, ' ').c_str());
    std::fflush(stderr);
    drawn_ = false;
  }

 private:
  std::string label_;
  int64_t total_;
  bool on_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace pto::cli
