#include "services/wire/frame_codec.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/wire/quantize.h"
#include "spec/vocabulary.h"
#include "spec/wire_size.h"
#include "worker/compute/half.h"

namespace pipetrain {
namespace {

constexpr int64_t kAlign = 8;
constexpr int64_t kMaxHeaderBytes = 1 << 20;
const char kZeros[kAlign] = {};

int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

absl::StatusOr<MessageKind> KindFromProto(v1::FrameKind kind) {
  switch (kind) {
    case v1::FRAME_KIND_ACTIVATION:
      return MessageKind::kActivation;
    case v1::FRAME_KIND_GRADIENT:
      return MessageKind::kGradient;
    case v1::FRAME_KIND_NORM_PARTIAL:
      return MessageKind::kNormPartial;
    case v1::FRAME_KIND_NORM_TOTAL:
      return MessageKind::kNormTotal;
    case v1::FRAME_KIND_EVAL_ACTIVATION:
      return MessageKind::kEvalActivation;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unexpected frame kind ", static_cast<int>(kind)));
}

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

// Whether tensor `index` of a `kind` message is its payload (the
// activation or gradient itself), which travels in the wire dtype; any
// other travels as exact float32 (none do today: labels stay with the last
// stage, which reads them itself).
bool IsPayloadTensor(MessageKind kind, size_t index) {
  return index == 0 && (kind == MessageKind::kActivation ||
                        kind == MessageKind::kEvalActivation ||
                        kind == MessageKind::kGradient);
}

// Whether two frames describe the same message: every header field but the
// frame's own byte offset. The buffer and the layout of a message come from
// its first frame; a later frame with other shapes but the same byte count
// would otherwise be read with a layout the buffer was not sized for.
bool SameMessage(const v1::FrameHeader& a, const v1::FrameHeader& b) {
  if (a.total_bytes() != b.total_bytes() ||
      a.weight_version() != b.weight_version() || a.job_id() != b.job_id() ||
      a.samples() != b.samples() || a.tensors_size() != b.tensors_size()) {
    return false;
  }
  for (int i = 0; i < a.tensors_size(); ++i) {
    const v1::TensorMeta& x = a.tensors(i);
    const v1::TensorMeta& y = b.tensors(i);
    if (x.dtype() != y.dtype() || x.group_size() != y.group_size() ||
        !std::equal(x.shape().begin(), x.shape().end(), y.shape().begin(),
                    y.shape().end())) {
      return false;
    }
  }
  return true;
}

// Byte offsets of each tensor in the payload and the payload's size.
struct Layout {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  // A quantized tensor's dtype is float32, what it decodes to.
  std::vector<DType> dtypes;
  // Quantized tensors: code bits (0: not quantized), rows, elements per
  // row, the group size and the bytes of a row.
  struct Quantized {
    int bits = 0;
    int64_t rows = 0;
    int64_t cols = 0;
    int64_t group = 1;
    int64_t row_bytes = 0;
  };
  std::vector<Quantized> quantized;
  int64_t total = 0;
};

v1::WireQuantization QuantizationOf(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_INT8:
      return v1::WIRE_QUANTIZATION_INT8;
    case v1::DTYPE_INT4:
      return v1::WIRE_QUANTIZATION_INT4;
    default:
      return v1::WIRE_QUANTIZATION_NONE;
  }
}

v1::DType QuantizedDType(v1::WireQuantization q) {
  return q == v1::WIRE_QUANTIZATION_INT8 ? v1::DTYPE_INT8 : v1::DTYPE_INT4;
}

// The elements per row of a tensor of `shape` (its last dimension; a
// scalar is one row of one).
template <typename Dims>
int64_t RowLength(const Dims& shape) {
  return shape.empty() ? 1 : *(shape.end() - 1);
}

// A wire dtype's name: f32, bf16, f16, int8, int4.
std::string WireDTypeName(v1::DType dtype) {
  const v1::WireQuantization q = QuantizationOf(dtype);
  if (q != v1::WIRE_QUANTIZATION_NONE) return WireQuantizationName(q);
  const absl::StatusOr<DType> known = DTypeFromProto(dtype);
  return known.ok() ? DTypeName(*known)
                    : absl::StrCat("unknown(", static_cast<int>(dtype), ")");
}

// The layout of the header's tensors; with `as_f32`, of the same tensors
// widened to float32 (what the decoder assembles).
absl::StatusOr<Layout> LayoutOf(const v1::FrameHeader& header,
                                bool as_f32 = false) {
  Layout layout;
  for (const v1::TensorMeta& meta : header.tensors()) {
    const v1::WireQuantization q = QuantizationOf(meta.dtype());
    DType dtype = DType::kF32;
    if (q == v1::WIRE_QUANTIZATION_NONE) {
      ASSIGN_OR_RETURN(dtype, DTypeFromProto(meta.dtype()));
    }
    if (as_f32) dtype = DType::kF32;
    int64_t n = 1;
    for (int64_t d : meta.shape()) {
      if (d < 0 || d > kMaxMessageBytes) {
        return absl::InvalidArgumentError(absl::StrCat("bad dimension ", d));
      }
      n *= d;
      if (n > kMaxMessageBytes) {
        return absl::InvalidArgumentError("tensor too large");
      }
    }
    Layout::Quantized quantized;
    int64_t size = n * static_cast<int64_t>(DTypeSize(dtype));
    if (q != v1::WIRE_QUANTIZATION_NONE && !as_f32 && n > 0) {
      quantized.bits = WireQuantizationBits(q);
      quantized.cols = RowLength(meta.shape());
      quantized.rows = n / quantized.cols;
      if (meta.group_size() < 1 || meta.group_size() > quantized.cols) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a quantized tensor's group size ", meta.group_size(),
            " is outside [1, ", quantized.cols, "] (its row length)"));
      }
      quantized.group = meta.group_size();
      quantized.row_bytes =
          QuantizedRowBytes(quantized.cols, quantized.bits, quantized.group);
      const std::vector<int64_t> shape(meta.shape().begin(),
                                       meta.shape().end());
      size =
          StreamedTensorWireBytes(shape, v1::DTYPE_F32, q, meta.group_size());
    } else if (q != v1::WIRE_QUANTIZATION_NONE && !as_f32) {
      size = 0;  // no elements
    }
    layout.total = AlignUp(layout.total);
    layout.offsets.push_back(layout.total);
    layout.sizes.push_back(size);
    layout.dtypes.push_back(dtype);
    layout.quantized.push_back(quantized);
    layout.total += layout.sizes.back();
  }
  return layout;
}

