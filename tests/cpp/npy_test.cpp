// .npy reading and writing: round trips for every dtype, the header forms numpy writes (versions
// 1-3, Fortran order, big-endian), and malformed files (ValueError naming the file, no crash).
// tests/python/test_cli.py checks the same files against numpy itself.
#include <gtest/gtest.h>

#include <random>

#include "onnx_model_builder.h"
#include "pto/npy.h"

namespace pto {
namespace {

using testing::TempDir;

// A tensor of `dt` whose element i holds a value derived from i that survives the dtype.
Tensor sample(DType dt, const Dims& shape) {
  Tensor t = Tensor::empty(dt, shape);
  dispatch(dt, kAllTypes, "sample", [&]<class T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, bool>)
        p[i] = i % 3 == 1;
      else if constexpr (std::is_floating_point_v<compute_t<T>>)
        p[i] = static_cast<T>(static_cast<float>(i) * 0.5f - 3.0f);
      else
        p[i] = static_cast<T>(i * 7 + 1);
    }
  });
  return t;
}

void expect_same(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.shape(), b.shape());
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.item_as_double(i), b.item_as_double(i)) << i;
}

// The header numpy 2.x writes for np.save(np.zeros((2, 3), np.float32)).
std::string numpy_header(const std::string& dict, int version = 1) {
  std::string h = dict;
  size_t prelude = version == 1 ? 10 : 12;
  while ((prelude + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  for (size_t i = 0; i < prelude - 8; ++i) out += static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return out + h;
}

template <class E>
void expect_throws_naming(const std::string& bytes, const std::string& what) {
  try {
    parse_npy(bytes, "data.npy");
    ADD_FAILURE() << "accepted; expected an error about " << what;
  } catch (const E& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("data.npy: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(Npy, RoundTripsEveryDtype) {
  TempDir dir;
  for (DType dt : {DType::kF32, DType::kF64, DType::kF16, DType::kI8, DType::kI16, DType::kI32,
                   DType::kI64, DType::kU8, DType::kU16, DType::kU32, DType::kU64, DType::kBool}) {
    for (const Dims& shape :
         {Dims{}, Dims{0}, Dims{7}, Dims{2, 3}, Dims{2, 0, 3}, Dims{1, 2, 3, 4}}) {
      SCOPED_TRACE(cat(dtype_name(dt), dims_str(shape)));
      Tensor t = sample(dt, shape);
      std::string bytes = encode_npy(t);
      EXPECT_EQ(bytes.find(npy_descr(dt)), 21u);  // after "\x93NUMPY\1\0LL{'descr': '"
      size_t header = 10 + (static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8);
      EXPECT_EQ(header % 64, 0u);  // numpy aligns the data to 64 bytes
      expect_same(parse_npy(bytes, "mem"), t);
      std::string path = dir.file(cat(dtype_name(dt), t.numel(), ".npy"));
      write_npy(path, t);
      expect_same(read_npy(path), t);
    }
  }
}

TEST(Npy, HeaderMatchesNumpy) {
  Tensor t = Tensor::zeros(DType::kF32, {2, 3});
  std::string expect = numpy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }") +
                       std::string(24, '\0');
  EXPECT_EQ(encode_npy(t), expect);
  Tensor v = Tensor::zeros(DType::kI64, {5});
  EXPECT_NE(encode_npy(v).find("'shape': (5,), }"), std::string::npos);
  Tensor s = Tensor::zeros(DType::kBool, {});
  EXPECT_NE(encode_npy(s).find("'descr': '|b1', 'fortran_order': False, 'shape': (), }"),
            std::string::npos);
}

TEST(Npy, WritesNonContiguousViews) {
  Tensor t = sample(DType::kI32, {2, 3});
  Tensor tr = t.view({3, 2}, {1, 3}, 0);  // the transpose
  Tensor back = parse_npy(encode_npy(tr), "mem");
  ASSERT_EQ(back.shape(), (Dims{3, 2}));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(back.item_as_double(i), tr.item_as_double(i));
}

TEST(Npy, Bf16IsRefused) {
  Tensor t = Tensor::zeros(DType::kBF16, {2});
  EXPECT_THROW(encode_npy(t), UnsupportedError);
  TempDir dir;
  try {
    write_npy(dir.file("b.npy"), t);
    ADD_FAILURE() << "bf16 written";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("b.npy"), std::string::npos) << e.what();
  }
}

TEST(Npy, ReadsOtherHeaderForms) {
  const int32_t data[] = {1, 2, 3, 4, 5, 6};
  std::string raw(reinterpret_cast<const char*>(data), sizeof(data));
  // Versions 2 and 3, double quotes, no trailing comma, Python 2 longs, odd spacing.
  for (int version : {2, 3}) {
    Tensor t = parse_npy(
        numpy_header("{\"descr\":\"<i4\",\"shape\":(2L,3L),\"fortran_order\":False}", version) +
            raw,
        "v");
    EXPECT_EQ(t.shape(), (Dims{2, 3}));
    EXPECT_EQ(t.item_as_double(5), 6);
  }
  // Fortran order: the data is column-major; the result is row-major.
  Tensor f = parse_npy(
      numpy_header("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }") + raw, "f");
  ASSERT_EQ(f.shape(), (Dims{2, 3}));
  const double expect[] = {1, 3, 5, 2, 4, 6};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f.item_as_double(i), expect[i]) << i;
  // Big-endian data is swapped.
  std::string be;
  for (int32_t v : data)
    for (int k = 3; k >= 0; --k) be += static_cast<char>((v >> (8 * k)) & 0xff);
  Tensor b = parse_npy(
      numpy_header("{'descr': '>i4', 'fortran_order': False, 'shape': (6,), }") + be, "b");
  EXPECT_EQ(b.item_as_double(4), 5);
  // Any non-zero byte of a bool array is true (and becomes a valid C++ bool).
  Tensor bools =
      parse_npy(numpy_header("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }") +
                    std::string("\x00\x02\xff", 3),
                "bool");
  EXPECT_EQ(bools.data<bool>()[1], true);
  EXPECT_EQ(*reinterpret_cast<const uint8_t*>(bools.data<bool>() + 2), 1);
}

TEST(Npy, MalformedFilesGiveValueErrors) {
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const std::string data(8, '\0');
  expect_throws_naming<ValueError>("", "not a .npy file");
  expect_throws_naming<ValueError>("PK\x03\x04 zip file", "not a .npy file");
  std::string v9 = numpy_header(ok) + data;
  v9[6] = 9;
  expect_throws_naming<ValueError>(v9, "version 9.0");
  std::string longer = numpy_header(ok);
  longer[8] = '\xff';
  longer[9] = '\x7f';
  expect_throws_naming<ValueError>(longer, "truncated npy header");
  expect_throws_naming<ValueError>(numpy_header(ok) + data.substr(1), "needs 8");
  expect_throws_naming<ValueError>(numpy_header(ok) + data + "x", "needs 8");
  expect_throws_naming<ValueError>(
      numpy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }"), "negative");
  expect_throws_naming<ValueError>(
      numpy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, "
                   "99999999999, 99999999999), }"),
      "overflows");
  expect_throws_naming<ValueError>(numpy_header("{'descr': '<f4', 'fortran_order': False, 'shape': "
                                                "(99999999999999999999999,), }"),
                                   "too large");
  expect_throws_naming<ValueError>(numpy_header("{'descr': '<f4', 'shape': (2,), }") + data,
                                   "must contain");
  expect_throws_naming<ValueError>(
      numpy_header("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }") + data,
      "True or False");
  expect_throws_naming<ValueError>(numpy_header(ok + " junk") + data, "after the header");
  expect_throws_naming<ValueError>(
      numpy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}") + data,
      "unexpected key");
  expect_throws_naming<ValueError>(
      numpy_header("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}") +
          data,
      "twice");
  expect_throws_naming<ValueError>(numpy_header("{'descr: '<f4'") + data, "malformed");
  // Valid npy, but dtypes we do not have: UnsupportedError, still naming the file.
  expect_throws_naming<UnsupportedError>(
      numpy_header("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }") + data, "'<c8'");
  expect_throws_naming<UnsupportedError>(
      numpy_header("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }") +
          data.substr(4),
      "structured");
}

