#include "worker/compute/tensor_proto.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/vocabulary.h"

namespace pipetrain {

absl::StatusOr<v1::TensorProto> TensorToProto(const std::string& name,
                                              const Tensor& host) {
  if (host.empty() || host.device() != Device::kCpu) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": only host tensors convert to TensorProto"));
  }
  v1::TensorProto proto;
  proto.set_name(name);
  proto.set_dtype(DTypeToProto(host.dtype()));
  for (int64_t d : host.shape()) proto.add_shape(d);
  proto.set_data(host.raw(), host.bytes());
  return proto;
}

absl::StatusOr<Tensor> TensorFromProto(const v1::TensorProto& proto) {
  const absl::StatusOr<DType> dtype = DTypeFromProto(proto.dtype());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(proto.name(), ": ", dtype.status().message()));
  }
  const Shape shape(proto.shape().begin(), proto.shape().end());
  // The element count, without overflowing on a hostile shape.
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          proto.name(), ": shape ", ShapeToString(shape), " has a size < 0"));
    }
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 8 / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          proto.name(), ": shape ", ShapeToString(shape), " is too large"));
    }
    n *= d;
  }
  const size_t want = static_cast<size_t>(n) * DTypeSize(*dtype);
  if (proto.data().size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        proto.name(), ": ", proto.data().size(), " bytes of data, but ",
        DTypeName(*dtype), ShapeToString(shape), " needs ", want));
  }
  ASSIGN_OR_RETURN(Tensor host, Tensor::TryHost(shape, *dtype));
  if (want > 0) std::memcpy(host.raw(), proto.data().data(), want);
  return host;
}

}  // namespace pipetrain