// Every tensor in the format the receiver expects: payload tensors
// quantized as the job's compression says for their direction (with the
// group size it gives rows of their length) or else in the wire dtype, the
// rest in float32.
absl::Status CheckDTypes(const v1::FrameHeader& header, MessageKind kind,
                         const WireFormat& format) {
  const v1::WireQuantization q = PayloadQuantization(format, kind);
  for (int i = 0; i < header.tensors_size(); ++i) {
    const v1::TensorMeta& meta = header.tensors(i);
    const bool payload = IsPayloadTensor(kind, i);
    const v1::DType want = !payload                          ? v1::DTYPE_F32
                           : q != v1::WIRE_QUANTIZATION_NONE ? QuantizedDType(q)
                                                             : format.dtype;
    if (meta.dtype() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", i, " travels as ", WireDTypeName(meta.dtype()),
          ", expected ", WireDTypeName(want),
          !payload                          ? ""
          : q != v1::WIRE_QUANTIZATION_NONE ? " (the job's wire compression)"
                                            : " (the wire dtype)"));
    }
    if (payload && q != v1::WIRE_QUANTIZATION_NONE) {
      const int64_t group = EffectiveWireGroupSize(
          format.compression.group_size(), RowLength(meta.shape()));
      if (meta.group_size() != group) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", i, " is quantized in groups of ", meta.group_size(),
            ", expected ", group, " (the job's wire compression)"));
      }
    } else if (meta.group_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", i, " is not quantized but declares a group size"));
    }
  }
  return absl::OkStatus();
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

