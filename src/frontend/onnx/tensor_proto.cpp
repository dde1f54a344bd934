// TensorProto -> Tensor. Every size is checked against the declared shape before a byte is copied.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "proto_util.h"

namespace pto::onnx {

DType dtype_from_onnx(int32_t t, const std::string& where) {
  using TP = ::onnx::TensorProto;
  try {
    return dtype_from_onnx_code(t, where);
  } catch (const UnsupportedError&) {
  }
  std::string name = TP::DataType_IsValid(t) ? TP::DataType_Name(static_cast<TP::DataType>(t))
                                             : cat("unknown (", t, ")");
  throw UnsupportedError(
      cat(where, ": element type ", name,
          " is not supported (PyPTO has no string, complex or 6-bit float tensors)"));
}

namespace {

// Tensor::empty with the tensor's name in the error past the allocation limit.
Tensor allocate(DType dt, const Dims& dims, const std::string& where) {
  try {
    return Tensor::empty(dt, dims);
  } catch (const ValueError& e) {
    throw ValueError(cat(where, ": ", e.what()));
  }
}

// Reads [offset, offset+length) of an external data file that must live under base_dir into a
// new tensor (allocated once the file is known to hold that much).
Tensor read_external(const ::onnx::TensorProto& t, const std::string& base_dir, DType dt,
                     const Dims& dims, size_t expected, const std::string& where) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : t.external_data()) {
    try {
      if (kv.key() == "location") location = kv.value();
      if (kv.key() == "offset") offset = std::stoll(kv.value());
      if (kv.key() == "length" && (length = std::stoll(kv.value())) < 0)
        throw std::out_of_range("negative");
    } catch (const std::exception&) {
      throw ValueError(
          cat(where, ": external data key '", kv.key(), "' has a bad value '", kv.value(), "'"));
    }
  }
  if (base_dir.empty())
    throw ValueError(cat(where, ": uses external data, which needs the model loaded from a file"));
  namespace fs = std::filesystem;
  fs::path rel(location);
  const std::string inside = "' must be a relative path inside the model's folder";
  if (location.find('\0') != std::string::npos)  // (quoted, it would cut the message short)
    throw ValueError(cat(where,
                         ": external data location holds a NUL byte (it must be a relative "
                         "path inside the model's folder)"));
  if (location.empty() || rel.is_absolute() ||
      std::any_of(rel.begin(), rel.end(), [](const fs::path& p) { return p == ".."; }))
    throw ValueError(cat(where, ": external data location '", location, inside));
  if (offset < 0) throw ValueError(cat(where, ": external data offset ", offset, " is negative"));
  if (length >= 0 && static_cast<size_t>(length) != expected)
    throw ValueError(cat(where, ": external data length ", length, " does not match the ", expected,
                         " bytes its shape needs"));
  fs::path file = fs::path(base_dir) / rel;
  // The file the path names once links are followed must be in the folder too: a link in it
  // to /etc/passwd is a path the text check above passes (onnxruntime refuses it as well).
  std::error_code ec;
  const fs::path real = fs::canonical(file, ec), folder = fs::canonical(fs::path(base_dir), ec);
  if (ec || !fs::is_regular_file(real, ec))
    throw ValueError(cat(where, ": cannot open external data file '", file.string(),
                         "' (not an existing regular file)"));
  const auto [past, _] = std::mismatch(folder.begin(), folder.end(), real.begin(), real.end());
  if (past != folder.end())
    throw ValueError(cat(where, ": external data location '", location, "' leads to '",
                         real.string(), "', outside the model's folder '", folder.string(), "'"));
  std::ifstream in(real, std::ios::binary);
  if (!in) throw ValueError(cat(where, ": cannot open external data file '", file.string(), "'"));
  auto size = fs::file_size(real, ec);
  if (ec)
    throw ValueError(
        cat(where, ": cannot read the size of external data file '", file.string(), "'"));
  if (static_cast<uintmax_t>(offset) + expected > size)
    throw ValueError(cat(where, ": external data file '", file.string(), "' holds ", size,
                         " bytes, fewer than offset ", offset, " + ", expected));
  Tensor out = allocate(dt, dims, where);
  in.seekg(offset);
  // 4- and 2-bit data is packed in the file and one element per byte in the tensor.
  const bool packed = packed_bits(dt) < 8;
  std::string buf(packed ? expected : 0, '\0');
  in.read(packed ? buf.data() : static_cast<char*>(out.raw_data()),
          static_cast<std::streamsize>(expected));
  if (!in) throw ValueError(cat(where, ": reading external data '", file.string(), "' failed"));
  if (packed)
    unpack_elements(dt, reinterpret_cast<const uint8_t*>(buf.data()), out.numel(), out.raw_data());
  return out;
}

