#include "services/wire/frame_codec.h"

#include <algorithm>
#include <cstring>

#include "common/status_macros.h"
#include "services/wire/frame_layout.h"
#include "services/wire/quantize.h"
#include "spec/vocabulary.h"
#include "spec/wire_size.h"
#include "worker/compute/half.h"

namespace pipetrain {
namespace {

using wire_internal::AlignUp;
using wire_internal::IsPayloadTensor;
using wire_internal::kAlign;
using wire_internal::Layout;
using wire_internal::LayoutOf;
using wire_internal::QuantizationOf;
using wire_internal::QuantizedDType;
using wire_internal::RowLength;

const char kZeros[kAlign] = {};

v1::FrameKind KindToProto(MessageKind kind) {
  switch (kind) {
    case MessageKind::kActivation:
      return v1::FRAME_KIND_ACTIVATION;
    case MessageKind::kGradient:
      return v1::FRAME_KIND_GRADIENT;
    case MessageKind::kNormPartial:
      return v1::FRAME_KIND_NORM_PARTIAL;
    case MessageKind::kNormTotal:
      return v1::FRAME_KIND_NORM_TOTAL;
    case MessageKind::kEvalActivation:
      return v1::FRAME_KIND_EVAL_ACTIVATION;
  }
  return v1::FRAME_KIND_UNSPECIFIED;
}

// Narrows n floats into 16-bit `to` elements at `dst`, which may be at any
// alignment: a small gRPC slice keeps its bytes inline at an odd offset, so
// the elements are stored bytewise (a uint16_t store there would be
// undefined behaviour).
void Narrow(const float* src, int64_t n, DType to, uint8_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v =
        to == DType::kBF16 ? FloatToBf16(src[i]) : FloatToHalf(src[i]);
    std::memcpy(dst + 2 * i, &v, sizeof(v));
  }
}

grpc::Slice HeaderSlice(const v1::FrameHeader& header) {
  const std::string bytes = header.SerializeAsString();
  grpc::Slice slice(4 + bytes.size());
  uint8_t* p = const_cast<uint8_t*>(slice.begin());
  const uint32_t n = static_cast<uint32_t>(bytes.size());
  p[0] = n & 0xff;
  p[1] = (n >> 8) & 0xff;
  p[2] = (n >> 16) & 0xff;
  p[3] = (n >> 24) & 0xff;
  std::memcpy(p + 4, bytes.data(), bytes.size());
  return slice;
}

void ReleaseStorage(void* holder) {
  delete static_cast<std::shared_ptr<Storage>*>(holder);
}

// A slice over `len` bytes of a tensor that keeps its storage alive.
grpc::Slice PayloadSlice(const Tensor& t, int64_t offset, int64_t len) {
  auto* holder = new std::shared_ptr<Storage>(t.storage());
  return grpc::Slice(static_cast<char*>(t.raw()) + offset,
                     static_cast<size_t>(len), &ReleaseStorage, holder);
}

// Bytes [offset, offset + len) of float32 tensor `t` narrowed to 16-bit
// `wire` elements, written straight into a new slice (offset and len count
// wire bytes and fall on element boundaries).
grpc::Slice NarrowedSlice(const Tensor& t, DType wire, int64_t offset,
                          int64_t len) {
  grpc::Slice slice(static_cast<size_t>(len));
  Narrow(t.f32() + offset / 2, len / 2, wire,
         const_cast<uint8_t*>(slice.begin()));
  return slice;
}

// The header of `message`'s frames (offset and total still to set): its
// float32 payload tensor travels quantized as `q` says or else as `wire`,
// the others as they are.
absl::StatusOr<v1::FrameHeader> MessageHeader(const std::string& job_id,
                                              const StageMessage& message,
                                              DType wire,
                                              v1::WireQuantization q,
                                              int32_t group_size) {
  v1::FrameHeader header;
  header.set_kind(KindToProto(message.kind));
  header.set_job_id(job_id);
  header.set_step(message.step);
  header.set_micro_batch(message.micro_batch);
  header.set_chunk(message.chunk);
  header.set_weight_version(message.weight_version);
  header.set_value(message.value);
  header.set_samples(message.samples);
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    const Tensor& t = message.tensors[i];
    if (t.empty() || t.device() != Device::kCpu) {
      return absl::InvalidArgumentError("frames carry host tensors only");
    }
    const bool narrow =
        IsPayloadTensor(message.kind, i) && t.dtype() == DType::kF32;
    v1::TensorMeta* meta = header.add_tensors();
    meta->set_dtype(DTypeToProto(narrow ? wire : t.dtype()));
    if (narrow && q != v1::WIRE_QUANTIZATION_NONE) {
      meta->set_dtype(QuantizedDType(q));
      meta->set_group_size(static_cast<int32_t>(
          EffectiveWireGroupSize(group_size, RowLength(t.shape()))));
    }
    for (int64_t d : t.shape()) meta->add_shape(d);
  }
  return header;
}