void Widen(const uint16_t* src, int64_t n, DType from, float* dst) {
  if (from == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
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

// Reads frames' bytes across gRPC slices.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices)
      : slices_(slices) {}
  int64_t remaining() const { return remaining_; }
  void Init() {
    for (const grpc::Slice& s : slices_) remaining_ += s.size();
  }
  // Copies the next `n` bytes into `out`.
  bool Read(void* out, int64_t n) {
    if (n > remaining_) return false;
    char* dst = static_cast<char*>(out);
    while (n > 0) {
      const grpc::Slice& s = slices_[index_];
      const int64_t take =
          std::min<int64_t>(n, static_cast<int64_t>(s.size()) - offset_);
      std::memcpy(dst, s.begin() + offset_, take);
      dst += take;
      n -= take;
      offset_ += take;
      remaining_ -= take;
      if (offset_ == static_cast<int64_t>(s.size())) {
        ++index_;
        offset_ = 0;
      }
    }
    return true;
  }
  bool Skip(int64_t n) {
    char scratch[kAlign];
    while (n > 0) {
      const int64_t take = std::min<int64_t>(n, kAlign);
      if (!Read(scratch, take)) return false;
      n -= take;
    }
    return true;
  }
  // The bytes from the read position to the end of its slice (null when
  // nothing remains), for reading in place; Advance(n) moves past n of
  // them.
  const uint8_t* Contiguous(int64_t* available) {
    while (remaining_ > 0 &&
           offset_ == static_cast<int64_t>(slices_[index_].size())) {
      ++index_;
      offset_ = 0;
    }
    if (remaining_ == 0) return nullptr;
    *available = static_cast<int64_t>(slices_[index_].size()) - offset_;
    return slices_[index_].begin() + offset_;
  }
  void Advance(int64_t n) {
    offset_ += n;
    remaining_ -= n;
  }
  // Reads n 16-bit `from` elements as floats into `out`, a block at a time
  // through a small buffer that stays in cache.
  bool ReadWidened(float* out, int64_t n, DType from) {
    uint16_t block[2048];
    while (n > 0) {
      const int64_t take = std::min<int64_t>(n, 2048);
      if (!Read(block, take * 2)) return false;
      Widen(block, take, from, out);
      out += take;
      n -= take;
    }
    return true;
  }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  int64_t offset_ = 0;
  int64_t remaining_ = 0;
};

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

// A message's layout on the wire and widened to float32 (as assembled).
struct FrameLayouts {
  Layout wire;
  Layout widened;
};

// The header's layouts, after checking its tensors' dtypes and byte count.
absl::StatusOr<FrameLayouts> CheckedLayouts(const v1::FrameHeader& h,
                                            MessageKind kind,
                                            const WireFormat& format) {
  RETURN_IF_ERROR(DTypeFromProto(format.dtype).status());
  RETURN_IF_ERROR(CheckDTypes(h, kind, format));
  FrameLayouts layouts;
  ASSIGN_OR_RETURN(layouts.wire, LayoutOf(h));
  ASSIGN_OR_RETURN(layouts.widened, LayoutOf(h, /*as_f32=*/true));
  if (layouts.wire.total != h.total_bytes() ||
      layouts.widened.total > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("message declares ", h.total_bytes(),
                     " bytes but its tensors need ", layouts.wire.total));
  }
  return layouts;
}

// Reads a frame's length prefix and header.
absl::Status ReadHeader(SliceReader* reader, v1::FrameHeader* header) {
  uint8_t len_bytes[4];
  if (!reader->Read(len_bytes, 4)) {
    return absl::InvalidArgumentError("frame shorter than its length prefix");
  }
  const int64_t header_len = len_bytes[0] | (len_bytes[1] << 8) |
                             (len_bytes[2] << 16) |
                             (static_cast<int64_t>(len_bytes[3]) << 24);
  if (header_len > kMaxHeaderBytes || header_len > reader->remaining()) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame header of ", header_len, " bytes does not fit"));
  }
  std::string bytes(header_len, '\0');
  reader->Read(bytes.data(), header_len);
  if (!header->ParseFromString(bytes)) {
    return absl::InvalidArgumentError("unparsable frame header");
  }
  return absl::OkStatus();
}

