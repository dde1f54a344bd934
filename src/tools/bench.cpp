// `pto bench`: time a model the way trtexec does — warm-up runs, then timed iterations reported as
// latency percentiles, throughput and peak memory — and, with --compare onnxruntime, ONNX
// Runtime's numbers for the same model, inputs and threads, measured in the same run by a child
// Python process (the project's venv, or PTO_PYTHON).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "cli.h"
#include "inputs.h"
#include "pto/executable.h"
#include "pto/npy.h"
#include "pto/onnx.h"
#include "pto/parallel.h"
#include "pto/progress.h"
#include "run_util.h"

namespace pto::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* kUsage =
    "usage: pto bench model.onnx [--batch N] [--threads T] [--level L] [--precision P]\n"
    "                 [--matmul-precision M] [--conv-precision M] [--warmup W]\n"
    "                 [--iterations I] [--compare onnxruntime]\n"
    "                 [--input NAME=FILE.npy ...] [--dim SYMBOL=VALUE ...] [--seed N]\n"
    "\n"
    "Times the compiled model: W warm-up runs, then I timed runs, reported as latency (mean,\n"
    "min, p50, p90, p99, max), throughput (inferences per second: runs per second x batch) and\n"
    "peak memory (the planned arena of intermediates, and the process's peak resident set).\n"
    "A progress bar shows on a terminal.\n"
    "\n"
    "options:\n"
    "  --batch N              set the batch (dimension 0 of every input whose dimension 0 is\n"
    "                         symbolic) to N; an error if an input's batch is fixed and differs\n"
    "  --threads T            run kernels on T threads (default: PTO_NUM_THREADS, else the cores\n"
    "                         this process may use)\n"
    "  --level L              optimization level 0..3 (default 2)\n"
    "  --no-tune-cache        ignore the tuning cache: the planner's knobs only\n"
    "  --precision P          f32, bf16 or f16: bf16/f16 computes the matrix products on\n"
    "                         operands rounded to it, with fp32 accumulation, the rest fp32\n"
    "                         (docs/precision.md); default f32\n"
    "  --matmul-precision M   highest, high or medium, as torch.set_float32_matmul_precision:\n"
    "                         high computes fp32 MatMul/Gemm as three bf16 products of the\n"
    "                         operands' heads and tails (bf16x3, ~1e-5 relative error) where\n"
    "                         the CPU has AMX-BF16, medium as bf16 products (docs/precision.md)\n"
    "  --conv-precision M     the same for fp32 Conv (not depthwise), as torch.backends.mkldnn.\n"
    "                         conv.fp32_precision (ieee, tf32, bf16: highest, high, medium)\n"
    "  --warmup W             untimed runs first (default 10)\n"
    "  --iterations I         timed runs (default 100)\n"
    "  --compare onnxruntime  also time ONNX Runtime (CPU, ORT_ENABLE_ALL, T intra-op threads)\n"
    "                         on the same inputs, in a child process of the project's Python:\n"
    "                         $PTO_PYTHON, else $PTO_VENV/bin/python (default venv\n"
    "                         ~/.cache/pypto/venv), else python3 on PATH\n"
    "  --input, --dim, --seed the inputs, as for 'pto run' (random by default)\n";

struct Options {
  std::string model;
  InputSpec inputs;
  std::optional<int64_t> batch;
  int level = 2;
  CompileOptions precision;  // --precision: auto_mixed_precision and mixed_precision
  int64_t warmup = 10, iterations = 100;
  std::string compare;
};

