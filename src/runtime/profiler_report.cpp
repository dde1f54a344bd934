// key_averages and table (include/pto/profiler.h): the rows PyTorch's profiler prints.
//
// Self time: on each thread, calls, ranges and kernels nest (a range holds calls, a call holds
// the kernels it ran on its own thread); an event's self time is its span less the spans of the
// events directly inside it. Tile tasks are parts of their kernel, not events inside it, so they
// take nothing from its self time; kernels a stage ran on other threads take nothing from the
// call's (the call's self time is the time its thread spent outside kernels, waiting included).
#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include "pto/device_info.h"
#include "pto/error.h"
#include "pto/profiler.h"

namespace pto::profiler {
namespace {

std::string shapes_text(const std::vector<Dims>& shapes) {
  std::string out;
  for (const Dims& d : shapes) {
    if (!out.empty()) out += ", ";
    out += "[";
    for (size_t i = 0; i < d.size(); ++i) out += cat(i ? ", " : "", d[i] < 0 ? "?" : cat(d[i]));
    out += "]";
  }
  return out;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Self time of every event (0 for tasks).
std::vector<int64_t> self_times(const Profile& p) {
  std::vector<int64_t> self(p.events.size(), 0);
  std::vector<size_t> stack;
  int32_t thread = -1;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const Event& e = p.events[i];
    if (e.thread != thread) {
      stack.clear();
      thread = e.thread;
    }
    if (e.kind == Event::Kind::kTask) continue;
    self[i] = e.end_ns - e.start_ns;
    while (!stack.empty() && p.events[stack.back()].end_ns < e.end_ns) stack.pop_back();
    if (!stack.empty()) self[stack.back()] -= e.end_ns - e.start_ns;
    stack.push_back(i);
  }
  return self;
}

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

}  // namespace

std::vector<Average> key_averages(const Profile& p, bool group_by_shape) {
  const std::vector<int64_t> self = self_times(p);
  // Key: kind, executable (or label), step, the model when grouping by shape, the call site.
  using Key = std::tuple<int, uint64_t, int32_t, int32_t, std::string>;
  std::map<Key, size_t> index;
  std::vector<Average> rows;
  std::vector<int64_t> first_seen;
  auto row = [&](const Key& key, int64_t when, auto&& fill) -> Average& {
    auto [it, added] = index.emplace(key, rows.size());
    if (added) {
      rows.emplace_back();
      first_seen.push_back(when);
      fill(rows.back());
    }
    return rows[it->second];
  };
  for (size_t i = 0; i < p.events.size(); ++i) {
    const Event& e = p.events[i];
    const int64_t dur = e.end_ns - e.start_ns;
    if (e.kind == Event::Kind::kRange) {
      Average& r = row({0, 0, e.label, 0, ""}, e.start_ns, [&](Average& a) {
        a.kind = "range";
        a.name = p.labels[e.label];
      });
      ++r.calls;
      r.total_ns += dur;
      r.self_ns += self[i];
      continue;
    }
    const Call& c = p.calls[e.call];
    const ModelInfo& m = p.models[c.model];
    const int32_t shape_key = group_by_shape ? c.model : -1;
    if (e.kind == Event::Kind::kCall) {
      const std::string site = first_line(c.stack);
      Average& r = row({1, m.executable, -1, shape_key, site}, e.start_ns, [&](Average& a) {
        a.kind = "call";
        a.name = cat("call ", m.name.empty() ? "model" : m.name);
        if (!site.empty()) a.name += " @ " + site;
        if (group_by_shape && p.options.record_shapes) a.shapes = shapes_text(m.input_shapes);
      });
      ++r.calls;
      r.total_ns += dur;
      r.self_ns += self[i];
      continue;
    }
    const KernelInfo& k = m.kernels.at(e.step);
    Average& r = row({2, m.executable, e.step, shape_key, ""}, e.start_ns, [&](Average& a) {
      a.kind = "kernel";
      a.name = k.name;
      if (!k.algorithm.empty()) a.name += " [" + k.algorithm.substr(0, k.algorithm.find(' ')) + "]";
      a.sources = join(k.sources);
      a.backend = k.backend;
      if (group_by_shape && p.options.record_shapes) a.shapes = shapes_text(k.input_shapes);
    });
    if (e.kind == Event::Kind::kTask) {
      ++r.tasks;
      continue;
    }
    ++r.calls;
    r.total_ns += dur;
    r.self_ns += self[i];
    r.flops += k.flops_known ? k.flops : 0;
    r.alloc_bytes += k.alloc_bytes;
  }
  // In the order first seen, so that equal keys sort in plan order.
  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return first_seen[a] < first_seen[b]; });
  std::vector<Average> out;
  for (size_t i : order) out.push_back(std::move(rows[i]));
  return out;
}