// The message a completed header's payload in `storage` holds.
StageMessage AssembledMessage(MessageKind kind, const v1::FrameHeader& h,
                              const std::shared_ptr<Storage>& storage,
                              const Layout& widened) {
  StageMessage message;
  message.kind = kind;
  message.step = h.step();
  message.micro_batch = h.micro_batch();
  message.chunk = h.chunk();
  message.weight_version = h.weight_version();
  message.value = h.value();
  message.samples = h.samples();
  for (int i = 0; i < h.tensors_size(); ++i) {
    const v1::TensorMeta& meta = h.tensors(i);
    message.tensors.emplace_back(
        storage, Shape(meta.shape().begin(), meta.shape().end()), DType::kF32,
        static_cast<size_t>(widened.offsets[i]));
  }
  return message;
}

// Decodes bytes [begin, begin + len) of quantized tensor `q` (offsets in
// the tensor) from `reader` into its float32 elements at `dst`: whole rows
// straight from the receive buffer, a row cut by the range's ends through
// `carry`, which holds the first bytes of a row the previous frame cut.
void ReadQuantized(const Layout::Quantized& q, int64_t begin, int64_t len,
                   SliceReader* reader, std::vector<uint8_t>* carry,
                   float* dst) {
  int64_t pos = begin;
  const int64_t stop = begin + len;
  while (pos < stop) {
    const int64_t row = pos / q.row_bytes;
    const int64_t in_row = pos % q.row_bytes;
    int64_t available = 0;
    const uint8_t* direct = reader->Contiguous(&available);
    const int64_t whole = std::min(available, stop - pos) / q.row_bytes;
    if (in_row == 0 && whole > 0) {
      DequantizeRows(direct, whole, q.cols, q.bits, q.group,
                     dst + row * q.cols);
      reader->Advance(whole * q.row_bytes);
      pos += whole * q.row_bytes;
      continue;
    }
    const int64_t take = std::min(q.row_bytes - in_row, stop - pos);
    carry->resize(static_cast<size_t>(q.row_bytes));
    reader->Read(carry->data() + in_row, take);
    pos += take;
    if (in_row + take == q.row_bytes) {
      DequantizeRows(carry->data(), 1, q.cols, q.bits, q.group,
                     dst + row * q.cols);
    }
  }
}

// Copies wire bytes [begin, end) of a message from `reader` into `dst`, the
// message's widened (float32) layout: float32 tensors byte for byte,
// narrowed ones widened, quantized ones decoded (through `carry`, see
// ReadQuantized), alignment gaps skipped. The caller checked that the
// range lies inside the payload and starts and ends on element
// boundaries.
void ReadPayload(const FrameLayouts& layouts, int64_t begin, int64_t end,
                 SliceReader* reader, char* dst, std::vector<uint8_t>* carry) {
  const Layout& wire = layouts.wire;
  const Layout& widened = layouts.widened;
  int64_t pos = begin;
  for (size_t i = 0; i < wire.offsets.size() && pos < end; ++i) {
    const int64_t t_begin = wire.offsets[i];
    const int64_t t_end = t_begin + wire.sizes[i];
    if (pos < t_begin) {
      const int64_t gap = std::min(end, t_begin) - pos;
      reader->Skip(gap);
      pos += gap;
    }
    if (pos >= t_end || pos >= end) continue;
    const int64_t len = std::min(end, t_end) - pos;
    char* out = dst + widened.offsets[i];
    if (wire.quantized[i].bits > 0) {
      ReadQuantized(wire.quantized[i], pos - t_begin, len, reader, carry,
                    reinterpret_cast<float*>(out));
    } else if (wire.dtypes[i] == DType::kF32) {
      reader->Read(out + (pos - t_begin), len);
    } else {
      reader->ReadWidened(reinterpret_cast<float*>(out) + (pos - t_begin) / 2,
                          len / 2, wire.dtypes[i]);
    }
    pos += len;
  }
}

}  // namespace

StageMessage MessageOutline(MessageKind kind, const v1::FrameHeader& h) {
  StageMessage message;
  message.kind = kind;
  message.step = h.step();
  message.micro_batch = h.micro_batch();
  message.chunk = h.chunk();
  message.weight_version = h.weight_version();
  message.value = h.value();
  message.samples = h.samples();
  for (const v1::TensorMeta& meta : h.tensors()) {
    message.tensors.emplace_back(
        nullptr, Shape(meta.shape().begin(), meta.shape().end()), DType::kF32);
  }
  return message;
}