std::optional<Options> parse(const std::vector<std::string>& args) {
  Options o;
  ArgReader a(args, "bench");
  while (a.next()) {
    if (a.is_help()) {
      std::cout << kUsage;
      return std::nullopt;
    } else if (read_input_option(a, o.inputs)) {
    } else if (a.is("--batch")) {
      o.batch = a.int_value(1, 1 << 30);
    } else if (a.is("--threads")) {
      set_num_threads(static_cast<int>(a.int_value(1, 4096)));
    } else if (a.is("--level")) {
      o.level = static_cast<int>(a.int_value(0, 3));
    } else if (read_tune_cache_option(a)) {
    } else if (read_precision_option(a, o.precision)) {
    } else if (a.is("--warmup")) {
      o.warmup = a.int_value(0, 1000000);
    } else if (a.is("--iterations")) {
      o.iterations = a.int_value(1, 10000000);
    } else if (a.is("--compare")) {
      o.compare = a.value();
      if (o.compare != "onnxruntime")
        a.fail(cat("--compare supports onnxruntime, got '", o.compare, "'"));
    } else if (a.positional() && o.model.empty()) {
      o.model = a.arg();
    } else {
      a.unknown();
    }
  }
  if (o.model.empty()) a.fail("no model file given");
  return o;
}

// --batch N binds every input's symbolic dimension 0 to N (through --dim) and checks fixed ones.
void bind_batch(const Graph& g, int64_t batch, InputSpec& spec) {
  for (ValueId v : g.inputs()) {
    const Value& in = g.value(v);
    if (!in.type.shape || in.type.shape->empty()) continue;
    const Dim& d = (*in.type.shape)[0];
    if (d.is_symbolic()) {
      auto [it, added] = spec.dims.emplace(d.symbol, batch);
      if (!added && it->second != batch)
        throw UsageError(
            cat("--batch ", batch, " and --dim ", d.symbol, "=", it->second, " disagree"), "bench");
    } else if (d.is_known() && d.value != batch) {
      throw ValueError(cat("--batch ", batch, ": input '", in.name, "' has a fixed batch of ",
                           d.value, " (dimension 0 of ", in.type.str(),
                           "); only a model with a symbolic batch dimension can be rebound"));
    }
  }
}

struct Latency {
  double mean = 0, min = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

Latency summarize_times(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  Latency l;
  double sum = 0;
  for (double x : ms) sum += x;
  const size_t n = ms.size();
  auto pct = [&](double q) {  // nearest rank
    size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(n)));
    return ms[std::clamp<size_t>(rank, 1, n) - 1];
  };
  l.mean = sum / static_cast<double>(n);
  l.min = ms.front();
  l.max = ms.back();
  l.p50 = pct(0.50);
  l.p90 = pct(0.90);
  l.p99 = pct(0.99);
  return l;
}

std::string fixed(double x, int digits = 3) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << x;
  return os.str();
}

// Milliseconds with at least four significant digits (0.03621, 1.234, 61.230).
std::string ms(double x) {
  const int digits = x > 0 ? std::max(3, 3 - static_cast<int>(std::floor(std::log10(x)))) : 3;
  return fixed(x, std::min(digits, 9));
}

std::string mib(double bytes) {
  return fixed(bytes / (1024.0 * 1024.0), 2) + " MiB";
}

void print_timing(const Latency& l, size_t runs, int64_t batch) {
  std::cout << "latency:    mean " << ms(l.mean) << " ms, min " << ms(l.min) << ", p50 "
            << ms(l.p50) << ", p90 " << ms(l.p90) << ", p99 " << ms(l.p99) << ", max " << ms(l.max)
            << " (" << runs << " runs)\n"
            << "throughput: " << fixed(1000.0 * static_cast<double>(batch) / l.mean, 1)
            << " inferences/s (" << fixed(1000.0 / l.mean, 1) << " runs/s x batch " << batch
            << ")\n";
}

// The Python the project uses (scripts/common.sh): $PTO_PYTHON, else the venv's, else python3.
std::string project_python() {
  if (const char* p = std::getenv("PTO_PYTHON"); p && *p) return p;
  std::string venv;
  if (const char* v = std::getenv("PTO_VENV"); v && *v)
    venv = v;
  else if (const char* h = std::getenv("HOME"); h && *h)
    venv = cat(h, "/.cache/pypto/venv");
  if (!venv.empty() && fs::exists(venv + "/bin/python")) return venv + "/bin/python";
  return "python3";
}

