// Test helper: builds ONNX models in memory with the protobuf classes (no Python needed), and a
// temporary folder that removes itself.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include "onnx.pb.h"

namespace pto::testing {

using DimSpec = std::variant<int64_t, std::string>;  // a size or a symbol

class ModelBuilder {
 public:
  explicit ModelBuilder(int opset = 17, const std::string& domain = "") {
    m_.set_ir_version(8);
    auto* o = m_.add_opset_import();
    o->set_domain(domain);
    o->set_version(opset);
    m_.mutable_graph()->set_name("test_graph");
  }

  ::onnx::ModelProto& model() { return m_; }
  ::onnx::GraphProto& graph() { return *m_.mutable_graph(); }
  std::string bytes() const { return m_.SerializeAsString(); }

  ::onnx::ValueInfoProto& input(const std::string& name, int elem,
                                const std::vector<DimSpec>& dims) {
    auto* vi = graph().add_input();
    set_type(*vi, name, elem, &dims);
    return *vi;
  }
  ::onnx::ValueInfoProto& output(const std::string& name, int elem = ::onnx::TensorProto::FLOAT) {
    auto* vi = graph().add_output();
    set_type(*vi, name, elem, nullptr);
    return *vi;
  }
  ::onnx::NodeProto& node(const std::string& op, const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs, const std::string& name = "") {
    auto* n = graph().add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    return *n;
  }
  // A float initializer stored as raw_data.
  ::onnx::TensorProto& raw_floats(const std::string& name, const std::vector<float>& v,
                                  const std::vector<int64_t>& dims) {
    auto& t = tensor(name, ::onnx::TensorProto::FLOAT, dims);
    t.set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
    return t;
  }
  // A float initializer stored in the typed float_data field.
  ::onnx::TensorProto& typed_floats(const std::string& name, const std::vector<float>& v,
                                    const std::vector<int64_t>& dims) {
    auto& t = tensor(name, ::onnx::TensorProto::FLOAT, dims);
    for (float f : v) t.add_float_data(f);
    return t;
  }
  ::onnx::TensorProto& tensor(const std::string& name, int elem, const std::vector<int64_t>& dims) {
    auto* t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(elem);
    for (int64_t d : dims) t->add_dims(d);
    return *t;
  }

 private:
  static void set_type(::onnx::ValueInfoProto& vi, const std::string& name, int elem,
                       const std::vector<DimSpec>* dims) {
    vi.set_name(name);
    auto* tt = vi.mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    if (!dims) return;
    auto* shape = tt->mutable_shape();
    for (const auto& d : *dims) {
      auto* dim = shape->add_dim();
      if (std::holds_alternative<int64_t>(d))
        dim->set_dim_value(std::get<int64_t>(d));
      else
        dim->set_dim_param(std::get<std::string>(d));
    }
  }

  ::onnx::ModelProto m_;
};

// A fresh folder under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("pto_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(file(name), std::ios::binary) << bytes;
    return file(name);
  }

 private:
  std::filesystem::path path_;
};

}  // namespace pto::testing
