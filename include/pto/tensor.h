// Tensor: a dtype, a concrete shape, strides in elements and a view into shared storage. Storage
// is 64-byte aligned; it may also wrap memory owned by someone else (numpy, torch) with no copy.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pto/dtype.h"
#include "pto/shape.h"

namespace pto {

inline constexpr size_t kTensorAlignment = 64;

// Where a tensor's bytes live. Every storage made today is on the CPU; a backend for another
// device makes storage with its own Device, and the runtime checks devices at kernel boundaries.
enum class DeviceKind : uint8_t { kCpu, kCuda };
struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const {
    return (kind == DeviceKind::kCpu ? "cpu:" : "cuda:") + std::to_string(index);
  }
};

// Where Tensor::empty gets its memory. The default is the system heap; an Executable installs
// its memory pool for the duration of a run (AllocatorScope), so that every tensor a kernel makes
// comes from, and goes back to, the pool.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;  // 64-byte aligned; throws ValueError when out
  // Called by a tensor's destructor, also while an exception unwinds: must not throw.
  virtual void deallocate(void* p, size_t nbytes) noexcept = 0;
};

// Makes `a` the allocator of Tensor::empty on this thread until the scope ends (scopes nest).
// Storage made inside keeps `a` alive and returns its memory to it when released.
class AllocatorScope {
 public:
  explicit AllocatorScope(std::shared_ptr<Allocator> a);
  ~AllocatorScope();
  AllocatorScope(const AllocatorScope&) = delete;
  AllocatorScope& operator=(const AllocatorScope&) = delete;

 private:
  std::shared_ptr<Allocator> saved_;
};

// A block of bytes. Owns 64-byte aligned memory, or wraps external memory with a release hook.
class Storage {
 public:
  explicit Storage(size_t nbytes);  // allocates, uninitialized; throws ValueError past the limit
  Storage(void* data, size_t nbytes, std::function<void()> release);  // wraps external memory
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  std::byte* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // Wrapped memory someone else owns (a torch tensor's through DLPack): dropping this Storage
  // does not free it.
  bool external() const { return external_; }

 private:
  Device device_;
  std::byte* data_ = nullptr;
  size_t nbytes_ = 0;
  std::function<void()> release_;  // how data_ is given back; empty: std::free
  bool external_ = false;
};

// Largest single tensor allocation PyPTO makes; defaults to the machine's physical memory.
// Malformed models that ask for more get a ValueError instead of an out-of-memory kill.
size_t max_tensor_bytes();
void set_max_tensor_bytes(size_t n);

// What a Tensor holds. Besides a tensor, one of ONNX's other values: a sequence of tensors, or an
// empty optional (an optional that holds something is represented by what it holds).
enum class ValueKind : uint8_t { kTensor, kSequence, kNone };

// A Tensor may carry a sequence or an empty optional instead of tensor data. Every path that moves
// values between nodes (the interpreter's value table, a backend kernel's arguments and results,
// the Executable, subgraph runs, saved inputs, the Python boundary) moves Tensors, so a container
// rides through all of them unchanged and only the ops that read sequences look inside; a
// separate Value variant would have changed every one of those signatures for a few ops. A
// container has no dtype, shape or storage (dtype() is kUndefined, numel() 0): the interpreter
// and the Executable give one only to ops declared to take it (kNonTensorValues), and an
// UnsupportedError to any other.
class Tensor {
 public:
  Tensor() = default;  // undefined: a missing optional input

  // A sequence (its elements are tensors, each shared, not copied) and the empty optional.
  static Tensor sequence(std::vector<Tensor> items);
  static Tensor none();
  ValueKind kind() const { return kind_; }
  bool is_tensor() const { return kind_ == ValueKind::kTensor; }
  // A sequence's elements; an InternalError on anything else.
  const std::vector<Tensor>& items() const;

  static Tensor empty(DType dtype, Dims shape);  // contiguous, uninitialized
  static Tensor zeros(DType dtype, Dims shape);
  template <class T>
  static Tensor scalar(T v) {
    Tensor t = empty(dtype_of<T>, {});
    *t.data<T>() = v;
    return t;
  }
  // Copies `count` elements of type T into a new tensor of the given shape.
  template <class T>
  static Tensor from_vector(const std::vector<T>& v, Dims shape) {
    Tensor t = empty(dtype_of<T>, std::move(shape));
    PTO_CHECK(static_cast<size_t>(t.numel()) == v.size()) << "from_vector size mismatch";
    for (size_t i = 0; i < v.size(); ++i) t.data<T>()[i] = v[i];
    return t;
  }
  // Wraps external memory (no copy). `strides` in elements; empty means contiguous.
  static Tensor wrap(void* data, DType dtype, Dims shape, Dims strides,
                     std::function<void()> release);

  bool defined() const { return storage_ != nullptr || kind_ != ValueKind::kTensor; }
  DType dtype() const { return dtype_; }
  const Dims& shape() const { return shape_; }
  const Dims& strides() const { return strides_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const;  // negative i counts from the end
  int64_t numel() const { return numel_; }
  size_t itemsize() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel_) * itemsize(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  Device device() const { return storage_ ? storage_->device() : Device{}; }

  void* raw_data() const { return storage_ ? storage_->data() + offset_bytes_ : nullptr; }
  template <class T>
  T* data() const {
    PTO_CHECK(dtype_of<T> == dtype_)
        << "data<" << dtype_name(dtype_of<T>) << ">() on a " << dtype_name(dtype_) << " tensor";
    return static_cast<T*>(raw_data());
  }

  Tensor contiguous() const;         // this tensor if already contiguous, else a packed copy
  Tensor clone() const;              // always a packed copy
  Tensor reshape(Dims shape) const;  // a view when contiguous; element counts must match
  // A strided view sharing storage: element offset and new shape/strides.
  Tensor view(Dims shape, Dims strides, int64_t element_offset) const;

  // Reads element i (row-major logical index) converted to double; for tests and printing.
  double item_as_double(int64_t i = 0) const;
  std::string str() const;  // "f32[2, 3]", "seq(f32[2], f32[3])", "none"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  DType dtype_ = DType::kUndefined;
  Dims shape_;
  Dims strides_;
  int64_t numel_ = 0;
  ValueKind kind_ = ValueKind::kTensor;
  std::shared_ptr<const std::vector<Tensor>> items_;  // a sequence's elements
};

}  // namespace pto