// Runs argv with stdout captured (stderr passes through, for the child's progress bar).
std::pair<int, std::string> run_capture(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) throw ValueError("--compare: cannot create a pipe");
  const pid_t pid = fork();
  if (pid < 0) throw ValueError("--compare: cannot start a process");
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const std::string& s : argv) args.push_back(const_cast<char*>(s.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, out};
}

// The child: ONNX Runtime on the inputs saved in argv[1] (in<i>.npy, names.txt), printing one
// "key value..." line per result.
const char* kOrtScript = R"PY(
import os, resource, sys, time
folder, model = sys.argv[1], sys.argv[2]
threads, warmup, iterations, bar = (int(x) for x in sys.argv[3:7])
try:
    import numpy as np
    import onnxruntime as ort
except ImportError as e:
    print(f"error {e.name or e} is not installed for {sys.executable}")
    sys.exit(3)
def progress(label, done, total):
    if bar and total:
        n = 30 * done // total
        sys.stderr.write(f"\r{label} [{'#' * n}{' ' * (30 - n)}] {done}/{total}")
        sys.stderr.flush()
        if done == total:
            sys.stderr.write("\r" + " " * (len(label) + 60) + "\r")
try:
    with open(os.path.join(folder, "names.txt"), encoding="utf-8") as f:
        names = f.read().split("\n")[:-1]
    feeds = {n: np.load(os.path.join(folder, f"in{i}.npy")) for i, n in enumerate(names)}
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    t0 = time.perf_counter()
    for i in range(warmup):
        sess.run(None, feeds)
        progress("onnxruntime warm-up", i + 1, warmup)
    warm_ms = (time.perf_counter() - t0) * 1e3
    times = []
    for i in range(iterations):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
        progress("onnxruntime", i + 1, iterations)
except Exception as e:
    print("error onnxruntime: " + " ".join(str(e).split()))
    sys.exit(4)
print("version", ort.__version__)
print("warmup_ms", warm_ms)
print("times_ms", *times)
print("peak_rss_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
)PY";

struct PeerResult {
  std::string version;
  double warmup_ms = 0;
  std::vector<double> times;
  double peak_rss_kib = 0;
};

PeerResult run_onnxruntime(const Options& o, const Graph& g, const std::vector<Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].is_tensor())  // the peer script hands ONNX Runtime .npy tensors only
      throw UnsupportedError(
          cat("--compare onnxruntime: input '", g.value(g.inputs()[i]).name, "' is a ",
              inputs[i].kind() == ValueKind::kNone ? "empty optional" : "sequence",
              "; the comparison feeds tensors only (time PyPTO alone)"));
  char tmpl[] = "/tmp/pto_bench_XXXXXX";
  if (!mkdtemp(tmpl)) throw ValueError("--compare: cannot create a temporary folder");
  const fs::path dir = tmpl;
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{dir};
  {
    std::ofstream names(dir / "names.txt");
    for (size_t i = 0; i < inputs.size(); ++i) {
      names << g.value(g.inputs()[i]).name << "\n";
      write_npy((dir / cat("in", i, ".npy")).string(), inputs[i]);
    }
    std::ofstream(dir / "ort_bench.py") << kOrtScript;
  }
  const std::string python = project_python();
  auto [rc, out] = run_capture({python, (dir / "ort_bench.py").string(), dir.string(),
                                fs::absolute(o.model).string(), cat(num_threads()), cat(o.warmup),
                                cat(o.iterations), isatty(STDERR_FILENO) == 1 ? "1" : "0"});
  if (rc == 127)
    throw ValueError(cat("--compare onnxruntime: cannot run Python '", python,
                         "' (set PTO_PYTHON, or create the venv with 'bash scripts/setup.sh')"));
  PeerResult r;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "error") {
      std::string rest;
      std::getline(ls, rest);
      throw ValueError(cat("--compare onnxruntime:", rest,
                           rc == 3 ? " (install it with 'bash scripts/setup.sh', or point "
                                     "PTO_PYTHON at a Python that has it)"
                                   : ""));
    }
    if (key == "version") ls >> r.version;
    if (key == "warmup_ms") ls >> r.warmup_ms;
    if (key == "peak_rss_kib") ls >> r.peak_rss_kib;
    if (key == "times_ms")
      for (double t; ls >> t;) r.times.push_back(t);
  }
  if (rc != 0 || r.times.size() != static_cast<size_t>(o.iterations))
    throw ValueError(
        cat("--compare onnxruntime: the child process (", python, ") failed with exit code ", rc));
  return r;
}

