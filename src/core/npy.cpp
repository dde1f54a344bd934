// .npy reading and writing. The header is a Python dict literal; we parse exactly the subset numpy
// writes ({'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }) and reject anything else
// with a message naming the file. Sizes are checked before any data is copied.
#include "pto/npy.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

namespace pto {
namespace {

static_assert(std::endian::native == std::endian::little, "npy I/O assumes a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kMaxHeaderBytes = size_t{1} << 20;  // numpy's own headers are < 1 KiB
constexpr size_t kAlign = 64;                        // numpy pads the header to this

struct Header {
  DType dtype = DType::kUndefined;
  bool swap = false;  // big-endian data
  bool fortran = false;
  Dims shape;
  size_t data_offset = 0;  // bytes before the array data
};

// Parses the dict literal numpy writes. Errors name the source.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& src) : s_(text), src_(src) {}

  Header parse() {
    Header h;
    std::optional<std::string> descr;
    std::optional<bool> fortran;
    std::optional<Dims> shape;
    skip_ws();
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') break;
      std::string key = string_literal();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (descr) fail("key 'descr' appears twice");
        if (peek() == '[')
          throw UnsupportedError(
              cat(src_, ": structured numpy dtypes (record arrays) are not supported"));
        descr = string_literal();
      } else if (key == "fortran_order") {
        if (fortran) fail("key 'fortran_order' appears twice");
        fortran = boolean();
      } else if (key == "shape") {
        if (shape) fail("key 'shape' appears twice");
        shape = tuple();
      } else {
        fail(cat("unexpected key '", key, "' (expected descr, fortran_order and shape)"));
      }
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      skip_ws();
      if (peek() != '}') fail("expected ',' or '}'");
    }
    ++i_;  // '}'
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\0'))
      ++i_;
    if (i_ != s_.size()) fail("unexpected text after the header dict");
    if (!descr || !fortran || !shape)
      fail("the header must contain 'descr', 'fortran_order' and 'shape'");
    parse_descr(*descr, h);
    h.fortran = *fortran;
    h.shape = std::move(*shape);
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ValueError(cat(src_, ": malformed npy header at byte ", i_, ": ", what));
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(cat("expected '", c, "'"));
    ++i_;
  }

  std::string string_literal() {
    char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    size_t end = s_.find(q, i_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string out(s_.substr(i_ + 1, end - i_ - 1));
    if (out.find('\\') != std::string::npos) fail("escapes in strings are not supported");
    i_ = end + 1;
    return out;
  }

  bool boolean() {
    if (s_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (s_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    fail("expected True or False");
  }

  int64_t integer() {
    if (peek() == '-') fail("negative dimension in 'shape'");
    if (peek() < '0' || peek() > '9') fail("expected a dimension (a non-negative integer)");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, peek() - '0', &v))
        fail("dimension too large");
      ++i_;
    }
    if (peek() == 'L') ++i_;  // Python 2 longs
    return v;
  }

  Dims tuple() {
    expect('(');
    Dims dims;
    skip_ws();
    while (peek() != ')') {
      dims.push_back(integer());
      skip_ws();
      if (peek() == ',') {
        ++i_;
        skip_ws();
      } else if (peek() != ')') {
        fail("expected ',' or ')' in 'shape'");
      }
    }
    ++i_;
    return dims;
  }

