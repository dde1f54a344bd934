// Model inputs for the commands that run a model (`pto run`, `check`, `bench`): from .npy files
// or random from the declared shapes, with the options that choose them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "pto/graph.h"

namespace pto::cli {

struct InputSpec {
  std::vector<std::pair<std::string, std::string>> files;  // input name, file(s) (--input)
  std::map<std::string, int64_t> dims;                     // symbol -> size (--dim)
  uint64_t seed = 0;
};

// Takes the current argument when it is --input NAME=FILE.npy, --dim SYMBOL=N or --seed N
// (UsageError for a malformed value); false for any other argument.
bool read_input_option(ArgReader& a, InputSpec& spec);

// Graph inputs in order: from files where given (.npy; for a sequence input a comma-separated
// list of .npy files, one per element; or ONNX test data .pb: a TensorProto, SequenceProto or
// OptionalProto), else random from the declared type (floats uniform in [-1, 1), integers in
// [0, 10), bools either way; an optional input not given is empty; a sequence input must be
// given); one line per input on stdout.
// A symbolic dimension takes --dim, else the size a file gave it, else 1 (a note on stderr).
std::vector<Tensor> make_inputs(const Graph& g, const InputSpec& spec);

}  // namespace pto::cli
