// The receiving half of the wire codec (frame_codec.h): FrameAssembler
// checks each frame against the stage's wire format and reassembles its
// message into float32 tensors.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/wire/frame_codec.h"
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

constexpr int64_t kMaxHeaderBytes = 1 << 20;

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

// A wire dtype's name: f32, bf16, f16, int8, int4.
std::string WireDTypeName(v1::DType dtype) {
  const v1::WireQuantization q = QuantizationOf(dtype);
  if (q != v1::WIRE_QUANTIZATION_NONE) return WireQuantizationName(q);
  const absl::StatusOr<DType> known = DTypeFromProto(dtype);
  return known.ok() ? DTypeName(*known)
                    : absl::StrCat("unknown(", static_cast<int>(dtype), ")");
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

void Widen(const uint16_t* src, int64_t n, DType from, float* dst) {
  if (from == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
  }
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

// A header's message fields, without its tensors.
StageMessage HeaderFields(MessageKind kind, const v1::FrameHeader& h) {
  StageMessage message;
  message.kind = kind;
  message.step = h.step();
  message.micro_batch = h.micro_batch();
  message.chunk = h.chunk();
  message.weight_version = h.weight_version();
  message.value = h.value();
  message.samples = h.samples();
  return message;
}

// The message a completed header's payload in `storage` holds.
StageMessage AssembledMessage(MessageKind kind, const v1::FrameHeader& h,
                              const std::shared_ptr<Storage>& storage,
                              const Layout& widened) {
  StageMessage message = HeaderFields(kind, h);
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
  StageMessage message = HeaderFields(kind, h);
  for (const v1::TensorMeta& meta : h.tensors()) {
    message.tensors.emplace_back(
        nullptr, Shape(meta.shape().begin(), meta.shape().end()), DType::kF32);
  }
  return message;
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