int bench_main(const std::vector<std::string>& args) {
  auto opts = parse(args);
  if (!opts) return 0;
  Options o = *opts;
  Graph g = onnx::load(o.model);
  if (o.batch) bind_batch(g, *o.batch, o.inputs);
  std::vector<Tensor> inputs = make_inputs(g, o.inputs);
  int64_t batch = o.batch.value_or(1);
  if (!o.batch)
    for (const Tensor& t : inputs)
      if (t.rank() > 0) {
        batch = t.shape()[0];
        break;
      }

  auto t0 = Clock::now();
  Executable exe = compile(g, {.level = o.level,
                               .auto_mixed_precision = o.precision.auto_mixed_precision,
                               .mixed_precision = o.precision.mixed_precision,
                               .matmul_precision = o.precision.matmul_precision,
                               .conv_precision = o.precision.conv_precision});
  const double compile_ms = ms_since(t0);
  std::cout << "model:      " << o.model << ", level " << o.level << ", " << num_threads()
            << " threads, batch " << batch << " (compiled in " << format_ms(compile_ms) << ")\n";

  t0 = Clock::now();
  {
    ProgressBar bar("warm-up", 0.0);
    for (int64_t i = 0; i < o.warmup; ++i) {
      exe.run(inputs);
      bar.update(static_cast<size_t>(i + 1), static_cast<size_t>(o.warmup));
    }
  }
  const double warm_ms = ms_since(t0);
  std::vector<double> times;
  {
    ProgressBar bar("pypto", 0.0);
    for (int64_t i = 0; i < o.iterations; ++i) {
      auto t = Clock::now();
      exe.run(inputs);
      times.push_back(ms_since(t));
      bar.update(static_cast<size_t>(i + 1), static_cast<size_t>(o.iterations));
    }
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const ExecutableStats st = exe.stats();
  const Latency mine = summarize_times(times);
  std::cout << "warm-up:    " << o.warmup << " runs in " << format_ms(warm_ms) << "\n";
  print_timing(mine, times.size(), batch);
  std::cout << "memory:     arena " << mib(static_cast<double>(st.peak_bytes))
            << (st.memory_planned ? " planned" : " (not planned at this level)")
            << " (intermediates unplanned: " << mib(static_cast<double>(st.unplanned_peak_bytes))
            << "), weights " << mib(static_cast<double>(st.weight_bytes + st.packed_weight_bytes))
            << " (constants and packed copies)"
            << ", process peak RSS " << mib(static_cast<double>(ru.ru_maxrss) * 1024.0) << "\n";

  if (o.compare == "onnxruntime") {
    const PeerResult peer = run_onnxruntime(o, g, inputs);
    const Latency theirs = summarize_times(peer.times);
    std::cout << "onnxruntime " << peer.version << " (CPU, ORT_ENABLE_ALL, " << num_threads()
              << " intra-op threads, same inputs):\n"
              << "warm-up:    " << o.warmup << " runs in " << format_ms(peer.warmup_ms) << "\n";
    print_timing(theirs, peer.times.size(), batch);
    std::cout << "memory:     process peak RSS " << mib(peer.peak_rss_kib * 1024.0) << "\n"
              << "ratio:      pypto p50 is " << fixed(theirs.p50 / mine.p50, 2)
              << "x onnxruntime's speed (p50 " << ms(mine.p50) << " ms vs " << ms(theirs.p50)
              << " ms)\n";
  }
  return 0;
}

}  // namespace

Command bench_command() {
  return {"bench", "Time a model: latency percentiles, throughput, memory; against ONNX Runtime.",
          kUsage, bench_main};
}

}  // namespace pto::cli
