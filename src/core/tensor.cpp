#include "pto/tensor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

namespace pto {
namespace {

size_t physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return size_t{1} << 34;
  return static_cast<size_t>(pages) * static_cast<size_t>(page);
}

std::atomic<size_t>& max_bytes() {
  static std::atomic<size_t> n{physical_memory_bytes()};
  return n;
}

// Copies a strided tensor of `itemsize` bytes per element into packed row-major order.
void pack_copy(const std::byte* src, const Dims& shape, const Dims& strides, size_t itemsize,
               std::byte* dst) {
  int64_t rank = static_cast<int64_t>(shape.size());
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n == 0) return;
  Dims idx(rank, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int64_t k = 0; k < rank; ++k) off += idx[k] * strides[k];
    std::memcpy(dst + i * itemsize, src + off * static_cast<int64_t>(itemsize), itemsize);
    for (int64_t k = rank - 1; k >= 0; --k) {
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
  }
}

}  // namespace

static thread_local std::shared_ptr<Allocator> t_allocator;

// Tensors outside a run (weights, results) of at least this size get pages of their own.
constexpr size_t kMapBytes = size_t{1} << 20;

AllocatorScope::AllocatorScope(std::shared_ptr<Allocator> a) : saved_(std::move(t_allocator)) {
  t_allocator = std::move(a);
}
AllocatorScope::~AllocatorScope() {
  t_allocator = std::move(saved_);
}

size_t max_tensor_bytes() {
  return max_bytes().load();
}
void set_max_tensor_bytes(size_t n) {
  max_bytes().store(n);
}

Storage::Storage(size_t nbytes) : nbytes_(nbytes) {
  if (nbytes > max_tensor_bytes())
    throw ValueError(cat("allocation of ", nbytes, " bytes exceeds the limit of ",
                         max_tensor_bytes(), " bytes"));
  if (t_allocator) {
    data_ = static_cast<std::byte*>(t_allocator->allocate(nbytes));
    release_ = [a = t_allocator, p = data_, nbytes] { a->deallocate(p, nbytes); };
    return;
  }
  size_t rounded =
      (std::max<size_t>(nbytes, 1) + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (rounded >= kMapBytes) {
    // Mapped on its own: freeing it gives the pages back at once. malloc keeps freed heap
    // memory for reuse, so weights dropped after packing (or a model dropped by the caller)
    // would otherwise stay resident.
    void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw ValueError(cat("out of memory allocating ", nbytes, " bytes"));
    data_ = static_cast<std::byte*>(p);
    release_ = [p, rounded] { munmap(p, rounded); };
    return;
  }
  data_ = static_cast<std::byte*>(std::aligned_alloc(kTensorAlignment, rounded));
  if (!data_) throw ValueError(cat("out of memory allocating ", nbytes, " bytes"));
}

Storage::Storage(void* data, size_t nbytes, std::function<void()> release)
    : data_(static_cast<std::byte*>(data)),
      nbytes_(nbytes),
      release_(std::move(release)),
      external_(true) {}

Storage::~Storage() {
  if (release_)
    release_();
  else
    std::free(data_);
}

Tensor Tensor::empty(DType dtype, Dims shape) {
  PTO_CHECK(dtype != DType::kUndefined) << "Tensor::empty with undefined dtype";
  Tensor t;
  t.numel_ = checked_numel(shape, "tensor");
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(t.numel_), dtype_size(dtype), &bytes))
    throw ValueError(cat("tensor of shape ", dims_str(shape), " is too large"));
  t.storage_ = std::make_shared<Storage>(bytes);
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::zeros(DType dtype, Dims shape) {
  Tensor t = empty(dtype, std::move(shape));
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, DType dtype, Dims shape, Dims strides,
                    std::function<void()> release) {
  Tensor t;
  t.numel_ = checked_numel(shape, "tensor");
  if (strides.empty()) strides = contiguous_strides(shape);
  PTO_CHECK(strides.size() == shape.size()) << "wrap: strides rank differs from shape rank";
  // The extent of memory the view touches, for Storage bookkeeping.
  int64_t extent = t.numel_ ? 1 : 0;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] > 0) extent += (shape[i] - 1) * std::abs(strides[i]);
  t.storage_ = std::make_shared<Storage>(data, static_cast<size_t>(extent) * dtype_size(dtype),
                                         std::move(release));
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  return t;
}

