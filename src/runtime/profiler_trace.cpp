// The profile as pictures: a Chrome/Perfetto trace (Trace Event Format, JSON object form) and an
// SVG timeline (include/pto/profiler.h).
//
// Trace: one process; per thread a track (tid = thread index + 1) with its thread_name. Calls and
// ranges are B/E pairs, kernels and tile tasks X slices; each thread's events are written in time
// order, an E as soon as the next event starts at or after it, so B/E nest and timestamps never
// go back on a track. A flow arrow (s on the producer's slice, f with bp "e" on the consumer's)
// joins each kernel to the kernels of the same call that read its outputs. With profile_memory a
// "memory" counter gives the planned live bytes and the arena's top at the start of each kernel.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "pto/error.h"
#include "pto/json.h"
#include "pto/profiler.h"

namespace pto::profiler {
namespace {

// Microseconds with three decimals, exact from nanoseconds (no rounding can reorder events).
std::string micros(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(ns % 1000));
  return buf;
}

std::string dims_json(const std::vector<Dims>& shapes) {
  std::string out = "[";
  for (size_t i = 0; i < shapes.size(); ++i) {
    out += i ? ",[" : "[";
    for (size_t j = 0; j < shapes[i].size(); ++j) out += cat(j ? "," : "", shapes[i][j]);
    out += "]";
  }
  return out + "]";
}

void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw ValueError(cat(what, ": cannot open '", path, "' for writing"));
  f << text;
  f.close();
  if (!f) throw ValueError(cat(what, ": writing '", path, "' failed"));
}

const KernelInfo& kernel_of(const Profile& p, const Event& e) {
  return p.models.at(p.calls.at(e.call).model).kernels.at(e.step);
}

}  // namespace

std::string chrome_trace(const Profile& p) {
  std::ostringstream os;
  bool first = true;
  auto emit = [&](const std::string& event) {
    os << (first ? "\n" : ",\n") << event;
    first = false;
  };
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  emit(R"({"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"PyPTO"}})");
  for (size_t t = 0; t < p.threads.size(); ++t) {
    emit(cat(R"({"ph":"M","name":"thread_name","pid":1,"tid":)", t + 1, R"(,"args":{"name":)",
             json_string(p.threads[t]), "}}"));
    emit(cat(R"({"ph":"M","name":"thread_sort_index","pid":1,"tid":)", t + 1,
             R"(,"args":{"sort_index":)", t, "}}"));
  }

  // Flows: kernel events by (call, step), then an id per edge.
  std::map<std::pair<int32_t, int32_t>, size_t> kernel_event;
  for (size_t i = 0; i < p.events.size(); ++i)
    if (p.events[i].kind == Event::Kind::kKernel)
      kernel_event[{p.events[i].call, p.events[i].step}] = i;
  std::vector<std::vector<int64_t>> flows_out(p.events.size()), flows_in(p.events.size());
  int64_t next_flow = 1;
  for (const auto& [key, i] : kernel_event)
    for (int32_t to : kernel_of(p, p.events[i]).consumers) {
      auto it = kernel_event.find({key.first, to});
      if (it == kernel_event.end()) continue;
      flows_out[i].push_back(next_flow);
      flows_in[it->second].push_back(next_flow++);
    }

  std::vector<size_t> open;  // B events of this thread not ended yet
  auto close_until = [&](int64_t ns) {
    while (!open.empty() && p.events[open.back()].end_ns <= ns) {
      const Event& e = p.events[open.back()];
      const int tid = e.thread + 1;
      emit(cat(R"({"ph":"E","pid":1,"tid":)", tid, R"(,"ts":)", micros(e.end_ns), "}"));
      if (e.kind == Event::Kind::kCall && p.options.profile_memory)
        emit(cat(R"({"ph":"C","name":"memory","pid":1,"tid":)", tid, R"(,"ts":)", micros(e.end_ns),
                 R"(,"args":{"live_bytes":0,"arena_top":0}})"));
      open.pop_back();
    }
  };
  for (size_t i = 0; i < p.events.size(); ++i) {
    const Event& e = p.events[i];
    if (i > 0 && e.thread != p.events[i - 1].thread) close_until(INT64_MAX);
    close_until(e.start_ns);
    const int tid = e.thread + 1;
    const std::string where = cat(R"("pid":1,"tid":)", tid, R"(,"ts":)", micros(e.start_ns));
    if (e.kind == Event::Kind::kRange || e.kind == Event::Kind::kCall) {
      std::string name, args;
      if (e.kind == Event::Kind::kRange) {
        name = p.labels[e.label];
      } else {
        const Call& c = p.calls[e.call];
        const ModelInfo& m = p.models[c.model];
        name = cat("call ", m.name.empty() ? "model" : m.name);
        args = cat(R"("call":)", e.call, R"(,"input_shapes":)", dims_json(m.input_shapes));
        if (!c.stack.empty()) args += cat(R"(,"stack":)", json_string(c.stack));
      }
      emit(cat(R"({"ph":"B","cat":)", e.kind == Event::Kind::kCall ? "\"call\"" : "\"range\"",
               R"(,"name":)", json_string(name), ",", where, R"(,"args":{)", args, "}}"));
      open.push_back(i);
      continue;
    }
    const KernelInfo& k = kernel_of(p, e);
    const std::string dur = micros(e.end_ns - e.start_ns);
    if (e.kind == Event::Kind::kTask) {
      emit(cat(R"({"ph":"X","cat":"task","name":)", json_string(k.name), ",", where, R"(,"dur":)",
               dur, R"(,"args":{"task":)", e.task, R"(,"step":)", e.step, R"(,"call":)", e.call,
               "}}"));
      continue;
    }
    std::string nodes;
    for (const std::string& n : k.sources) nodes += (nodes.empty() ? "" : ", ") + n;
    std::string args = cat(R"("step":)", e.step, R"(,"call":)", e.call, R"(,"backend":)",
                           json_string(k.backend), R"(,"nodes":)", json_string(nodes));
    if (k.flops_known && k.flops > 0) args += cat(R"(,"flops":)", k.flops);
    if (!k.algorithm.empty()) args += cat(R"(,"algorithm":)", json_string(k.algorithm));
    if (p.options.record_shapes)
      args += cat(R"(,"input_shapes":)", dims_json(k.input_shapes), R"(,"output_shapes":)",
                  dims_json(k.output_shapes));
    if (p.options.profile_memory) args += cat(R"(,"alloc_bytes":)", k.alloc_bytes);
    emit(cat(R"({"ph":"X","cat":"kernel","name":)", json_string(k.name), ",", where, R"(,"dur":)",
             dur, R"(,"args":{)", args, "}}"));
    for (int64_t id : flows_in[i])
      emit(
          cat(R"({"ph":"f","bp":"e","cat":"dependency","name":"data","id":)", id, ",", where, "}"));
    for (int64_t id : flows_out[i])
      emit(cat(R"({"ph":"s","cat":"dependency","name":"data","id":)", id, ",", where, "}"));
    if (p.options.profile_memory)
      emit(cat(R"({"ph":"C","name":"memory",)", where, R"(,"args":{"live_bytes":)", k.live_bytes,
               R"(,"arena_top":)", k.arena_top, "}}"));
  }
  close_until(INT64_MAX);
  os << "\n],\"otherData\":{\"producer\":\"PyPTO profiler\",\"pool_threads\":" << p.pool_threads
     << "}}\n";
  return os.str();
}