grpc::ByteBuffer EncodeHello(const std::string& job_id, int stage) {
  v1::FrameHeader header;
  header.set_kind(v1::FRAME_KIND_HELLO);
  header.set_job_id(job_id);
  header.set_stage(stage);
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

FrameAssembler::FrameAssembler(std::shared_ptr<HostBufferPool> pool)
    : pool_(pool != nullptr ? std::move(pool)
                            : HostBufferPool::Create(size_t{256} << 20)) {}

absl::StatusOr<FrameAssembler::Partial*> FrameAssembler::PartialFor(
    const Key& key, const v1::FrameHeader& h, int64_t widened_bytes) {
  auto it = partial_.find(key);
  if (it == partial_.end()) {
    if (h.offset() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("first frame of a message starts at byte ", h.offset()));
    }
    if (partial_.size() >= max_partial_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a stream may assemble at most ", max_partial_, " messages at once"));
    }
    Partial p;
    p.header = h;
    p.storage = pool_->Get(static_cast<size_t>(widened_bytes));
    if (p.storage == nullptr) {
      return absl::ResourceExhaustedError("cannot allocate a message buffer");
    }
    it = partial_.emplace(key, std::move(p)).first;
  }
  Partial& p = it->second;
  if (!SameMessage(h, p.header)) {
    partial_.erase(it);
    return absl::InvalidArgumentError(
        "a frame changes its message's header (tensors, version or size) "
        "mid-message");
  }
  if (h.offset() != p.received) {
    const int64_t expected = p.received;
    partial_.erase(it);
    return absl::InvalidArgumentError(absl::StrCat("frame at byte ", h.offset(),
                                                   " out of order (expected ",
                                                   expected, ")"));
  }
  return &p;
}

void FrameAssembler::EvictStale(absl::Time now) {
  for (auto it = partial_.begin(); it != partial_.end();) {
    if (now - it->second.last_frame > partial_timeout_) {
      it = partial_.erase(it);
      ++evicted_;
    } else {
      ++it;
    }
  }
}

absl::StatusOr<DecodedFrame> FrameAssembler::Add(
    const grpc::ByteBuffer& frame) {
  std::vector<grpc::Slice> slices;
  if (!frame.Dump(&slices).ok()) {
    return absl::InvalidArgumentError("unreadable frame");
  }
  SliceReader reader(slices);
  reader.Init();
  DecodedFrame out;
  RETURN_IF_ERROR(ReadHeader(&reader, &out.header));
  const v1::FrameHeader& h = out.header;
  if (h.kind() == v1::FRAME_KIND_HELLO) return out;
  ASSIGN_OR_RETURN(MessageKind kind, KindFromProto(h.kind()));
  ASSIGN_OR_RETURN(const FrameLayouts layouts,
                   CheckedLayouts(h, kind, format_));
  if (header_check_) RETURN_IF_ERROR(header_check_(kind, h));
  const Key key{static_cast<int>(kind), h.step(), h.micro_batch(), h.chunk()};
  const absl::Time now = now_();
  EvictStale(now);
  ASSIGN_OR_RETURN(Partial * p, PartialFor(key, h, layouts.widened.total));
  p->last_frame = now;
  const int64_t end = p->received + reader.remaining();
  if (end > h.total_bytes() || (end < h.total_bytes() && end % kAlign != 0)) {
    const int64_t begin = p->received;
    partial_.erase(key);
    return absl::InvalidArgumentError(absl::StrCat(
        "frame carries bytes [", begin, ", ", end, ") of the message's ",
        h.total_bytes(), " (frames end on multiples of ", kAlign, ")"));
  }
  ReadPayload(layouts, p->received, end, &reader,
              static_cast<char*>(p->storage->data()), &p->row_carry);
  p->received = end;
  if (p->received < h.total_bytes()) return out;
  out.message = AssembledMessage(kind, h, p->storage, layouts.widened);
  partial_.erase(key);
  return out;
}

}  // namespace pipetrain
