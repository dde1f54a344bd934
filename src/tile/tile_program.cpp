// TileProgram printing and construction helpers (see tile_program.h).
#include "tile/tile_program.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace pto {

DType graph_dtype(TileDType d) {
  switch (d) {
    case TileDType::kBool:
      return DType::kBool;
    case TileDType::kI32:
      return DType::kI32;
    case TileDType::kBF16:
      return DType::kBF16;
    case TileDType::kF16:
      return DType::kF16;
    case TileDType::kU8:
      return DType::kU8;
    case TileDType::kI8:
      return DType::kI8;
    case TileDType::kF32:
      break;
  }
  return DType::kF32;
}

std::optional<TileDType> tile_dtype_of(DType d) {
  for (TileDType t : {TileDType::kF32, TileDType::kBool, TileDType::kI32, TileDType::kBF16,
                      TileDType::kF16, TileDType::kU8, TileDType::kI8})
    if (graph_dtype(t) == d) return t;
  return std::nullopt;
}

size_t tile_itemsize(TileDType d) {
  return dtype_size(graph_dtype(d));
}

const char* tile_dtype_name(TileDType d) {
  return dtype_name(graph_dtype(d)).data();
}

const char* tile_unary_name(TileUnary op) {
  switch (op) {
#define PTO_TILE_CASE(name, text) \
  case TileUnary::k##name:        \
    return text;
    PTO_TILE_UNARY_OPS(PTO_TILE_CASE)
#undef PTO_TILE_CASE
  }
  return "?";
}

const char* tile_binary_name(TileBinary op) {
  static const char* const kNames[] = {"add", "sub", "mul", "div", "max",
                                       "min", "pow", "and", "or",  "xor"};
  return kNames[static_cast<int>(op)];
}

const char* tile_compare_name(TileCompare op) {
  static const char* const kNames[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  return kNames[static_cast<int>(op)];
}

const char* tile_reduce_name(TileReduce op) {
  static const char* const kNames[] = {"row_sum", "row_max", "row_min"};
  return kNames[static_cast<int>(op)];
}

bool TileProgram::has_row_reduction() const {
  for (const TileInstr& in : code)
    if (in.op == TileOpcode::kRowReduce) return true;
  return false;
}

size_t TileProgram::emit(const TileInstr& in) {
  for (int r : {in.dst, in.a, in.b, in.c}) num_regs = std::max(num_regs, r + 1);
  code.push_back(in);
  return code.size() - 1;
}

namespace {

// The shortest decimal that reads back as v.
std::string imm(float v) {
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v || v != v) break;
  }
  return buf;
}

std::string reg(int r) {
  std::string s = "r";  // not "r" + ...: GCC 12's -Wrestrict false positive on that form
  s += std::to_string(r);
  return s;
}

std::string operand_str(const char* kind, size_t i, const TileOperand& o) {
  std::string s = std::string(kind) + std::to_string(i) + " " + o.name + ": ";
  s += tile_dtype_name(o.dtype);
  return s + (o.shape ? shape_str(*o.shape) : "[*]");
}

std::string instr_str(const TileInstr& in) {
  std::string d = reg(in.dst) + " = ";
  switch (in.op) {
    case TileOpcode::kLoad:
      return d + "load in" + std::to_string(in.operand);
    case TileOpcode::kStore:
      return "store out" + std::to_string(in.operand) + ", " + reg(in.a);
    case TileOpcode::kConst:
      return d + "const " + imm(in.imm0);
    case TileOpcode::kUnary: {
      std::string s = d + tile_unary_name(static_cast<TileUnary>(in.fn)) + " " + reg(in.a);
      if (in.imm0 != 0.0f || in.imm1 != 0.0f) s += " {" + imm(in.imm0) + ", " + imm(in.imm1) + "}";
      return s;
    }
    case TileOpcode::kBinary:
      return d + tile_binary_name(static_cast<TileBinary>(in.fn)) + " " + reg(in.a) + ", " +
             reg(in.b);
    case TileOpcode::kBinaryImm:
      return d + tile_binary_name(static_cast<TileBinary>(in.fn)) + " " +
             (in.imm_left ? imm(in.imm0) + ", " + reg(in.a) : reg(in.a) + ", " + imm(in.imm0));
    case TileOpcode::kClip:
      return d + "clip " + reg(in.a) + ", " + imm(in.imm0) + ", " + imm(in.imm1);
    case TileOpcode::kCompare:
      return d + tile_compare_name(static_cast<TileCompare>(in.fn)) + " " + reg(in.a) + ", " +
             reg(in.b);
    case TileOpcode::kCompareImm:
      return d + tile_compare_name(static_cast<TileCompare>(in.fn)) + " " +
             (in.imm_left ? imm(in.imm0) + ", " + reg(in.a) : reg(in.a) + ", " + imm(in.imm0));
    case TileOpcode::kSelect:
      return d + "select " + reg(in.a) + ", " + reg(in.b) + ", " + reg(in.c);
    case TileOpcode::kRowReduce:
      return d + tile_reduce_name(static_cast<TileReduce>(in.fn)) + " " + reg(in.a);
    case TileOpcode::kFma:
      return d + "fma " + reg(in.a) + ", " + reg(in.b) + ", " + reg(in.c);
  }
  return "?";
}

}  // namespace

std::string TileProgram::str() const {
  std::string s = "tile program " + (shape ? shape_str(*shape) : std::string("[*]")) +
                  ", regs: " + std::to_string(num_regs) + "\n";
  for (size_t i = 0; i < inputs.size(); ++i) s += "  " + operand_str("in", i, inputs[i]) + "\n";
  for (size_t i = 0; i < outputs.size(); ++i) s += "  " + operand_str("out", i, outputs[i]) + "\n";
  for (const TileInstr& in : code) s += "    " + instr_str(in) + "\n";
  return s;
}

}  // namespace pto