void write_chrome_trace(const Profile& p, const std::string& path) {
  write_file(path, chrome_trace(p), "export_chrome_trace");
}

namespace {

// Distinct colors for the kernels that took the most time; the rest share a grey.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                    "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                                    "#9c755f", "#86bcb6", "#d37295", "#a0cbe8"};
constexpr const char* kOther = "#c8c8c8";

std::string xml_text(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

// Three significant digits: "12.3 ms", "0 us", "850 us".
std::string time_label(double ns) {
  const bool ms = ns >= 1e6;
  const double v = ms ? ns / 1e6 : ns / 1e3;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f %s",
                v >= 100 || v == 0 ? 0
                : v >= 10          ? 1
                                   : 2,
                v, ms ? "ms" : "us");
  return buf;
}

}  // namespace

std::string timeline_svg(const Profile& p, int width) {
  if (width < 400 || width > 20000)
    throw ValueError(cat("export_timeline: width must be 400..20000 pixels, got ", width));
  int64_t t0 = INT64_MAX, t1 = 0;
  // Kernels by their total time, for the colors and the legend.
  std::map<std::pair<uint64_t, int32_t>, int64_t> kernel_time;
  std::map<std::pair<uint64_t, int32_t>, std::string> kernel_label;
  for (const Event& e : p.events) {
    t0 = std::min(t0, e.start_ns);
    t1 = std::max(t1, e.end_ns);
    if (e.kind != Event::Kind::kKernel) continue;
    const ModelInfo& m = p.models[p.calls[e.call].model];
    const KernelInfo& k = m.kernels[e.step];
    const std::pair<uint64_t, int32_t> key{m.executable, e.step};
    kernel_time[key] += e.end_ns - e.start_ns;
    kernel_label[key] = k.name + (k.sources.empty() ? "" : " " + k.sources.back());
  }
  if (t0 == INT64_MAX) t0 = t1 = 0;
  std::vector<std::pair<int64_t, std::pair<uint64_t, int32_t>>> ranked;
  for (const auto& [key, ns] : kernel_time) ranked.push_back({ns, key});
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::map<std::pair<uint64_t, int32_t>, const char*> color;
  const size_t colored = std::min(ranked.size(), std::size(kPalette));
  for (size_t i = 0; i < colored; ++i) color[ranked[i].second] = kPalette[i];

  const int left = 130, right = 20, top = 46, row = 34, bar = 22;
  const int rows = static_cast<int>(p.threads.size());
  const double plot = width - left - right;
  const double span = static_cast<double>(std::max<int64_t>(t1 - t0, 1));
  auto x = [&](int64_t ns) { return left + plot * static_cast<double>(ns - t0) / span; };
  const int axis_y = top + rows * row + 6;
  const int legend_y = axis_y + 40;
  const int legend_rows = static_cast<int>((colored + (ranked.size() > colored) + 1) / 2);
  const int height = legend_y + legend_rows * 20 + 16;

  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::string models;
  for (const ModelInfo& m : p.models)
    if (models.find(m.name) == std::string::npos)
      models += (models.empty() ? "" : ", ") + (m.name.empty() ? std::string("model") : m.name);
  os << "<text x=\"" << left << "\" y=\"20\" font-size=\"14\" font-weight=\"bold\">"
     << xml_text(cat("PyPTO profile: ", models, " (", p.calls.size(), " call",
                     p.calls.size() == 1 ? "" : "s", ", ", p.pool_threads, " thread",
                     p.pool_threads == 1 ? "" : "s", ")"))
     << "</text>\n"
     << "<text x=\"" << left << "\" y=\"36\" fill=\"#555\">a box per tile task, colored by "
     << "kernel; the thin bar above it: the kernel step (call in grey)</text>\n";
  for (int t = 0; t < rows; ++t) {
    const int y = top + t * row;
    os << "<text x=\"" << left - 8 << "\" y=\"" << y + bar / 2 + 8 << "\" text-anchor=\"end\">"
       << xml_text(p.threads[t]) << "</text>\n"
       << "<rect x=\"" << left << "\" y=\"" << y << "\" width=\"" << plot << "\" height=\""
       << bar + 6 << "\" fill=\"#f4f4f4\"/>\n";
  }
  for (const Event& e : p.events) {
    if (e.kind == Event::Kind::kRange) continue;
    const int y = top + e.thread * row;
    const double x0 = x(e.start_ns), w = std::max(x(e.end_ns) - x0, 0.6);
    if (e.kind == Event::Kind::kCall) {
      os << "<rect x=\"" << x0 << "\" y=\"" << y << "\" width=\"" << w
         << "\" height=\"2\" fill=\"#777\"/>\n";
      continue;
    }
    const ModelInfo& m = p.models[p.calls[e.call].model];
    auto it = color.find({m.executable, e.step});
    const char* fill = it == color.end() ? kOther : it->second;
    const KernelInfo& k = m.kernels[e.step];
    if (e.kind == Event::Kind::kKernel) {
      os << "<rect x=\"" << x0 << "\" y=\"" << y + 2 << "\" width=\"" << w
         << "\" height=\"4\" fill=\"" << fill << "\"><title>"
         << xml_text(cat(k.name, " (", k.sources.empty() ? "" : k.sources.back(),
                         "): ", time_label(double(e.end_ns - e.start_ns))))
         << "</title></rect>\n";
    } else {
      os << "<rect x=\"" << x0 << "\" y=\"" << y + 8 << "\" width=\"" << w << "\" height=\""
         << bar - 4 << "\" fill=\"" << fill << "\" stroke=\"white\" stroke-width=\"0.3\"/>\n";
    }
  }
  // Time axis: about eight ticks at 1, 2 or 5 times a power of ten.
  const double raw = span / 8;
  const double pow10 = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / pow10 < 2 ? pow10 : raw / pow10 < 5 ? 2 * pow10 : 5 * pow10;
  os << "<line x1=\"" << left << "\" y1=\"" << axis_y << "\" x2=\"" << left + plot << "\" y2=\""
     << axis_y << "\" stroke=\"black\"/>\n";
  for (double t = 0; t <= span; t += step) {
    const double tx = left + plot * t / span;
    os << "<line x1=\"" << tx << "\" y1=\"" << axis_y << "\" x2=\"" << tx << "\" y2=\""
       << axis_y + 5 << "\" stroke=\"black\"/>\n"
       << "<text x=\"" << tx << "\" y=\"" << axis_y + 18 << "\" text-anchor=\"middle\">"
       << time_label(t) << "</text>\n";
  }
  // Legend, two columns.
  auto legend = [&](size_t i, const char* fill, const std::string& text) {
    const double lx = left + (i % 2) * plot / 2;
    const int ly = legend_y + static_cast<int>(i / 2) * 20;
    os << "<rect x=\"" << lx << "\" y=\"" << ly - 10 << "\" width=\"12\" height=\"12\" fill=\""
       << fill << "\"/>\n<text x=\"" << lx + 18 << "\" y=\"" << ly << "\">" << xml_text(text)
       << "</text>\n";
  };
  for (size_t i = 0; i < colored; ++i)
    legend(i, kPalette[i],
           cat(kernel_label[ranked[i].second], ": ", time_label(double(ranked[i].first))));
  if (ranked.size() > colored) {
    int64_t rest = 0;
    for (size_t i = colored; i < ranked.size(); ++i) rest += ranked[i].first;
    legend(colored, kOther,
           cat(ranked.size() - colored, " other kernels: ", time_label(double(rest))));
  }
  os << "</svg>\n";
  return os.str();
}

void write_timeline_svg(const Profile& p, const std::string& path, int width) {
  write_file(path, timeline_svg(p, width), "export_timeline");
}

}  // namespace pto::profiler