// Appends the slices of payload bytes [offset, end): the tensors (narrowed
// where the layout says so, quantized ones from their encoded bytes in
// `quantized`) and the alignment gaps between them.
void AppendPayload(const StageMessage& message, const Layout& layout,
                   const std::vector<grpc::Slice>& quantized, int64_t offset,
                   int64_t end, std::vector<grpc::Slice>* slices) {
  int64_t pos = offset;
  for (size_t i = 0; i < message.tensors.size() && pos < end; ++i) {
    const int64_t t_begin = layout.offsets[i];
    const int64_t t_end = t_begin + layout.sizes[i];
    if (pos < t_begin) {  // alignment gap before tensor i
      const int64_t gap = std::min(end, t_begin) - pos;
      slices->emplace_back(kZeros, gap, grpc::Slice::STATIC_SLICE);
      pos += gap;
    }
    if (pos >= t_begin && pos < t_end && pos < end) {
      const Tensor& t = message.tensors[i];
      const int64_t len = std::min(end, t_end) - pos;
      if (layout.quantized[i].bits > 0) {
        slices->push_back(quantized[i].sub(pos - t_begin, pos - t_begin + len));
        pos += len;
        continue;
      }
      slices->push_back(
          layout.dtypes[i] == t.dtype()
              ? PayloadSlice(t, pos - t_begin, len)
              : NarrowedSlice(t, layout.dtypes[i], pos - t_begin, len));
      pos += len;
    }
  }
}

}  // namespace

grpc::ByteBuffer EncodeHello(const std::string& job_id, int stage) {
  v1::FrameHeader header;
  header.set_kind(v1::FRAME_KIND_HELLO);
  header.set_job_id(job_id);
  header.set_stage(stage);
  grpc::Slice slice = HeaderSlice(header);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer EncodeEchoHello() {
  v1::FrameHeader header;
  header.set_kind(v1::FRAME_KIND_HELLO);
  header.set_echo(true);
  grpc::Slice slice = HeaderSlice(header);
  return grpc::ByteBuffer(&slice, 1);
}

uint64_t WireSeed(const std::string& job_id, int stage) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a: stable across builds
  for (unsigned char c : job_id) h = (h ^ c) * 0x100000001b3ull;
  return MixSeed(h, static_cast<uint64_t>(stage), 0, 0);
}

v1::WireQuantization PayloadQuantization(const WireFormat& format,
                                         MessageKind kind) {
  if (!IsPayloadTensor(kind, 0)) return v1::WIRE_QUANTIZATION_NONE;
  return DirectionQuantization(format.compression,
                               kind == MessageKind::kGradient);
}

int64_t WirePayloadBytes(const StageMessage& message, v1::DType wire_dtype) {
  WireFormat format;
  format.dtype = wire_dtype;
  return WirePayloadBytes(message, format);
}

int64_t WirePayloadBytes(const StageMessage& message,
                         const WireFormat& format) {
  const absl::StatusOr<DType> wire = DTypeFromProto(format.dtype);
  const v1::WireQuantization q = PayloadQuantization(format, message.kind);
  int64_t n = 0;
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    const Tensor& t = message.tensors[i];
    const bool narrow = wire.ok() && IsPayloadTensor(message.kind, i) &&
                        t.dtype() == DType::kF32;
    if (narrow && q != v1::WIRE_QUANTIZATION_NONE) {
      n += StreamedTensorWireBytes(t.shape(), v1::DTYPE_F32, q,
                                   format.compression.group_size());
      continue;
    }
    n +=
        t.numel() * static_cast<int64_t>(DTypeSize(narrow ? *wire : t.dtype()));
  }
  return n;
}

absl::StatusOr<std::vector<grpc::ByteBuffer>> EncodeMessage(
    const std::string& job_id, const StageMessage& message,
    v1::DType wire_dtype, size_t chunk_bytes) {
  WireFormat format;
  format.dtype = wire_dtype;
  return EncodeMessage(job_id, message, format, chunk_bytes);
}

absl::StatusOr<std::vector<grpc::ByteBuffer>> EncodeMessage(
    const std::string& job_id, const StageMessage& message,
    const WireFormat& format, size_t chunk_bytes, float* residual) {
  ASSIGN_OR_RETURN(const DType wire, DTypeFromProto(format.dtype));
  const v1::WireQuantization q = PayloadQuantization(format, message.kind);
  ASSIGN_OR_RETURN(
      v1::FrameHeader header,
      MessageHeader(job_id, message, wire, q, format.compression.group_size()));
  ASSIGN_OR_RETURN(Layout layout, LayoutOf(header));
  header.set_total_bytes(layout.total);
  // Quantized tensors are encoded once, into the buffer their frames'
  // payload slices share.
  std::vector<grpc::Slice> quantized(message.tensors.size());
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    const Layout::Quantized& lq = layout.quantized[i];
    if (lq.bits == 0) continue;
    QuantizeOptions options;
    options.bits = lq.bits;
    options.group_size = lq.group;
    options.stochastic =
        format.compression.rounding() == v1::WIRE_ROUNDING_STOCHASTIC;
    options.seed = MixSeed(format.seed,
                           (static_cast<uint64_t>(message.kind) << 32) ^
                               static_cast<uint32_t>(message.chunk),
                           static_cast<uint64_t>(message.step),
                           static_cast<uint64_t>(message.micro_batch));
    quantized[i] = grpc::Slice(static_cast<size_t>(layout.sizes[i]));
    RETURN_IF_ERROR(
        QuantizeRows(message.tensors[i].f32(), lq.rows, lq.cols, options,
                     const_cast<uint8_t*>(quantized[i].begin()), residual));
  }
  const int64_t chunk = AlignUp(std::max<int64_t>(kAlign, chunk_bytes));
  std::vector<grpc::ByteBuffer> frames;
  int64_t offset = 0;
  do {
    const int64_t end = std::min(layout.total, offset + chunk);
    header.set_offset(offset);
    std::vector<grpc::Slice> slices = {HeaderSlice(header)};
    AppendPayload(message, layout, quantized, offset, end, &slices);
    frames.emplace_back(slices.data(), slices.size());
    offset = end;
  } while (offset < layout.total);
  return frames;
}

}  // namespace pipetrain