  void parse_descr(const std::string& d, Header& h) const {
    auto bad = [&](const char* why) {
      throw UnsupportedError(cat(src_, ": numpy dtype '", d, "' is not supported (", why,
                                 "; supported: float16/32/64, int8..64, uint8..64, bool)"));
    };
    if (d.size() < 2) bad("too short");
    size_t p = 0;
    char order = '=';
    if (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=') order = d[p++];
    char kind = d[p++];
    std::string_view size = std::string_view(d).substr(p);
    if (kind == '?') {  // numpy's other spelling of bool
      kind = 'b';
      if (size.empty()) size = "1";
    }
    static const struct {
      char kind;
      const char* size;
      DType dt;
    } kCodes[] = {
        {'f', "2", DType::kF16}, {'f', "4", DType::kF32}, {'f', "8", DType::kF64},
        {'i', "1", DType::kI8},  {'i', "2", DType::kI16}, {'i', "4", DType::kI32},
        {'i', "8", DType::kI64}, {'u', "1", DType::kU8},  {'u', "2", DType::kU16},
        {'u', "4", DType::kU32}, {'u', "8", DType::kU64}, {'b', "1", DType::kBool},
    };
    for (const auto& c : kCodes) {
      if (c.kind == kind && size == c.size) {
        h.dtype = c.dt;
        h.swap = order == '>' && dtype_size(c.dt) > 1;
        return;
      }
    }
    bad("unknown kind or size");
  }

  std::string_view s_;
  const std::string& src_;
  size_t i_ = 0;
};

// Reads the fixed prelude (magic, version, header length); returns the header length and sets
// `prelude` to the number of bytes before the header text.
size_t header_length(std::string_view head, const std::string& src, size_t& prelude) {
  if (head.size() < 10 || head.substr(0, kMagicLen) != std::string_view(kMagic, kMagicLen))
    throw ValueError(cat(src, ": not a .npy file (the magic string \\x93NUMPY is missing)"));
  auto major = static_cast<uint8_t>(head[6]);
  auto minor = static_cast<uint8_t>(head[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    throw ValueError(cat(src, ": npy format version ", int(major), ".", int(minor),
                         " is not supported (1.0, 2.0 and 3.0 are)"));
  auto byte = [&](size_t i) { return static_cast<size_t>(static_cast<uint8_t>(head[i])); };
  if (major == 1) {
    prelude = 10;
    return byte(8) | byte(9) << 8;
  }
  if (head.size() < 12) throw ValueError(cat(src, ": truncated npy header"));
  prelude = 12;
  return byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24;
}

Header parse_header(std::string_view bytes_at_start, size_t header_len, size_t prelude,
                    const std::string& src) {
  if (header_len > kMaxHeaderBytes)
    throw ValueError(cat(src, ": npy header length ", header_len, " is implausibly large"));
  if (bytes_at_start.size() < prelude + header_len)
    throw ValueError(cat(src, ": truncated npy header (", header_len, " bytes announced)"));
  Header h = HeaderParser(bytes_at_start.substr(prelude, header_len), src).parse();
  h.data_offset = prelude + header_len;
  return h;
}

size_t data_bytes(const Header& h, const std::string& src) {
  int64_t n = checked_numel(h.shape, src.c_str());
  size_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(n), dtype_size(h.dtype), &nbytes))
    throw ValueError(cat(src, ": shape ", dims_str(h.shape), " is too large"));
  return nbytes;
}

// Turns raw file bytes already copied into `t` (shape reversed for Fortran order) into the array.
Tensor finish(Tensor t, const Header& h) {
  auto* p = static_cast<unsigned char*>(t.raw_data());
  size_t item = t.itemsize();
  if (h.swap)
    for (size_t i = 0; i < t.nbytes(); i += item) std::reverse(p + i, p + i + item);
  // A C++ bool must hold 0 or 1; numpy treats any non-zero byte as True.
  if (h.dtype == DType::kBool)
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = p[i] != 0;
  if (!h.fortran || h.shape.size() < 2) return t.reshape(h.shape);
  // Column-major data of shape S is row-major data of reversed(S); transpose it back.
  Dims rstrides = contiguous_strides(t.shape());
  Dims strides(rstrides.rbegin(), rstrides.rend());
  return t.view(h.shape, strides, 0).contiguous();
}

Tensor empty_for(const Header& h, const std::string& src) {
  Dims storage_shape = h.shape;
  if (h.fortran) std::reverse(storage_shape.begin(), storage_shape.end());
  try {
    return Tensor::empty(h.dtype, storage_shape);
  } catch (const ValueError& e) {  // over the allocation limit
    throw ValueError(cat(src, ": ", e.what()));
  }
}

}  // namespace

std::string npy_descr(DType dt) {
  switch (dt) {
    case DType::kF16:
      return "<f2";
    case DType::kF32:
      return "<f4";
    case DType::kF64:
      return "<f8";
    case DType::kI8:
      return "|i1";
    case DType::kI16:
      return "<i2";
    case DType::kI32:
      return "<i4";
    case DType::kI64:
      return "<i8";
    case DType::kU8:
      return "|u1";
    case DType::kU16:
      return "<u2";
    case DType::kU32:
      return "<u4";
    case DType::kU64:
      return "<u8";
    case DType::kBool:
      return "|b1";
    default:
      throw UnsupportedError(cat("npy: dtype ", dtype_name(dt),
                                 " has no numpy equivalent (cast bf16 to f32 before saving)"));
  }
}

