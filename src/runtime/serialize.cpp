// Saved compiled models (include/pto/serialize.h).
//
// Layout, little-endian:
//   "PTOMODEL"  u32 format  u32 flags (0)  u64 payload bytes  u64 checksum of the payload
//   payload: header (PyPTO version, ISA and CPU features, threads, compile options, metadata),
//            the optimized graph (values with inputs first, initializers with their data,
//            nodes, outputs, symbol ranges), the kernel partition, the pass report.
// Strings and lists carry their length first; every read is bounds-checked against the payload
// and every count against the bytes left, so a damaged file is a ValueError, never a crash or a
// huge allocation. The format and the checksum are checked before anything is parsed, the ISA
// before the graph is built.
#include "pto/serialize.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "pto/device_info.h"
#include "pto/parallel.h"

#ifndef PTO_VERSION
#define PTO_VERSION "unknown"
#endif

namespace pto {
namespace {

static_assert(std::endian::native == std::endian::little, "saved models are little-endian");

constexpr char kMagic[8] = {'P', 'T', 'O', 'M', 'O', 'D', 'E', 'L'};
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;

// ---- writing ----

class Writer {
 public:
  template <class T>
  void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void str(std::string_view s) {
    pod<uint64_t>(s.size());
    out_.append(s);
  }
  template <class T>
  void pods(const std::vector<T>& v) {
    pod<uint64_t>(v.size());
    for (const T& x : v) pod<T>(x);
  }
  void bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

void write_tensor(Writer& w, const Tensor& t) {
  PTO_CHECK(t.defined()) << "saving an undefined tensor";
  const Tensor c = t.contiguous();
  w.str(dtype_name(c.dtype()));
  w.pods<int64_t>(c.shape());
  // The 4- and 2-bit types are packed as in ONNX (one element per byte in memory).
  const size_t n = packed_nbytes(c.dtype(), c.numel());
  w.pod<uint64_t>(n);
  if (n == c.nbytes()) {
    w.bytes(c.raw_data(), n);
  } else {
    std::string packed(n, '\0');
    pack_elements(c.dtype(), c.raw_data(), c.numel(), reinterpret_cast<uint8_t*>(packed.data()));
    w.bytes(packed.data(), n);
  }
}

std::vector<ValueId> write_graph(Writer& w, const Graph& g);

// The variant's index first; the order of pto::Attribute's alternatives is part of the format.
// A subgraph (format 2 on) is its number of captures and the graph.
void write_attribute(Writer& w, const Attribute& a) {
  w.pod<uint8_t>(static_cast<uint8_t>(a.index()));
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>) {
          w.pod<T>(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          w.str(v);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                             std::is_same_v<T, std::vector<double>>) {
          w.pods(v);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          w.pod<uint64_t>(v.size());
          for (const std::string& s : v) w.str(s);
        } else if constexpr (std::is_same_v<T, GraphAttr>) {
          PTO_CHECK(v != nullptr) << "saving an empty subgraph";
          w.pod<int32_t>(v->num_captures);
          write_graph(w, *v);
        } else {
          write_tensor(w, v);
        }
      },
      a);
}

// The flag byte after the dtype: whether a shape follows, and the kind of value (format 3).
constexpr uint8_t kHasShape = 1, kSequence = 2, kOptional = 4;

void write_type(Writer& w, const TensorType& t) {
  w.str(dtype_name(t.dtype));
  w.pod<uint8_t>((t.shape ? kHasShape : 0) | (t.sequence ? kSequence : 0) |
                 (t.optional ? kOptional : 0));
  if (!t.shape) return;
  w.pod<uint64_t>(t.shape->size());
  for (const Dim& d : *t.shape) {
    w.pod<int64_t>(d.value);
    w.str(d.symbol);
  }
}

// Values are renumbered with the graph inputs first, in input order, so that loading can add
// them with Graph::add_input and every other value with add_value; returns old id -> new id.
std::vector<ValueId> write_graph(Writer& w, const Graph& g) {
  const size_t nv = g.values().size();
  std::vector<ValueId> order, id(nv, kNoValue);
  for (ValueId v : g.inputs()) {
    id[v] = static_cast<ValueId>(order.size());
    order.push_back(v);
  }
  for (ValueId v = 0; v < static_cast<ValueId>(nv); ++v)
    if (id[v] == kNoValue) {
      id[v] = static_cast<ValueId>(order.size());
      order.push_back(v);
    }
  auto ids = [&](const std::vector<ValueId>& vs) {
    std::vector<int32_t> out;
    for (ValueId v : vs) out.push_back(v == kNoValue ? kNoValue : id[v]);
    return out;
  };
  w.str(g.name);
  w.pod<int32_t>(g.opset);
  w.pod<uint64_t>(g.symbol_ranges.size());
  for (const auto& [symbol, r] : g.symbol_ranges) {
    w.str(symbol);
    w.pod<int64_t>(r.min);
    w.pod<int64_t>(r.max);
  }
  w.pod<uint64_t>(nv);
  w.pod<uint64_t>(g.inputs().size());
  for (ValueId v : order) {
    w.str(g.value(v).name);
    write_type(w, g.value(v).type);
  }
  // Initializers in value order, so that the same graph always gives the same bytes.
  std::vector<ValueId> inits;
  for (const auto& [v, t] : g.initializers()) inits.push_back(v);
  std::sort(inits.begin(), inits.end());
  w.pod<uint64_t>(inits.size());
  for (ValueId v : inits) {
    w.pod<int32_t>(id[v]);
    write_tensor(w, *g.initializer(v));
  }
  w.pod<uint64_t>(g.nodes().size());
  for (const Node& n : g.nodes()) {
    w.str(n.op);
    w.str(n.domain);
    w.pod<int32_t>(n.opset);
    w.str(n.name);
    w.pods<int32_t>(ids(n.inputs));
    w.pods<int32_t>(ids(n.outputs));
    w.pod<uint64_t>(n.attrs.all().size());
    for (const auto& [name, a] : n.attrs.all()) {
      w.str(name);
      write_attribute(w, a);
    }
  }
  w.pods<int32_t>(ids(g.outputs()));
  return id;
}

void write_partition(Writer& w, const KernelPartition& p, const std::vector<ValueId>& id) {
  auto ids = [&](const std::vector<ValueId>& vs) {
    std::vector<int32_t> out;
    for (ValueId v : vs) out.push_back(v == kNoValue ? kNoValue : id[v]);
    return out;
  };
  w.pod<uint64_t>(p.kernels.kernels.size());
  for (size_t k = 0; k < p.kernels.kernels.size(); ++k) {
    const KernelGroup& g = p.kernels.kernels[k];
    w.pods<int32_t>(g.nodes);
    w.str(g.rule);
    w.pod<int32_t>(g.anchor);
    w.pods<int32_t>(ids(g.inputs));
    w.pods<int32_t>(ids(g.outputs));
    w.pods<int32_t>(p.leading[k]);
    w.pods<int32_t>(p.trailing[k]);
  }
}

void write_options(Writer& w, const CompileOptions& o) {
  w.pod<int32_t>(o.level);
  w.pod<uint8_t>(o.memory_optimization);
  w.pod<uint8_t>(o.release_packed_weights);
  w.pod<uint8_t>(o.concurrent_kernels);
  w.pod<uint64_t>(o.tiles.size());
  for (const auto& [name, shape] : o.tiles) {
    w.str(name);
    w.pods<int64_t>(shape);
  }
}

// What the kernels of `isa` need of the CPU (device_info.cpp's choose_isa asks the same).
std::vector<std::string> features_of(const std::string& isa) {
  if (isa == "avx512") return {"avx2", "fma", "avx512f", "avx512bw", "avx512vl"};
  if (isa == "avx2") return {"avx2", "fma"};
  return {};
}

bool has_feature(const DeviceInfo& d, const std::string& f) {
  for (const auto& [name, on] : extension_flags(d))
    if (name == f) return on;
  return false;  // a feature this PyPTO does not know: the CPU cannot be shown to have it
}

// ---- reading ----

class Reader {
 public:
  Reader(std::string_view bytes, const std::string& where) : p_(bytes), where_(where) {}