double fma_peak_gflops(int threads) {
  return fma_ceiling().gflops * threads;
}

namespace {

std::string format_time(double ns) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(3);
  if (ns >= 1e9)
    os << ns / 1e9 << "s";
  else if (ns >= 1e6)
    os << ns / 1e6 << "ms";
  else
    os << ns / 1e3 << "us";
  return os.str();
}

std::string format_bytes(double b) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  if (b >= 1 << 30)
    os << b / (1 << 30) << " GiB";
  else if (b >= 1 << 20)
    os << b / (1 << 20) << " MiB";
  else if (b >= 1 << 10)
    os << b / (1 << 10) << " KiB";
  else
    os << b << " B";
  return os.str();
}

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << v;
  return os.str();
}

std::string clip(const std::string& s, size_t width) {
  return s.size() <= width ? s : s.substr(0, width - 3) + "...";
}

// The sort key of a row, larger first (the name: alphabetical).
double sort_value(const Average& a, const std::string& key) {
  if (key == "self") return static_cast<double>(a.self_ns);
  if (key == "total") return static_cast<double>(a.total_ns);
  if (key == "avg") return a.calls ? static_cast<double>(a.total_ns) / a.calls : 0;
  if (key == "calls") return static_cast<double>(a.calls);
  if (key == "flops") return a.flops;
  if (key == "gflops") return a.total_ns ? a.flops / a.total_ns : 0;
  if (key == "alloc") return static_cast<double>(a.alloc_bytes);
  return 0;
}

std::string canonical_sort_key(const std::string& k) {
  static const std::map<std::string, std::string> keys = {
      {"self", "self"},
      {"self_time_total", "self"},
      {"self_cpu_time_total", "self"},
      {"total", "total"},
      {"time_total", "total"},
      {"cpu_time_total", "total"},
      {"avg", "avg"},
      {"cpu_time", "avg"},
      {"calls", "calls"},
      {"count", "calls"},
      {"flops", "flops"},
      {"gflops", "gflops"},
      {"alloc", "alloc"},
      {"self_cpu_memory_usage", "alloc"},
      {"cpu_memory_usage", "alloc"},
      {"name", "name"},
  };
  auto it = keys.find(k);
  if (it != keys.end()) return it->second;
  for (const char* device : {"cuda", "npu", "device", "xpu"}) {
    if (k.find(device) != std::string::npos) {
      throw ValueError(cat("profiler table: sort_by '", k,
                           "' is a device time; PyPTO runs models on the CPU cores, so sort by "
                           "self_time_total or cpu_time_total"));
    }
  }
  std::string all;
  for (const auto& [name, _] : keys) all += (all.empty() ? "" : ", ") + name;
  throw ValueError(cat("profiler table: unknown sort_by '", k, "' (one of: ", all, ")"));
}

}  // namespace

