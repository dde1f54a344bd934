// ProgressBar (include/pto/progress.h): one line on stderr, redrawn in place with "\r" and erased
// with ANSI "erase line" when the work is done.
#include "pto/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pto {
namespace {

size_t terminal_width() {
  winsize w{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col >= 20) return w.ws_col;
  return 80;
}

}  // namespace

bool ProgressBar::wanted() {
  const char* env = std::getenv("PTO_PROGRESS");
  if (env && *env) return std::strcmp(env, "0") != 0;
  return isatty(STDERR_FILENO) == 1;
}

std::string ProgressBar::render(const std::string& label, size_t done, size_t total,
                                const std::string& what, size_t width) {
  const size_t shown = std::min(done, total);
  const std::string count = std::to_string(shown) + "/" + std::to_string(total);
  const size_t bar = 24;
  const size_t filled = total ? bar * shown / total : bar;
  std::string line =
      label + " [" + std::string(filled, '#') + std::string(bar - filled, '.') + "] " + count;
  if (!what.empty()) line += " " + what;
  if (line.size() > width - 1) line.resize(width - 1);  // never wrap onto a second line
  return line;
}

ProgressBar::ProgressBar(std::string label, double delay_seconds)
    : label_(std::move(label)), enabled_(wanted()), delay_(delay_seconds), start_(Clock::now()) {
  // PTO_PROGRESS_DELAY=SECONDS replaces the delay (0: draw from the first update; tests).
  if (const char* d = std::getenv("PTO_PROGRESS_DELAY"); d && *d) {
    char* end = nullptr;
    const double v = std::strtod(d, &end);
    if (end && *end == '\0' && v >= 0) delay_ = v;
  }
}

ProgressBar::~ProgressBar() {
  finish();
}

void ProgressBar::update(size_t done, size_t total, const std::string& what) {
  if (!enabled_) return;
  const Clock::time_point now = Clock::now();
  if (std::chrono::duration<double>(now - start_).count() < delay_) return;
  const bool last = done >= total;
  if (drawn_ && !last && now - last_draw_ < std::chrono::milliseconds(50)) return;
  const std::string line = render(label_, done, total, what, terminal_width());
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
  last_draw_ = now;
}

void ProgressBar::finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace pto
