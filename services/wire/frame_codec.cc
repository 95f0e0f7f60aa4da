#include "services/wire/frame_codec.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/vocabulary.h"
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
    if (x.dtype() != y.dtype() ||
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
  std::vector<DType> dtypes;
  int64_t total = 0;
};

// The layout of the header's tensors; with `as_f32`, of the same tensors
// widened to float32 (what the decoder assembles).
absl::StatusOr<Layout> LayoutOf(const v1::FrameHeader& header,
                                bool as_f32 = false) {
  Layout layout;
  for (const v1::TensorMeta& meta : header.tensors()) {
    ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(meta.dtype()));
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
    layout.total = AlignUp(layout.total);
    layout.offsets.push_back(layout.total);
    layout.sizes.push_back(n * static_cast<int64_t>(DTypeSize(dtype)));
    layout.dtypes.push_back(dtype);
    layout.total += layout.sizes.back();
  }
  return layout;
}

// Every tensor in the dtype the receiver expects: payload tensors in the
// wire dtype, the rest in float32.
absl::Status CheckDTypes(const v1::FrameHeader& header, MessageKind kind,
                         DType wire) {
  for (int i = 0; i < header.tensors_size(); ++i) {
    ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(header.tensors(i).dtype()));
    const DType want = IsPayloadTensor(kind, i) ? wire : DType::kF32;
    if (dtype != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " travels as ", DTypeName(dtype),
                       ", expected ", DTypeName(want),
                       IsPayloadTensor(kind, i) ? " (the wire dtype)" : ""));
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
// float32 payload tensor travels as `wire`, the others as they are.
absl::StatusOr<v1::FrameHeader> MessageHeader(const std::string& job_id,
                                              const StageMessage& message,
                                              DType wire) {
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
    for (int64_t d : t.shape()) meta->add_shape(d);
  }
  return header;
}

// Appends the slices of payload bytes [offset, end): the tensors (narrowed
// where the layout says so) and the alignment gaps between them.
void AppendPayload(const StageMessage& message, const Layout& layout,
                   int64_t offset, int64_t end,
                   std::vector<grpc::Slice>* slices) {
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
                                            v1::DType wire_dtype) {
  ASSIGN_OR_RETURN(DType wire, DTypeFromProto(wire_dtype));
  RETURN_IF_ERROR(CheckDTypes(h, kind, wire));
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

// Copies wire bytes [begin, end) of a message from `reader` into `dst`, the
// message's widened (float32) layout: float32 tensors byte for byte,
// narrowed ones widened, alignment gaps skipped. The caller checked that
// the range lies inside the payload and starts and ends on element
// boundaries.
void ReadPayload(const FrameLayouts& layouts, int64_t begin, int64_t end,
                 SliceReader* reader, char* dst) {
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
    if (wire.dtypes[i] == DType::kF32) {
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

int64_t WirePayloadBytes(const StageMessage& message, v1::DType wire_dtype) {
  const absl::StatusOr<DType> wire = DTypeFromProto(wire_dtype);
  int64_t n = 0;
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    const Tensor& t = message.tensors[i];
    const bool narrow = wire.ok() && IsPayloadTensor(message.kind, i) &&
                        t.dtype() == DType::kF32;
    n +=
        t.numel() * static_cast<int64_t>(DTypeSize(narrow ? *wire : t.dtype()));
  }
  return n;
}

absl::StatusOr<std::vector<grpc::ByteBuffer>> EncodeMessage(
    const std::string& job_id, const StageMessage& message,
    v1::DType wire_dtype, size_t chunk_bytes) {
  ASSIGN_OR_RETURN(const DType wire, DTypeFromProto(wire_dtype));
  ASSIGN_OR_RETURN(v1::FrameHeader header,
                   MessageHeader(job_id, message, wire));
  ASSIGN_OR_RETURN(Layout layout, LayoutOf(header));
  header.set_total_bytes(layout.total);
  const int64_t chunk = AlignUp(std::max<int64_t>(kAlign, chunk_bytes));
  std::vector<grpc::ByteBuffer> frames;
  int64_t offset = 0;
  do {
    const int64_t end = std::min(layout.total, offset + chunk);
    header.set_offset(offset);
    std::vector<grpc::Slice> slices = {HeaderSlice(header)};
    AppendPayload(message, layout, offset, end, &slices);
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
                   CheckedLayouts(h, kind, wire_dtype_));
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
              static_cast<char*>(p->storage->data()));
  p->received = end;
  if (p->received < h.total_bytes()) return out;
  out.message = AssembledMessage(kind, h, p->storage, layouts.widened);
  partial_.erase(key);
  return out;
}

}  // namespace pipetrain