template <class Field>
void check_count(const Field& f, int64_t n, const char* field, const std::string& where) {
  if (static_cast<int64_t>(f.size()) != n)
    throw ValueError(
        cat(where, ": ", field, " holds ", f.size(), " values but the shape needs ", n));
}

}  // namespace

Tensor tensor_from_proto(const ::onnx::TensorProto& t, const std::string& base_dir,
                         const std::string& where_in) {
  std::string where = t.name().empty() ? where_in : cat(where_in, " tensor '", t.name(), "'");
  if (t.has_segment()) throw UnsupportedError(cat(where, ": segmented tensors are not supported"));
  DType dt = dtype_from_onnx(t.data_type(), where);
  Dims dims(t.dims().begin(), t.dims().end());
  for (int64_t d : dims)
    if (d < 0) throw ValueError(cat(where, ": negative dimension in ", dims_str(dims)));
  int64_t n = checked_numel(dims, where.c_str());
  size_t nbytes = 0;  // in the proto: 4- and 2-bit types are packed there
  if (__builtin_mul_overflow(static_cast<size_t>(n), dtype_size(dt), &nbytes))
    throw ValueError(cat(where, ": shape ", dims_str(dims), " is too large"));
  nbytes = packed_nbytes(dt, n);

  if (t.data_location() == ::onnx::TensorProto::EXTERNAL)
    return read_external(t, base_dir, dt, dims, nbytes, where);
  if (t.has_raw_data()) {
    if (t.raw_data().size() != nbytes)
      throw ValueError(cat(where, ": raw_data holds ", t.raw_data().size(), " bytes but shape ",
                           dims_str(dims), " of ", dtype_name(dt), " needs ", nbytes));
    Tensor out = allocate(dt, dims, where);
    unpack_elements(dt, reinterpret_cast<const uint8_t*>(t.raw_data().data()), n, out.raw_data());
    return out;
  }
  // 4- and 2-bit types: int32_data holds the packed bytes, one per entry.
  if (packed_bits(dt) < 8) {
    check_count(t.int32_data(), static_cast<int64_t>(nbytes), "int32_data (packed bytes)", where);
    std::vector<uint8_t> bytes(t.int32_data().begin(), t.int32_data().end());
    Tensor out = allocate(dt, dims, where);
    unpack_elements(dt, bytes.data(), n, out.raw_data());
    return out;
  }
  // Typed fields: the count is checked before allocating, so a tiny file cannot claim gigabytes.
  Tensor out;
  auto copy = [&]<class Src>(const Src& field, const char* name, auto convert) {
    check_count(field, n, name, where);
    out = allocate(dt, dims, where);
    dispatch_with_storage(dt, kAllTypes | kSmallFloatTypes, where, [&]<class T>() {
      T* p = out.data<T>();
      for (int64_t i = 0; i < n; ++i) p[i] = convert.template operator()<T>(field[i]);
    });
  };
  auto same = []<class T>(auto v) { return static_cast<T>(v); };
  // f16, bf16 and the float8 / float4 types travel as their bit patterns in int32_data.
  auto bits = []<class T>(int32_t v) {
    if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16> ||
                  is_small_float_v<T>) {
      T h;
      h.bits = static_cast<decltype(h.bits)>(v);
      return h;
    } else {
      return static_cast<T>(v);
    }
  };
  switch (dt) {
    case DType::kF32:
      copy(t.float_data(), "float_data", same);
      break;
    case DType::kF64:
      copy(t.double_data(), "double_data", same);
      break;
    case DType::kI64:
      copy(t.int64_data(), "int64_data", same);
      break;
    case DType::kU32:
    case DType::kU64:
      copy(t.uint64_data(), "uint64_data", same);
      break;
    default:
      copy(t.int32_data(), "int32_data", bits);
      break;
  }
  return out;
}

}  // namespace pto::onnx
