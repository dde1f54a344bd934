// NumPy .npy files: read and write one Tensor (format versions 1.0, 2.0 and 3.0).
//
// dtypes map to numpy's codes: f32 '<f4', f64 '<f8', f16 '<f2', i8 '|i1' ... u64 '<u8', bool '|b1'.
// bf16 has no numpy code: reading never yields bf16, and writing a bf16 tensor throws
// UnsupportedError (cast it to f32 first). Big-endian files ('>f4') are read and byte-swapped;
// fortran_order=True files are read and returned in row-major (C) order. Every malformed file
// throws ValueError (or UnsupportedError for a valid but unsupported descr such as '<c8' or a
// structured dtype) whose message starts with the file's name.
#pragma once

#include <string>
#include <string_view>

#include "pto/tensor.h"

namespace pto {

Tensor read_npy(const std::string& path);
void write_npy(const std::string& path, const Tensor& t);

// The same on bytes in memory; `source` names the data in error messages.
Tensor parse_npy(std::string_view bytes, const std::string& source);
std::string encode_npy(const Tensor& t);

// The numpy descr of a dtype ("<f4", "|b1"); throws UnsupportedError for bf16.
std::string npy_descr(DType dt);

}  // namespace pto
