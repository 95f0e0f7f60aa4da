#include "worker/compute/tensor.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "worker/compute/half.h"

namespace pipetrain {

const char* DeviceName(Device device) {
  return device == Device::kCuda ? "cuda" : "cpu";
}

Storage::Storage(void* data, size_t bytes, Device device,
                 std::function<void(void*, size_t)> deleter)
    : data_(data),
      bytes_(bytes),
      device_(device),
      deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (deleter_) deleter_(data_, bytes_);
}

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, DType dtype,
               size_t byte_offset)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      dtype_(dtype),
      byte_offset_(byte_offset) {}

absl::StatusOr<Tensor> Tensor::TryHost(Shape shape, DType dtype) {
  const std::optional<int64_t> n = CheckedNumElements(shape);
  const std::optional<int64_t> want =
      n.has_value() ? CheckedMul(*n, static_cast<int64_t>(DTypeSize(dtype)))
                    : std::nullopt;
  if (!want.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate a host tensor of shape ", ShapeToString(shape)));
  }
  const size_t bytes = std::max<size_t>(static_cast<size_t>(*want), 1);
  void* data = std::calloc(bytes, 1);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory allocating ", bytes,
                     " bytes for a tensor of shape ", ShapeToString(shape)));
  }
  auto storage = std::make_shared<Storage>(
      data, bytes, Device::kCpu, [](void* p, size_t) { std::free(p); });
  return Tensor(std::move(storage), std::move(shape), dtype);
}

Tensor Tensor::Host(Shape shape, DType dtype) {
  absl::StatusOr<Tensor> t = TryHost(std::move(shape), dtype);
  // The code chose this size; running on without the memory would write
  // through null, so stop here with the reason.
  if (!t.ok()) {
    std::fprintf(stderr, "fatal: %s\n", t.status().ToString().c_str());
    std::abort();
  }
  return *std::move(t);
}

Tensor Tensor::HostFrom(Shape shape, absl::Span<const float> values) {
  Tensor t = Host(std::move(shape));
  const size_t n = std::min<size_t>(values.size(), t.numel());
  if (n > 0) std::memcpy(t.f32(), values.data(), n * sizeof(float));
  return t;
}

absl::StatusOr<Tensor> Tensor::Reshaped(Shape shape) const {
  if (NumElements(shape) != numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reshape ", ShapeToString(shape_), " to ",
                     ShapeToString(shape)));
  }
  return Tensor(storage_, std::move(shape), dtype_, byte_offset_);
}

absl::StatusOr<Tensor> Tensor::SliceRows(int64_t begin, int64_t end) const {
  if (shape_.empty() || begin < 0 || end > shape_[0] || begin > end) {
    return absl::InvalidArgumentError(absl::StrCat("rows [", begin, ", ", end,
                                                   ") out of range for ",
                                                   ShapeToString(shape_)));
  }
  Shape shape = shape_;
  shape[0] = end - begin;
  const size_t row_bytes = (shape_[0] == 0 ? 0 : bytes() / shape_[0]);
  return Tensor(storage_, std::move(shape), dtype_,
                byte_offset_ + begin * row_bytes);
}

std::vector<float> Tensor::ToVector() const {
  std::vector<float> out(numel());
  if (!out.empty()) std::memcpy(out.data(), f32(), out.size() * sizeof(float));
  return out;
}

absl::StatusOr<Tensor> ConvertDType(const Tensor& host, DType to) {
  if (host.device() != Device::kCpu) {
    return absl::InvalidArgumentError("ConvertDType needs a host tensor");
  }
  if (host.dtype() == to) return host;
  absl::StatusOr<Tensor> allocated = Tensor::TryHost(host.shape(), to);
  if (!allocated.ok()) return allocated.status();
  Tensor out = *std::move(allocated);
  const int64_t n = host.numel();
  if (host.dtype() == DType::kF32) {
    const float* src = host.f32();
    uint16_t* dst = out.u16();
    if (to == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
    }
    return out;
  }
  if (to != DType::kF32) {
    // Half <-> bf16 goes through float32.
    absl::StatusOr<Tensor> f = ConvertDType(host, DType::kF32);
    if (!f.ok()) return f.status();
    return ConvertDType(*f, to);
  }
  const uint16_t* src = host.u16();
  float* dst = out.f32();
  if (host.dtype() == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
  }
  return out;
}

}  // namespace pipetrain