int64_t Tensor::dim(int64_t i) const {
  return shape_[normalize_axis(i, rank(), "Tensor::dim")];
}

bool Tensor::is_contiguous() const {
  if (numel_ == 0) return true;  // nothing to address; also avoids overflow on huge empty dims
  int64_t expect = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expect) return false;
    expect *= shape_[i];
  }
  return true;
}

Tensor Tensor::sequence(std::vector<Tensor> items) {
  for (const Tensor& t : items)
    PTO_CHECK(t.defined() && t.is_tensor()) << "a sequence element is " << t.str();
  Tensor s;
  s.kind_ = ValueKind::kSequence;
  s.items_ = std::make_shared<const std::vector<Tensor>>(std::move(items));
  return s;
}

Tensor Tensor::none() {
  Tensor t;
  t.kind_ = ValueKind::kNone;
  return t;
}

const std::vector<Tensor>& Tensor::items() const {
  PTO_CHECK(kind_ == ValueKind::kSequence) << "items() of " << str();
  return *items_;
}

Tensor Tensor::contiguous() const {
  if (!defined() || is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  if (!defined()) return *this;
  if (kind_ == ValueKind::kSequence) {
    std::vector<Tensor> items;
    for (const Tensor& t : *items_) items.push_back(t.clone());
    return sequence(std::move(items));
  }
  if (kind_ == ValueKind::kNone) return *this;
  Tensor out = empty(dtype_, shape_);
  if (is_contiguous())
    std::memcpy(out.raw_data(), raw_data(), nbytes());
  else
    pack_copy(static_cast<const std::byte*>(raw_data()), shape_, strides_, itemsize(),
              static_cast<std::byte*>(out.raw_data()));
  return out;
}

Tensor Tensor::reshape(Dims shape) const {
  int64_t n = checked_numel(shape, "reshape");
  if (n != numel_)
    throw ValueError(cat("reshape: cannot view ", dims_str(shape_), " (", numel_, " elements) as ",
                         dims_str(shape), " (", n, " elements)"));
  Tensor t = contiguous();
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::view(Dims shape, Dims strides, int64_t element_offset) const {
  PTO_CHECK(shape.size() == strides.size()) << "view: rank mismatch";
  // Field by field, not a copy of *this: its shape and strides would be allocated only to be
  // replaced (views are made per step of a Scan and by every Reshape).
  Tensor t;
  t.storage_ = storage_;
  t.dtype_ = dtype_;
  t.kind_ = kind_;
  t.items_ = items_;
  t.offset_bytes_ = offset_bytes_ + static_cast<size_t>(element_offset) * itemsize();
  t.numel_ = checked_numel(shape, "view");
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  return t;
}

double Tensor::item_as_double(int64_t i) const {
  PTO_CHECK(i >= 0 && i < numel_) << "item index " << i << " out of range " << numel_;
  int64_t off = 0;
  for (size_t k = shape_.size(); k-- > 0;) {
    off += (i % shape_[k]) * strides_[k];
    i /= shape_[k];
  }
  return dispatch_with_storage(dtype_, kAllTypes | kStorageTypes, "item", [&]<class T>() {
    return static_cast<double>(static_cast<compute_t<T>>(static_cast<const T*>(raw_data())[off]));
  });
}

std::string Tensor::str() const {
  if (!defined()) return "undefined";
  if (kind_ == ValueKind::kNone) return "none";
  if (kind_ == ValueKind::kSequence) {
    std::string s = "seq(";
    for (size_t i = 0; i < items_->size(); ++i) s += (i ? ", " : "") + (*items_)[i].str();
    return s + ")";
  }
  return cat(dtype_name(dtype_), dims_str(shape_));
}

}  // namespace pto