  [[noreturn]] void corrupt(const std::string& what) const {
    throw ValueError(cat(where_, ": corrupt saved model: ", what, " (at byte ", kHeaderBytes + pos_,
                         " of the payload's ", p_.size(), ")"));
  }
  template <class T>
  T pod() {
    T v;
    need(sizeof(T), "a number");
    std::memcpy(&v, p_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // A count of items that take at least `min_item_bytes` each: no more than the bytes left hold.
  size_t count(size_t min_item_bytes = 1) {
    const auto n = pod<uint64_t>();
    if (n > (p_.size() - pos_) / std::max<size_t>(min_item_bytes, 1))
      corrupt(cat("a count of ", n, " items that the file cannot hold"));
    return static_cast<size_t>(n);
  }
  std::string str() {
    const size_t n = count();
    std::string s(p_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  template <class T>
  std::vector<T> pods() {
    const size_t n = count(sizeof(T));
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), p_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  const char* take(size_t n) {
    need(n, "data");
    const char* at = p_.data() + pos_;
    pos_ += n;
    return at;
  }
  bool done() const { return pos_ == p_.size(); }

 private:
  void need(size_t n, const char* what) const {
    if (n > p_.size() - pos_) corrupt(cat(what, " runs past the end"));
  }
  std::string_view p_;
  size_t pos_ = 0;
  const std::string& where_;
};

DType read_dtype(Reader& r) {
  const std::string name = r.str();
  try {
    return dtype_from_name(name);
  } catch (const Error&) {
    r.corrupt(cat("unknown dtype '", name, "'"));
  }
}

Tensor read_tensor(Reader& r) {
  const DType dt = read_dtype(r);
  if (dt == DType::kUndefined) r.corrupt("a tensor of undefined dtype");
  const Dims shape = r.pods<int64_t>();
  const auto nbytes = r.pod<uint64_t>();
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && numel > INT64_MAX / d)) r.corrupt("a tensor with a bad shape");
    numel *= d;
  }
  // numel <= 4 * nbytes (2-bit types hold 4 per byte) first, so that packed_nbytes cannot overflow.
  if (static_cast<uint64_t>(numel) / 4 > nbytes || nbytes != packed_nbytes(dt, numel))
    r.corrupt(cat("a ", dtype_name(dt), dims_str(shape), " tensor of ", nbytes, " bytes"));
  const char* data = r.take(nbytes);
  Tensor t = Tensor::empty(dt, shape);
  if (nbytes) unpack_elements(dt, reinterpret_cast<const uint8_t*>(data), numel, t.raw_data());
  return t;
}

Graph read_graph(Reader& r);

Attribute read_attribute(Reader& r) {
  switch (r.pod<uint8_t>()) {
    case 0:
      return r.pod<int64_t>();
    case 1:
      return r.pod<double>();
    case 2:
      return r.str();
    case 3:
      return r.pods<int64_t>();
    case 4:
      return r.pods<double>();
    case 5: {
      std::vector<std::string> v(r.count(8));
      for (std::string& s : v) s = r.str();
      return v;
    }
    case 6:
      return read_tensor(r);
    case 7: {
      const auto captures = r.pod<int32_t>();
      Graph g = read_graph(r);
      if (captures < 0 || static_cast<size_t>(captures) > g.inputs().size())
        r.corrupt(cat("a subgraph with ", captures, " captures"));
      g.num_captures = captures;
      return std::make_shared<const Graph>(std::move(g));
    }
    default:
      r.corrupt("an attribute of unknown kind");
  }
}

TensorType read_type(Reader& r) {
  TensorType t;
  t.dtype = read_dtype(r);
  const auto flags = r.pod<uint8_t>();
  if (flags & ~(kHasShape | kSequence | kOptional)) r.corrupt(cat("a type with flags ", +flags));
  t.sequence = (flags & kSequence) != 0;
  t.optional = (flags & kOptional) != 0;
  if (!(flags & kHasShape)) return t;
  Shape s(r.count(16));
  for (Dim& d : s) {
    d.value = r.pod<int64_t>();
    d.symbol = r.str();
    if (d.value < -1) r.corrupt("a negative dimension");
  }
  t.shape = std::move(s);
  return t;
}

std::vector<ValueId> read_ids(Reader& r, size_t nv) {
  std::vector<ValueId> ids = r.pods<int32_t>();
  for (ValueId v : ids)
    if (v < kNoValue || v >= static_cast<ValueId>(nv)) r.corrupt(cat("value id ", v));
  return ids;
}

Graph read_graph(Reader& r) {
  Graph g;
  g.name = r.str();
  g.opset = r.pod<int32_t>();
  for (size_t i = r.count(24); i-- > 0;) {
    std::string symbol = r.str();
    DimRange range{r.pod<int64_t>(), r.pod<int64_t>()};
    g.symbol_ranges[symbol] = range;
  }
  const size_t nv = r.count(16);
  const size_t ni = r.pod<uint64_t>();
  if (ni > nv) r.corrupt("more inputs than values");
  for (size_t v = 0; v < nv; ++v) {
    std::string name = r.str();
    TensorType type = read_type(r);
    if (name.empty()) r.corrupt("a value without a name");
    if (v < ni)
      g.add_input(std::move(name), std::move(type));
    else
      g.add_value(std::move(name), std::move(type));
  }
  for (size_t i = r.count(12); i-- > 0;) {
    const auto v = r.pod<int32_t>();
    if (v < 0 || v >= static_cast<int32_t>(nv) || g.initializer(v))
      r.corrupt(cat("an initializer for value ", v));
    g.set_initializer(v, read_tensor(r));
  }
  for (size_t i = r.count(40); i-- > 0;) {
    std::string op = r.str(), domain = r.str();
    const auto opset = r.pod<int32_t>();
    std::string name = r.str();
    std::vector<ValueId> ins = read_ids(r, nv), outs = read_ids(r, nv);
    Attributes attrs;
    for (size_t a = r.count(9); a-- > 0;) {
      std::string key = r.str();
      attrs.set(key, read_attribute(r));
    }
    Node& n = g.add_node(std::move(op), std::move(ins), std::move(outs), std::move(attrs),
                         std::move(name), opset);
    n.domain = std::move(domain);
    n.attrs.where = n.where();
  }
  for (ValueId v : read_ids(r, nv)) {
    if (v == kNoValue) r.corrupt("an output without a value");
    g.add_output(v);
  }
  return g;
}

KernelPartition read_partition(Reader& r, size_t nv) {
  KernelPartition p;
  for (size_t k = r.count(48); k-- > 0;) {
    KernelGroup group;
    group.nodes = r.pods<int32_t>();
    group.rule = r.str();
    group.anchor = r.pod<int32_t>();
    group.inputs = read_ids(r, nv);
    group.outputs = read_ids(r, nv);
    p.kernels.kernels.push_back(std::move(group));
    p.leading.push_back(r.pods<int32_t>());
    p.trailing.push_back(r.pods<int32_t>());
  }
  return p;  // compile_partitioned checks it against the graph
}

CompileOptions read_options(Reader& r) {
  CompileOptions o;
  o.level = r.pod<int32_t>();
  o.memory_optimization = r.pod<uint8_t>() != 0;
  o.release_packed_weights = r.pod<uint8_t>() != 0;
  o.concurrent_kernels = r.pod<uint8_t>() != 0;
  for (size_t i = r.count(16); i-- > 0;) {
    std::string name = r.str();
    o.tiles[name] = r.pods<int64_t>();
  }
  if (o.level < 0 || o.level > 3) r.corrupt(cat("optimization level ", o.level));
  return o;
}

// The model must run on kernels of the ISA it was compiled for: the CPU must have what that ISA
// needs, and this process must have chosen it (PTO_ISA may choose a lower one).
void check_isa(const SavedModelInfo& info, const std::string& where) {
  const DeviceInfo& d = device_info();
  for (const std::string& f : info.cpu_features)
    if (!has_feature(d, f))
      throw ValueError(cat(where, ": compiled for ", info.isa,
                           " kernels, which need the CPU "
                           "feature ",
                           f, " that this CPU lacks; compile the model again on this machine"));
  if (info.isa != d.isa)
    throw ValueError(cat(where, ": compiled for ", info.isa, " kernels but this process runs ",
                         d.isa, d.isa_from_env ? " (PTO_ISA)" : "", "; run with PTO_ISA=", info.isa,
                         " or compile the model again"));
}

}  // namespace

uint64_t saved_model_checksum(const void* data, size_t bytes) {
  constexpr uint64_t k1 = 0x9E3779B97F4A7C15ull, k2 = 0xC2B2AE3D27D4EB4Full;
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h[4] = {k1, k2, k1 ^ k2, k1 + k2};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int lane = 0; lane < 4; ++lane) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * lane, 8);
      h[lane] = std::rotl(h[lane] + w * k2, 31) * k1;
    }
  uint64_t x = bytes * k1;
  for (int lane = 0; lane < 4; ++lane) x = std::rotl(x ^ (h[lane] * k2), 27) * k1 + k2;
  for (; i < bytes; ++i) x = std::rotl(x ^ (p[i] * k1), 11) * k2;
  x ^= x >> 33;
  x *= k2;
  x ^= x >> 29;
  return x;
}

