// Core types: dtypes, half conversions, shapes, broadcasting, tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "pto/tensor.h"

namespace pto {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI8, DType::kI16,
                   DType::kI32, DType::kI64, DType::kU8, DType::kBool}) {
    EXPECT_EQ(dtype_from_name(dtype_name(dt)), dt);
  }
  EXPECT_EQ(dtype_from_name("float32"), DType::kF32);
  EXPECT_THROW(dtype_from_name("float128"), ValueError);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
}

TEST(DType, Float16MatchesIeee) {
  // Values with exact half representations, subnormals, rounding and specials.
  EXPECT_EQ(Float16(1.0f).bits, 0x3c00);
  EXPECT_EQ(Float16(-2.0f).bits, 0xc000);
  EXPECT_EQ(Float16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(Float16(65520.0f).bits, 0x7c00);            // rounds to +Inf
  EXPECT_EQ(Float16(5.9604645e-8f).bits, 0x0001);       // smallest subnormal
  EXPECT_EQ(Float16(1.0f + 1.0f / 2048).bits, 0x3c00);  // tie rounds to even
  EXPECT_EQ(Float16(1.0f + 3.0f / 2048).bits, 0x3c02);  // tie rounds to even (up)
  EXPECT_TRUE(std::isnan(static_cast<float>(Float16(NAN))));
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite positive half survives a round trip
    ASSERT_EQ(Float16::from_float(Float16::to_float(static_cast<uint16_t>(h))), h);
}

TEST(DType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(BFloat16(3.140625f)), 3.140625f);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(NAN))));
}

TEST(Shape, Broadcast) {
  EXPECT_EQ(broadcast_dims({3, 1, 5}, {4, 1}, "t"), (Dims{3, 4, 5}));
  EXPECT_EQ(broadcast_dims({}, {2}, "t"), (Dims{2}));
  EXPECT_THROW(broadcast_dims({3}, {4}, "t"), ValueError);
  Shape a = {Dim::sym("batch"), 1, 7};
  Shape b = {5, 7};
  EXPECT_EQ(shape_str(broadcast_shapes(a, b, "t")), "[batch, 5, 7]");
  // x[:seq] of a 512 buffer is min(512, seq) long: it broadcasts with seq only where equal to it
  // (or both are 1), so the result is seq; with another symbol it stays unknown.
  const Shape pos = {1, Dim::sym("min(512,seq)"), 7};
  EXPECT_EQ(shape_str(broadcast_shapes(pos, {Dim::sym("batch"), Dim::sym("seq"), 7}, "t")),
            "[batch, seq, 7]");
  EXPECT_EQ(shape_str(broadcast_shapes({Dim::sym("seq"), 1}, pos, "t")), "[1, seq, 7]");
  EXPECT_EQ(shape_str(broadcast_shapes(pos, {1, Dim::sym("len"), 7}, "t")), "[1, ?, 7]");
}

// Sums of symbols, as a Concat of symbolic lengths makes them: one canonical spelling for equal
// sums (terms sorted, like terms merged, the constant last), differences only while they stay
// sizes, unknown in unknown out. For fusion a sum compares like an unknown dim.
TEST(Shape, SumsOfSymbols) {
  const Dim past = Dim::sym("past"), seq = Dim::sym("seq"), s = Dim::sym("s");
  EXPECT_EQ(dim_add(past, seq).str(), "(past+seq)");
  EXPECT_EQ(dim_add(seq, past), dim_add(past, seq));
  EXPECT_EQ(dim_add(s, s).str(), "2*s");
  EXPECT_EQ(dim_add(Dim(0), s), s);
  EXPECT_EQ(dim_add(Dim(3), Dim(4)), Dim(7));
  EXPECT_EQ(dim_add(dim_add(past, seq), Dim(1)).str(), "(past+seq+1)");
  EXPECT_EQ(dim_add(dim_add(s, Dim(1)), dim_mul(s, Dim(2))).str(), "(3*s+1)");
  EXPECT_EQ(dim_add(past, Dim::sym("min(16,seq)")).str(), "(min(16,seq)+past)");
  const Dim total = dim_add(past, seq);
  EXPECT_EQ(dim_mul(total, Dim::sym("b")).str(), "(past+seq)*b");
  EXPECT_EQ(dim_add(dim_mul(total, Dim::sym("b")), Dim(1)).str(), "((past+seq)*b+1)");
  EXPECT_FALSE(dim_add(past, Dim::unknown()).is_known() || dim_add(past, Dim()).is_symbolic());
  EXPECT_EQ(dim_sub(total, seq), past);
  EXPECT_EQ(dim_sub(dim_add(total, Dim(1)), Dim(1)), total);
  EXPECT_EQ(dim_sub(Dim(5), Dim(2)), Dim(3));
  EXPECT_FALSE(dim_sub(past, seq));  // would be negative where seq > past
  EXPECT_FALSE(dim_sub(Dim(2), Dim(5)));
  EXPECT_FALSE(dim_sub(total, Dim(1)));  // the constant would go negative
  EXPECT_TRUE(may_equal({total, 4}, {Dim::sym("len"), 4}));
  EXPECT_FALSE(may_equal({past, 4}, {Dim::sym("len"), 4}));
}

TEST(Shape, NumelOverflowIsAnError) {
  EXPECT_THROW(checked_numel({1LL << 40, 1LL << 40}), ValueError);
  EXPECT_THROW(checked_numel({-1}), ValueError);
  EXPECT_EQ(checked_numel({}), 1);
  EXPECT_EQ(checked_numel({3, 0}), 0);
}

TEST(Tensor, AlignedAndStrided) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kTensorAlignment, 0u);
  EXPECT_TRUE(t.is_contiguous());
  Tensor tr = t.view({3, 2}, {1, 3}, 0);  // transpose view
  EXPECT_FALSE(tr.is_contiguous());
  Tensor packed = tr.contiguous();
  EXPECT_EQ(packed.item_as_double(1), 4.0);
  EXPECT_EQ(packed.item_as_double(2), 2.0);
  EXPECT_THROW(t.reshape({4}), ValueError);
}

TEST(Tensor, AllocationLimitIsAnError) {
  size_t old = max_tensor_bytes();
  set_max_tensor_bytes(1 << 20);
  EXPECT_THROW(Tensor::empty(DType::kF32, {1 << 20}), ValueError);
  set_max_tensor_bytes(old);
}

}  // namespace
}  // namespace pto

namespace pto {
namespace {

TEST(DType, OnnxCodes) {
  EXPECT_EQ(dtype_from_onnx_code(1, "t"), DType::kF32);
  EXPECT_EQ(dtype_from_onnx_code(16, "t"), DType::kBF16);
  EXPECT_EQ(onnx_code(DType::kI64), 7);
  EXPECT_THROW(dtype_from_onnx_code(8, "t"), UnsupportedError);  // string
}

}  // namespace
}  // namespace pto
