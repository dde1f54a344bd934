// A progress bar for long work (compiling a large model, tuning, benchmark runs), drawn on stderr
// only when stderr is a terminal, so logs and pipes stay clean.
//
//   ProgressBar bar("compiling");
//   for (size_t i = 0; i < n; ++i) { work(i); bar.update(i + 1, n, name(i)); }
//   bar.finish();   // erases the bar (the destructor does too)
//
// Quiet unless stderr is a terminal; PTO_PROGRESS=0 turns it off there, PTO_PROGRESS=1 turns it on
// anywhere (for tests). Work that ends within `delay_seconds` draws nothing, so fast commands do
// not flicker (PTO_PROGRESS_DELAY=SECONDS changes the delay). Redraws at most every 50 ms. Not
// thread-safe: one thread updates a bar.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace pto {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label, double delay_seconds = 0.25);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `done` of `total` units; `what` names the current one. A new label starts a new phase.
  void update(size_t done, size_t total, const std::string& what = "");
  void set_label(std::string label) { label_ = std::move(label); }
  // Erases the bar if one was drawn; later updates draw again.
  void finish();
  bool enabled() const { return enabled_; }

  // Whether bars are drawn in this process: PTO_PROGRESS, else whether stderr is a terminal.
  static bool wanted();
  // The line drawn for these values, `width` columns wide at most (tests).
  static std::string render(const std::string& label, size_t done, size_t total,
                            const std::string& what, size_t width);

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  double delay_;
  Clock::time_point start_, last_draw_;
};

}  // namespace pto
