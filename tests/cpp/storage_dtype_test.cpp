// Storage dtypes (float8, float4, 4- and 2-bit integers): conversions against bit patterns worked
// out by hand from the formats' definitions (OCP FP8/MX specs, ONNX's Cast table), and the
// TensorProto packing of the sub-byte types.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "pto/graph.h"
#include "pto/reference.h"
#include "pto/tensor.h"
#include "reference/ops/cast.h"

namespace pto {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <class T>
uint8_t bits_of(double x, bool saturate = true, E8M0Rounding r = E8M0Rounding::kUp) {
  return small_float_from_double(T::format, x, saturate, r);
}

template <class T>
float value_of(uint8_t bits) {
  T t;
  t.bits = bits;
  return static_cast<float>(t);
}

TEST(StorageDType, Float8E4M3FN) {
  using T = Float8E4M3FN;  // bias 7, no Inf, S.1111.111 is NaN, max 448 = 0x7E
  EXPECT_EQ(bits_of<T>(1.0), 0x38);
  EXPECT_EQ(bits_of<T>(-2.0), 0xC0);
  EXPECT_EQ(bits_of<T>(448), 0x7E);
  EXPECT_EQ(bits_of<T>(-0.0), 0x80);
  EXPECT_EQ(bits_of<T>(1.0625), 0x38);              // tie between 1 and 1.125: even
  EXPECT_EQ(bits_of<T>(1.1875), 0x3A);              // tie between 1.125 and 1.25: even (up)
  EXPECT_EQ(bits_of<T>(std::ldexp(1, -9)), 0x01);   // smallest subnormal
  EXPECT_EQ(bits_of<T>(std::ldexp(1, -10)), 0x00);  // half of it: ties to even zero
  EXPECT_EQ(bits_of<T>(std::ldexp(3, -10)), 0x02);  // 1.5 subnormal units: even (2)
  EXPECT_EQ(bits_of<T>(std::ldexp(1, -6)), 0x08);   // smallest normal
  // saturate (the default): out of range and Inf clamp to +-448
  EXPECT_EQ(bits_of<T>(1e6), 0x7E);
  EXPECT_EQ(bits_of<T>(-kInf), 0xFE);
  EXPECT_EQ(bits_of<T>(464), 0x7E);  // tie between 448 and (missing) 480: even, in range
  // no saturation: what rounds beyond 448 is NaN
  EXPECT_EQ(bits_of<T>(464, false), 0x7E);
  EXPECT_EQ(bits_of<T>(470, false), 0x7F);
  EXPECT_EQ(bits_of<T>(kInf, false), 0x7F);
  EXPECT_EQ(bits_of<T>(-kInf, false), 0xFF);
  EXPECT_EQ(bits_of<T>(kNaN), 0x7F);
  EXPECT_TRUE(std::isnan(value_of<T>(0x7F)));
  EXPECT_TRUE(std::isnan(value_of<T>(0xFF)));
  EXPECT_EQ(value_of<T>(0x7E), 448.0f);
  EXPECT_EQ(value_of<T>(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(value_of<T>(0xB8), -1.0f);
}

TEST(StorageDType, Float8E4M3FNUZ) {
  using T = Float8E4M3FNUZ;  // bias 8, no Inf, no -0: 0x80 is NaN, max 240 = 0x7F
  EXPECT_EQ(bits_of<T>(1.0), 0x40);
  EXPECT_EQ(bits_of<T>(240), 0x7F);
  EXPECT_EQ(bits_of<T>(-0.0), 0x00);
  EXPECT_EQ(bits_of<T>(-std::ldexp(1, -12)), 0x00);  // rounds to zero, which has no sign
  EXPECT_EQ(bits_of<T>(std::ldexp(1, -10)), 0x01);   // smallest subnormal
  EXPECT_EQ(bits_of<T>(kNaN), 0x80);
  EXPECT_EQ(bits_of<T>(kInf), 0x7F);
  EXPECT_EQ(bits_of<T>(-kInf), 0xFF);
  EXPECT_EQ(bits_of<T>(kInf, false), 0x80);
  EXPECT_EQ(bits_of<T>(1e6, false), 0x80);
  EXPECT_TRUE(std::isnan(value_of<T>(0x80)));
  EXPECT_EQ(value_of<T>(0xFF), -240.0f);
  EXPECT_EQ(value_of<T>(0x00), 0.0f);
}

TEST(StorageDType, Float8E5M2) {
  using T = Float8E5M2;  // bias 15, IEEE-like: 0x7C Inf, 0x7D..0x7F NaN, max 57344 = 0x7B
  EXPECT_EQ(bits_of<T>(1.0), 0x3C);
  EXPECT_EQ(bits_of<T>(57344), 0x7B);
  EXPECT_EQ(bits_of<T>(std::ldexp(1, -16)), 0x01);
  EXPECT_EQ(bits_of<T>(61440), 0x7B);         // tie toward Inf (even): saturates
  EXPECT_EQ(bits_of<T>(61440, false), 0x7C);  // ... or is Inf
  EXPECT_EQ(bits_of<T>(kInf), 0x7B);
  EXPECT_EQ(bits_of<T>(kInf, false), 0x7C);
  EXPECT_EQ(bits_of<T>(-kInf, false), 0xFC);
  EXPECT_EQ(bits_of<T>(kNaN), 0x7E);
  EXPECT_EQ(bits_of<T>(-0.0), 0x80);
  EXPECT_EQ(value_of<T>(0x7C), kInf);
  EXPECT_EQ(value_of<T>(0xFC), -kInf);
  EXPECT_TRUE(std::isnan(value_of<T>(0x7D)));
  EXPECT_EQ(value_of<T>(0x7B), 57344.0f);
}

TEST(StorageDType, Float8E5M2FNUZ) {
  using T = Float8E5M2FNUZ;  // bias 16, no Inf, no -0: 0x80 NaN, max 57344 = 0x7F
  EXPECT_EQ(bits_of<T>(1.0), 0x40);
  EXPECT_EQ(bits_of<T>(57344), 0x7F);
  EXPECT_EQ(bits_of<T>(std::ldexp(1, -17)), 0x01);
  EXPECT_EQ(bits_of<T>(-0.0), 0x00);
  EXPECT_EQ(bits_of<T>(kNaN), 0x80);
  EXPECT_EQ(bits_of<T>(-kInf, false), 0x80);
  EXPECT_EQ(value_of<T>(0x7F), 57344.0f);
  EXPECT_TRUE(std::isnan(value_of<T>(0x80)));
}

TEST(StorageDType, Float8E8M0RoundModes) {
  using T = Float8E8M0;  // 2^(bits - 127), 0xFF NaN; the sign is dropped
  EXPECT_EQ(bits_of<T>(1.0), 127);
  EXPECT_EQ(bits_of<T>(0.124), 124);  // up: 0.125
  EXPECT_EQ(bits_of<T>(1.1), 128);
  EXPECT_EQ(bits_of<T>(1.1, true, E8M0Rounding::kDown), 127);
  EXPECT_EQ(bits_of<T>(1.1, true, E8M0Rounding::kNearest), 127);
  EXPECT_EQ(bits_of<T>(1.5, true, E8M0Rounding::kNearest), 128);
  EXPECT_EQ(bits_of<T>(-2.0), 128);
  EXPECT_EQ(bits_of<T>(0.0), 0);
  EXPECT_EQ(bits_of<T>(kInf), 0xFF);
  EXPECT_EQ(bits_of<T>(kNaN), 0xFF);
  EXPECT_EQ(bits_of<T>(std::ldexp(1.5, 127)), 0xFE);         // saturates at 2^127
  EXPECT_EQ(bits_of<T>(std::ldexp(1.5, 127), false), 0xFF);  // NaN without saturation
  EXPECT_EQ(value_of<T>(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(bits_of<T>(std::ldexp(1.0, -127)), 1);  // float subnormal: "up" by its fraction
  EXPECT_EQ(bits_of<T>(std::ldexp(1.0, -127), true, E8M0Rounding::kDown), 0);
  EXPECT_EQ(value_of<T>(130), 8.0f);
  EXPECT_TRUE(std::isnan(value_of<T>(0xFF)));
}

TEST(StorageDType, Float4E2M1) {
  using T = Float4E2M1;  // bias 1, values 0 0.5 1 1.5 2 3 4 6, no Inf or NaN
  EXPECT_EQ(bits_of<T>(0.5), 0x1);
  EXPECT_EQ(bits_of<T>(0.25), 0x0);         // tie: even (0)
  EXPECT_EQ(bits_of<T>(0.75), 0x2);         // tie between 0.5 and 1: even (1)
  EXPECT_EQ(bits_of<T>(5.0), 0x6);          // tie between 4 and 6: even (4)
  EXPECT_EQ(bits_of<T>(-3.5), 0xE);         // tie between 3 and 4: -4
  EXPECT_EQ(bits_of<T>(7.0), 0x7);          // out of range: 6
  EXPECT_EQ(bits_of<T>(kInf, false), 0x7);  // no Inf: always saturates
  EXPECT_EQ(bits_of<T>(-kInf), 0xF);
  EXPECT_EQ(bits_of<T>(-0.0), 0x8);
  EXPECT_EQ(bits_of<T>(kNaN), 0x8);  // no NaN: ml_dtypes' -0 for a positive NaN
  EXPECT_EQ(value_of<T>(0xF), -6.0f);
  EXPECT_EQ(value_of<T>(0x5), 3.0f);
  for (int b = 0; b < 16; ++b)  // every value converts back to itself
    EXPECT_EQ(bits_of<T>(value_of<T>(static_cast<uint8_t>(b))), b) << b;
}

TEST(StorageDType, EveryFloat8PatternRoundTrips) {
  auto check = [&]<class T>() {
    if constexpr (!is_small_float_v<T>)
      return;
    else
      for (int b = 0; b < 256; ++b) {
        float v = value_of<T>(static_cast<uint8_t>(b));
        // E8M0's 2^-127 is a float subnormal, which ONNX's rule ("up" when the float has fraction
        // bits) sends to 2^-126.
        if (std::isnan(v) || (dtype_of<T> == DType::kF8E8M0 && b == 0)) continue;
        EXPECT_EQ(bits_of<T>(v, false), b) << dtype_name(dtype_of<T>) << " " << b;
      }
  };
  dispatch_with_storage(DType::kF8E4M3FN, kSmallFloatTypes, "", check);
  dispatch_with_storage(DType::kF8E4M3FNUZ, kSmallFloatTypes, "", check);
  dispatch_with_storage(DType::kF8E5M2, kSmallFloatTypes, "", check);
  dispatch_with_storage(DType::kF8E5M2FNUZ, kSmallFloatTypes, "", check);
  dispatch_with_storage(DType::kF8E8M0, kSmallFloatTypes, "", check);
}

TEST(StorageDType, SmallIntsWrapAndCastLikeMlDtypes) {
  EXPECT_EQ(static_cast<int>(Int4(8)), -8);
  EXPECT_EQ(static_cast<int>(Int4(-9)), 7);
  EXPECT_EQ(static_cast<int>(UInt4(16)), 0);
  EXPECT_EQ(static_cast<int>(UInt2(-1)), 3);
  EXPECT_EQ(static_cast<int>(Int2(2)), -2);
  using reference::cast_value;
  EXPECT_EQ(static_cast<int>(cast_value<Int4>(-8.5f)), -8);  // truncates
  EXPECT_EQ(static_cast<int>(cast_value<Int4>(7.9f)), 7);
  EXPECT_EQ(static_cast<int>(cast_value<Int4>(8.0f)), 0);  // out of range: 0
  EXPECT_EQ(static_cast<int>(cast_value<UInt4>(-1.0f)), 0);
  EXPECT_EQ(static_cast<int>(cast_value<UInt2>(kNaN)), 0);
  EXPECT_EQ(static_cast<int>(cast_value<Int4>(int64_t{9})), -7);  // integers wrap
  EXPECT_EQ(cast_value<int8_t>(Int4(-3)), -3);
  EXPECT_EQ(cast_value<float>(UInt4(15)), 15.0f);
  EXPECT_EQ(cast_value<Float8E4M3FN>(Int4(-3)).bits, 0xC4);  // -3 = -1.5 * 2
}

TEST(StorageDType, CastOfTensorsHonoursSaturate) {
  Tensor x = Tensor::empty(DType::kF32, {3});
  x.data<float>()[0] = 1e6f;
  x.data<float>()[1] = -kInf;
  x.data<float>()[2] = 0.3f;
  Tensor sat = reference::cast(x, DType::kF8E5M2);
  Tensor raw = reference::cast(x, DType::kF8E5M2, "[Cast]", {.saturate = false});
  EXPECT_EQ(sat.item_as_double(0), 57344.0);
  EXPECT_EQ(raw.item_as_double(0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(sat.item_as_double(1), -57344.0);
  EXPECT_EQ(raw.item_as_double(1), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(sat.item_as_double(2), 0.3125);  // 1.25 * 2^-2
  Tensor back = reference::cast(sat, DType::kF16);
  EXPECT_EQ(back.item_as_double(0), 57344.0);
}

TEST(StorageDType, PackingFollowsOnnx) {
  // int4: element 0 in the low nibble; signed values sign-extend when unpacked.
  std::vector<int8_t> i4 = {1, -2, 3};
  std::vector<uint8_t> packed(packed_nbytes(DType::kI4, 3));
  ASSERT_EQ(packed.size(), 2u);
  pack_elements(DType::kI4, i4.data(), 3, packed.data());
  EXPECT_EQ(packed[0], 0xE1);
  EXPECT_EQ(packed[1], 0x03);
  std::vector<int8_t> back(3);
  unpack_elements(DType::kI4, packed.data(), 3, back.data());
  EXPECT_EQ(back, i4);
  // uint2: four per byte, element 0 in the lowest two bits.
  std::vector<uint8_t> u2 = {1, 2, 3, 0, 1}, p2(packed_nbytes(DType::kU2, 5)), b2(5);
  ASSERT_EQ(p2.size(), 2u);
  pack_elements(DType::kU2, u2.data(), 5, p2.data());
  EXPECT_EQ(p2[0], 0x39);
  EXPECT_EQ(p2[1], 0x01);
  unpack_elements(DType::kU2, p2.data(), 5, b2.data());
  EXPECT_EQ(b2, u2);
  // int2 sign-extends; float8 is not packed.
  uint8_t p = 0x0E;  // elements 2 (-2), 3 (-1), 0, 0
  std::vector<int8_t> i2(4);
  unpack_elements(DType::kI2, &p, 4, i2.data());
  EXPECT_EQ(i2, (std::vector<int8_t>{-2, -1, 0, 0}));
  EXPECT_EQ(packed_nbytes(DType::kF8E4M3FN, 3), 3u);
  EXPECT_EQ(packed_bits(DType::kF4E2M1), 4);
}

TEST(StorageDType, NamesAndOnnxCodes) {
  EXPECT_EQ(dtype_from_name("float8_e4m3fn"), DType::kF8E4M3FN);
  EXPECT_EQ(dtype_from_name("i4"), DType::kI4);
  EXPECT_EQ(dtype_from_onnx_code(24, ""), DType::kF8E8M0);
  EXPECT_EQ(dtype_from_onnx_code(26, ""), DType::kI2);
  EXPECT_EQ(onnx_code(DType::kF4E2M1), 23);
  EXPECT_TRUE(is_storage_only(DType::kU2));
  EXPECT_FALSE(is_floating(DType::kF8E5M2));
  EXPECT_FALSE(is_integral(DType::kI4));
  EXPECT_EQ(dtype_size(DType::kI4), 1u);
  // Kernels that do not name the storage sets never see these dtypes.
  EXPECT_THROW(dispatch(DType::kF8E4M3FN, kAllTypes, "[X]", []<class T>() {}), UnsupportedError);
}

// Small constants print inline and parse back to the same bits.
TEST(StorageDType, InlineConstantsPrintAndParse) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{3}});
  Tensor w = Tensor::empty(DType::kI4, {3});
  const int8_t values[3] = {-6, -1, 4};  // i4 is a sign-extended byte each
  std::memcpy(w.raw_data(), values, 3);
  Tensor s = Tensor::empty(DType::kF8E4M3FN, {});
  s.data<Float8E4M3FN>()->bits = 0x31;  // 0.5625
  ValueId wv = g.add_value("w"), sv = g.add_value("s"), d = g.add_value("d"), y = g.add_value("y");
  g.set_initializer(wv, w);
  g.set_initializer(sv, s);
  Attributes to;
  to.set("to", int64_t{1});
  ValueId sf = g.add_value("sf");
  g.add_node("Cast", {sv}, {sf}, to, "c");
  g.add_node("DequantizeLinear", {wv, sf}, {d}, {}, "dq");
  g.add_node("Add", {x, d}, {y}, {}, "add");
  g.add_output(y);
  const std::string text = print(g);
  EXPECT_NE(text.find("i4[3] = [-6, -1, 4]"), std::string::npos) << text;
  EXPECT_NE(text.find("f8e4m3fn[] = [0.5625]"), std::string::npos) << text;
  Graph back = parse_graph(text);
  EXPECT_EQ(print(back), text);
  EXPECT_THROW(parse_graph("graph main (opset 21)\n  %w: i4[1] = [8]\n  return %w\n"), ValueError);
}

// BitCast keeps the bits: a sub-byte value is masked to its width and sign-extended for a signed
// target (i4 -1 is 0xF, u4 15 and back); widths must agree; a bool takes only 0 or 1.
TEST(StorageDType, BitCastKeepsTheBits) {
  auto bit_cast = [](const Tensor& x, DType to) {
    Graph g;
    ValueId in = g.add_input("x", {x.dtype(), Shape{x.shape()[0]}});
    ValueId out = g.add_value("y");
    Attributes a;
    a.set("to", int64_t{onnx_code(to)});
    g.add_node("BitCast", {in}, {out}, a, "b");
    g.add_output(out);
    return reference::run(g, {x})[0];
  };
  Tensor i4 = Tensor::empty(DType::kI4, {4});
  const int8_t signed_values[4] = {-1, -8, 7, 0};
  std::memcpy(i4.raw_data(), signed_values, 4);
  Tensor u4 = bit_cast(i4, DType::kU4);
  ASSERT_EQ(u4.dtype(), DType::kU4);
  const uint8_t want_u4[4] = {15, 8, 7, 0};
  EXPECT_EQ(std::memcmp(u4.raw_data(), want_u4, 4), 0);
  Tensor back = bit_cast(u4, DType::kI4);
  EXPECT_EQ(std::memcmp(back.raw_data(), signed_values, 4), 0);

  Tensor f = Tensor::empty(DType::kF32, {2});
  f.data<float>()[0] = 1.0f;
  f.data<float>()[1] = -2.0f;
  Tensor i = bit_cast(f, DType::kI32);
  EXPECT_EQ(i.data<int32_t>()[0], 0x3F800000);
  EXPECT_EQ(static_cast<uint32_t>(i.data<int32_t>()[1]), 0xC0000000u);

  EXPECT_THROW(bit_cast(f, DType::kI64), ValueError);
  Tensor u8 = Tensor::empty(DType::kU8, {2});
  u8.data<uint8_t>()[0] = 1;
  u8.data<uint8_t>()[1] = 2;
  EXPECT_THROW(bit_cast(u8, DType::kBool), ValueError);
}

}  // namespace
}  // namespace pto