Tensor parse_npy(std::string_view bytes, const std::string& source) {
  size_t prelude = 0;
  size_t len = header_length(bytes, source, prelude);
  Header h = parse_header(bytes, len, prelude, source);
  size_t nbytes = data_bytes(h, source);
  size_t have = bytes.size() - h.data_offset;
  if (have != nbytes)
    throw ValueError(cat(source, ": npy data holds ", have, " bytes but shape ", dims_str(h.shape),
                         " of ", dtype_name(h.dtype), " needs ", nbytes));
  Tensor t = empty_for(h, source);
  if (nbytes) std::memcpy(t.raw_data(), bytes.data() + h.data_offset, nbytes);
  return finish(std::move(t), h);
}

Tensor read_npy(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ValueError(cat(path, ": is a folder, not a .npy file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ValueError(cat(path, ": cannot open the file"));
  in.seekg(0, std::ios::end);
  auto end = in.tellg();
  in.seekg(0);
  if (end < 0) throw ValueError(cat(path, ": cannot determine the file size"));
  auto file_size = static_cast<size_t>(end);

  std::string head(std::min<size_t>(file_size, 12), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  size_t prelude = 0;
  size_t len = header_length(head, path, prelude);
  if (len > kMaxHeaderBytes || prelude + len > file_size)
    throw ValueError(cat(path, ": truncated npy header (", len, " bytes announced, the file holds ",
                         file_size, ")"));
  head.resize(prelude + len);
  in.seekg(0);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  if (!in) throw ValueError(cat(path, ": reading the npy header failed"));
  Header h = parse_header(head, len, prelude, path);

  size_t nbytes = data_bytes(h, path);
  size_t have = file_size - h.data_offset;
  if (have != nbytes)
    throw ValueError(cat(path, ": npy data holds ", have, " bytes but shape ", dims_str(h.shape),
                         " of ", dtype_name(h.dtype), " needs ", nbytes,
                         have < nbytes ? " (the file is truncated)" : ""));
  Tensor t = empty_for(h, path);
  in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(nbytes));
  if (!in) throw ValueError(cat(path, ": reading the npy data failed"));
  return finish(std::move(t), h);
}

std::string encode_npy(const Tensor& t) {
  if (!t.defined()) throw ValueError("npy: cannot save an undefined tensor");
  std::string dict =
      cat("{'descr': '", npy_descr(t.dtype()), "', 'fortran_order': False, 'shape': (");
  for (size_t i = 0; i < t.shape().size(); ++i) dict += cat(i ? ", " : "", t.shape()[i]);
  if (t.shape().size() == 1) dict += ',';  // a Python 1-tuple: (3,)
  dict += "), }";
  // Version 1.0 unless the header needs more than 65535 bytes.
  size_t prelude = 10;
  size_t total = (prelude + dict.size() + 1 + kAlign - 1) / kAlign * kAlign;
  bool v2 = total - prelude > 0xffff;
  if (v2) {
    prelude = 12;
    total = (prelude + dict.size() + 1 + kAlign - 1) / kAlign * kAlign;
  }
  size_t header_len = total - prelude;
  dict.append(header_len - dict.size() - 1, ' ');
  dict += '\n';

  std::string out(kMagic, kMagicLen);
  out += static_cast<char>(v2 ? 2 : 1);
  out += '\0';
  for (int i = 0; i < (v2 ? 4 : 2); ++i) out += static_cast<char>((header_len >> (8 * i)) & 0xff);
  out += dict;
  Tensor c = t.contiguous();
  out.append(static_cast<const char*>(c.raw_data()), c.nbytes());
  return out;
}

void write_npy(const std::string& path, const Tensor& t) {
  std::string bytes;
  try {
    bytes = encode_npy(t);
  } catch (const UnsupportedError& e) {
    throw UnsupportedError(cat(path, ": ", e.what()));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw ValueError(cat(path, ": cannot open the file for writing"));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw ValueError(cat(path, ": writing the file failed"));
}

}  // namespace pto