std::string serialize_executable(const Executable& exe, const std::string& metadata) {
  const Graph graph = exe.graph_with_weights();
  // One buffer of about the final size: growing a string of hundreds of MiB by doubling costs
  // more than the rest of saving (copies and fresh pages).
  size_t data_bytes = 0;
  for (const auto& [v, t] : graph.initializers()) data_bytes += t.nbytes();
  Writer w;
  w.out().reserve(kHeaderBytes + data_bytes + (1 << 20));
  w.bytes(kMagic, sizeof(kMagic));  // the header; size and checksum are filled in at the end
  w.pod<uint32_t>(kSavedModelFormat);
  w.pod<uint32_t>(0);
  w.pod<uint64_t>(0);
  w.pod<uint64_t>(0);
  const std::string isa = device_info().isa;
  w.str(PTO_VERSION);
  w.str(isa);
  w.pod<uint64_t>(features_of(isa).size());
  for (const std::string& f : features_of(isa)) w.str(f);
  w.pod<int32_t>(num_threads());
  write_options(w, exe.options());
  w.str(metadata);
  const std::vector<ValueId> id = write_graph(w, graph);
  write_partition(w, exe.partition(), id);
  const std::vector<PassReport>& passes = exe.pass_report();
  w.pod<uint64_t>(passes.size());
  for (const PassReport& p : passes) {
    w.str(p.name);
    w.pod<double>(p.seconds);
    w.pod<uint64_t>(p.nodes_before);
    w.pod<uint64_t>(p.nodes_after);
    w.pod<uint64_t>(p.fired.size());
    for (const auto& [rule, n] : p.fired) {
      w.str(rule);
      w.pod<int64_t>(n);
    }
  }
  w.pod<uint64_t>(exe.stats().nodes_in);

  std::string& out = w.out();
  const uint64_t size = out.size() - kHeaderBytes;
  const uint64_t sum = saved_model_checksum(out.data() + kHeaderBytes, size);
  std::memcpy(out.data() + 16, &size, 8);
  std::memcpy(out.data() + 24, &sum, 8);
  return std::move(out);
}