std::string table(const Profile& p, const std::vector<Average>& rows_in,
                  const TableOptions& options) {
  const std::string key = canonical_sort_key(options.sort_by);
  std::vector<Average> rows = rows_in;
  if (key == "name")
    std::stable_sort(rows.begin(), rows.end(),
                     [](const Average& a, const Average& b) { return a.name < b.name; });
  else
    std::stable_sort(rows.begin(), rows.end(), [&](const Average& a, const Average& b) {
      return sort_value(a, key) > sort_value(b, key);
    });
  int64_t self_sum = 0;
  for (const Average& a : rows) self_sum += a.self_ns;
  const bool shapes =
      std::any_of(rows.begin(), rows.end(), [](const Average& a) { return !a.shapes.empty(); });
  const bool memory = p.options.profile_memory;
  const bool peak = options.peak_gflops > 0;

  std::vector<std::string> head = {"Name", "Self %", "Self total", "Total", "Avg", "Calls"};
  if (shapes) head.push_back("Input Shapes");
  if (memory) head.push_back("Alloc");
  head.push_back("GFLOP/s");
  if (peak) head.push_back("% FMA peak");
  head.push_back("Source ops");
  std::vector<std::vector<std::string>> cells;
  const size_t limit = options.row_limit > 0 ? static_cast<size_t>(options.row_limit) : SIZE_MAX;
  for (size_t i = 0; i < rows.size() && i < limit; ++i) {
    const Average& a = rows[i];
    std::vector<std::string> c = {
        clip(a.name, 48),
        fixed(self_sum ? 100.0 * static_cast<double>(a.self_ns) / self_sum : 0, 2) + "%",
        format_time(static_cast<double>(a.self_ns)),
        format_time(static_cast<double>(a.total_ns)),
        format_time(a.calls ? static_cast<double>(a.total_ns) / a.calls : 0),
        cat(a.calls)};
    if (shapes) c.push_back(clip(a.shapes, 48));
    if (memory) c.push_back(a.kind == "kernel" ? format_bytes(double(a.alloc_bytes)) : "");
    const double gflops = a.flops > 0 && a.total_ns > 0 ? a.flops / a.total_ns : 0;
    c.push_back(gflops > 0 ? fixed(gflops, 1) : "");
    if (peak) c.push_back(gflops > 0 ? fixed(100 * gflops / options.peak_gflops, 1) + "%" : "");
    c.push_back(clip(a.sources, 60));
    cells.push_back(std::move(c));
  }
  std::vector<size_t> width(head.size());
  for (size_t j = 0; j < head.size(); ++j) {
    width[j] = head[j].size();
    for (const auto& c : cells) width[j] = std::max(width[j], c[j].size());
  }
  std::string rule;
  for (size_t j = 0; j < head.size(); ++j) rule += std::string(width[j], '-') + "  ";
  rule.resize(rule.size() - 2);
  auto line = [&](const std::vector<std::string>& c) {
    std::string out;
    for (size_t j = 0; j < c.size(); ++j) {
      const bool left = j == 0 || head[j] == "Input Shapes" || head[j] == "Source ops";
      const std::string pad(width[j] - c[j].size(), ' ');
      out += left ? c[j] + (j + 1 < c.size() ? pad : "") : pad + c[j];
      if (j + 1 < c.size()) out += "  ";
    }
    return out + "\n";
  };
  std::string out = rule + "\n" + line(head) + rule + "\n";
  for (const auto& c : cells) out += line(c);
  out += rule + "\n";
  out += cat("Self time total: ", format_time(static_cast<double>(self_sum)));
  if (rows.size() > limit) out += cat(" (", rows.size() - limit, " more rows not shown)");
  out += "\n";
  int64_t calls = 0, wall = 0;
  for (const Event& e : p.events)
    if (e.kind == Event::Kind::kCall) {
      ++calls;
      wall += e.end_ns - e.start_ns;
    }
  if (calls)
    out += cat("Calls: ", calls, ", ", format_time(static_cast<double>(wall)), " in all, ",
               format_time(static_cast<double>(wall) / calls), " each; threads: ", p.pool_threads,
               "\n");
  if (peak) out += cat("FMA peak: ", fixed(options.peak_gflops, 1), " GFLOP/s\n");
  if (memory)
    for (const ModelInfo& m : p.models)
      out +=
          cat("Memory (", m.name.empty() ? "model" : m.name, m.input_shapes.empty() ? "" : " ",
              shapes_text(m.input_shapes), "): planned peak ", format_bytes(double(m.peak_bytes)),
              m.memory_planned ? " (arena)" : " (no plan: every intermediate on its own)",
              ", live peak ", format_bytes(double(m.live_peak_bytes)), "\n");
  return out;
}

}  // namespace pto::profiler
