// Tensor: a shaped view of device or host memory.
//
// Compute always runs in float32. bf16 and fp16 exist as storage types for
// the wire (see ConvertDType); token ids and class labels travel as exact
// float32 values so one tensor type carries everything between stages.
//
// A Tensor shares its storage (like a std::shared_ptr); copying a Tensor
// copies the view, not the data. Not thread-safe: the data may be written by
// whoever holds a view; callers order their accesses.
#ifndef PIPETRAIN_WORKER_COMPUTE_TENSOR_H_
#define PIPETRAIN_WORKER_COMPUTE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/shape.h"

namespace pipetrain {

enum class Device { kCpu = 0, kCuda = 1 };

const char* DeviceName(Device device);

// A block of memory on one device. Frees itself through `deleter`.
class Storage {
 public:
  Storage(void* data, size_t bytes, Device device,
          std::function<void(void*, size_t)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* const data_;
  const size_t bytes_;
  const Device device_;
  std::function<void(void*, size_t)> deleter_;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, Shape shape,
         DType dtype = DType::kF32, size_t byte_offset = 0);

  // A new zero-filled host (CPU) tensor. For sizes the code itself chose;
  // a size that comes from a spec, a request or a file goes through
  // TryHost.
  static Tensor Host(Shape shape, DType dtype = DType::kF32);
  // Like Host, but ResourceExhausted when the size overflows or the memory
  // cannot be had, instead of a tensor over no memory.
  static absl::StatusOr<Tensor> TryHost(Shape shape, DType dtype = DType::kF32);
  // A host tensor holding a copy of `values`.
  static Tensor HostFrom(Shape shape, absl::Span<const float> values);

  bool empty() const { return storage_ == nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return NumElements(shape_); }
  size_t bytes() const { return numel() * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw() const {
    return static_cast<char*>(storage_->data()) + byte_offset_;
  }
  // The data as float32. Only valid when dtype() == kF32.
  float* f32() const { return static_cast<float*>(raw()); }
  uint16_t* u16() const { return static_cast<uint16_t*>(raw()); }

  // The same data under another shape with as many elements.
  absl::StatusOr<Tensor> Reshaped(Shape shape) const;
  // Rows [begin, end) of the leading dimension, sharing storage.
  absl::StatusOr<Tensor> SliceRows(int64_t begin, int64_t end) const;

  // Host tensors only: a copy of the float32 data.
  std::vector<float> ToVector() const;

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::kF32;
  size_t byte_offset_ = 0;
};

// Converts a host tensor between float32, bf16 and fp16 (round to nearest
// even). Returns a new host tensor.
absl::StatusOr<Tensor> ConvertDType(const Tensor& host, DType to);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_TENSOR_H_