TEST(Npy, FileErrorsNameThePath) {
  TempDir dir;
  std::string missing = dir.file("missing.npy");
  try {
    read_npy(missing);
    ADD_FAILURE();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos);
  }
  std::string path = dir.write("short.npy", encode_npy(sample(DType::kF64, {4})).substr(0, 100));
  try {
    read_npy(path);
    ADD_FAILURE();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("short.npy: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_npy(dir.file("no/such/folder/x.npy"), sample(DType::kF32, {1})), ValueError);
}

// Random damage to a valid file: every result is a tensor or a pto::Error, never a crash.
TEST(Npy, MutatedFilesNeverCrash) {
  TempDir dir;
  std::string base = encode_npy(sample(DType::kF32, {3, 5}));
  std::mt19937_64 rng(5);
  int ok = 0, errors = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string m = base;
    size_t pos = rng() % 80;  // mostly the header
    switch (rng() % 3) {
      case 0:
        m[pos] = static_cast<char>(rng());
        break;
      case 1:
        m.resize(rng() % m.size());
        break;
      case 2:
        m.insert(pos, 1, "0123456789(),' -TF"[rng() % 18]);
        break;
    }
    try {
      if (i % 10 == 0)  // the file reader has its own size checks
        read_npy(dir.write("mutant.npy", m));
      else
        parse_npy(m, "mutant");
      ++ok;
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
  EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace pto
