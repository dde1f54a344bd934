// Saved compiled models: an Executable written to a file and read back without compiling again
// (pto compile -o model.pto, pto run model.pto, pypto.save / pypto.load).
//
//   pto::save_executable(exe, "model.pto");
//   pto::LoadedExecutable m = pto::load_executable("model.pto");   // no pass runs
//   std::vector<pto::Tensor> out = m.exe.run({input});
//
// The file stores the graph after the passes (with its constants), its partition into kernels,
// the compile options and what the kernels were built for (the ISA and the CPU features it
// needs); loading rebuilds the rest (packed weights, stages, liveness, memory plans), which
// depends on the machine. docs/architecture.md ("Saved models") explains the choice.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pto/executable.h"

namespace pto {

// The file layout's version: a file of another version is refused, never guessed at. Version 2
// added subgraph attributes (control flow); version 3 sequence and optional value types (flag
// bits beside a type's shape). Each reads the older versions, which have none of these.
inline constexpr uint32_t kSavedModelFormat = 3;
inline constexpr uint32_t kOldestSavedModelFormat = 1;

// What a saved model's header says.
struct SavedModelInfo {
  uint32_t format = 0;
  std::string pypto_version;              // the PyPTO that wrote it
  std::string isa;                        // the kernel ISA it was compiled for ("avx512")
  std::vector<std::string> cpu_features;  // what that ISA needs of the CPU ("avx512f", ...)
  int threads = 0;                        // the thread pool's size when it was compiled
  CompileOptions options;                 // level, memory plan, pinned tiles, ...
  std::string metadata;                   // the caller's (pypto: how to call a torch module)
  uint64_t payload_bytes = 0;
};

struct LoadedExecutable {
  Executable exe;
  SavedModelInfo info;
};

// The bytes of a saved model of `exe` (with `metadata`, any text the caller wants back).
std::string serialize_executable(const Executable& exe, const std::string& metadata = "");
// Writes them to `path` (through a temporary file and a rename, so a failed save leaves no
// half-written model). ValueError naming the path when it cannot be written.
void save_executable(const Executable& exe, const std::string& path,
                     const std::string& metadata = "");

// Reads a saved model. ValueError, starting with `where` (the path), for: not a saved model, a
// format version other than kSavedModelFormat, a truncated file, a checksum mismatch (corrupt),
// a model compiled for an ISA or CPU features this machine (or this process's PTO_ISA) lacks,
// and any inconsistency in the contents. Never runs a graph pass.
LoadedExecutable deserialize_executable(std::string_view bytes, const std::string& where);
LoadedExecutable load_executable(const std::string& path);

// Whether the file at `path` starts like a saved model (its magic bytes); false if unreadable.
bool is_saved_model(const std::string& path);

// The checksum a saved model carries over its payload: 64 bits from four lanes of a
// multiply-rotate mix of 8-byte words (several GB/s; not cryptographic).
uint64_t saved_model_checksum(const void* data, size_t bytes);

}  // namespace pto