void save_executable(const Executable& exe, const std::string& path, const std::string& metadata) {
  const std::string bytes = serialize_executable(exe, metadata);
  const std::string tmp = cat(path, ".tmp", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (f) f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f || !f.flush()) {
      const std::string why = std::strerror(errno);
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw ValueError(cat(path, ": cannot write the saved model (", why, ")"));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw ValueError(cat(path, ": cannot write the saved model (", ec.message(), ")"));
  }
}

LoadedExecutable deserialize_executable(std::string_view bytes, const std::string& where) {
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    throw ValueError(cat(where, ": not a PyPTO saved model (no PTOMODEL magic at the start)"));
  if (bytes.size() < kHeaderBytes)
    throw ValueError(cat(where, ": truncated saved model (", bytes.size(), " bytes, the header ",
                         "alone is ", kHeaderBytes, ")"));
  uint32_t format;
  uint64_t size, sum;
  std::memcpy(&format, bytes.data() + 8, 4);
  std::memcpy(&size, bytes.data() + 16, 8);
  std::memcpy(&sum, bytes.data() + 24, 8);
  if (format < kOldestSavedModelFormat || format > kSavedModelFormat)
    throw ValueError(cat(where, ": saved model format version ", format, "; this PyPTO (",
                         PTO_VERSION, ") reads versions ", kOldestSavedModelFormat, " to ",
                         kSavedModelFormat, " only: compile the model again"));
  const std::string_view payload = bytes.substr(kHeaderBytes);
  if (payload.size() < size)
    throw ValueError(cat(where, ": truncated saved model (", bytes.size(), " bytes of ",
                         kHeaderBytes + size, ")"));
  if (payload.size() > size)
    throw ValueError(
        cat(where, ": corrupt saved model (", payload.size() - size, " bytes after its end)"));
  if (saved_model_checksum(payload.data(), payload.size()) != sum)
    throw ValueError(cat(where, ": corrupt saved model (the checksum over its ", size,
                         " bytes does not match)"));

  Reader r(payload, where);
  SavedModelInfo info;
  info.format = format;
  info.payload_bytes = size;
  info.pypto_version = r.str();
  info.isa = r.str();
  for (size_t i = r.count(8); i-- > 0;) info.cpu_features.push_back(r.str());
  info.threads = r.pod<int32_t>();
  info.options = read_options(r);
  info.metadata = r.str();
  check_isa(info, where);
  Graph g;
  try {
    g = read_graph(r);
  } catch (const ValueError& e) {
    if (std::string_view(e.what()).starts_with(where)) throw;
    throw ValueError(cat(where, ": corrupt saved model: ", e.what()));
  }
  const size_t nv = g.values().size();
  KernelPartition part = read_partition(r, nv);
  std::vector<PassReport> passes(r.count(40));
  for (PassReport& p : passes) {
    p.name = r.str();
    p.seconds = r.pod<double>();
    p.nodes_before = r.pod<uint64_t>();
    p.nodes_after = r.pod<uint64_t>();
    for (size_t i = r.count(16); i-- > 0;) {
      std::string rule = r.str();
      p.fired[rule] = static_cast<int>(r.pod<int64_t>());
    }
  }
  const auto nodes_in = r.pod<uint64_t>();
  if (!r.done()) r.corrupt("bytes after the last section");
  try {
    verify(g);
    infer_types(g);
  } catch (const Error& e) {
    throw ValueError(cat(where, ": corrupt saved model: ", e.what()));
  }
  try {
    Executable exe = compile_partitioned(std::move(g), std::move(part), info.options,
                                         std::move(passes), static_cast<size_t>(nodes_in));
    return {std::move(exe), std::move(info)};
  } catch (const ValueError& e) {
    throw ValueError(cat(where, ": ", e.what()));
  }
}

// The file mapped read-only: the checksum and the tensors read the page cache directly, without
// a copy of the whole file in between.
LoadedExecutable load_executable(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ValueError(cat(path, ": cannot open (", std::strerror(errno), ")"));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ValueError(cat(path, ": cannot open (not a regular file)"));
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return deserialize_executable({}, path);
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED)
    throw ValueError(cat(path, ": cannot read (", std::strerror(map_errno), ")"));
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, size};
  ::madvise(map, size, MADV_SEQUENTIAL);
  return deserialize_executable(std::string_view(static_cast<const char*>(map), size), path);
}

bool is_saved_model(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char head[sizeof(kMagic)] = {};
  return f.read(head, sizeof(head)) && std::memcmp(head, kMagic, sizeof(kMagic)) == 0;
}

}  // namespace pto
