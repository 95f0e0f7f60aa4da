#include "services/wire/frame_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/vocabulary.h"

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
  }
  return v1::FRAME_KIND_UNSPECIFIED;
}

// Byte offsets of each tensor in the payload and the payload's size.
struct Layout {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int64_t total = 0;
};

absl::StatusOr<Layout> LayoutOf(const v1::FrameHeader& header) {
  Layout layout;
  for (const v1::TensorMeta& meta : header.tensors()) {
    ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(meta.dtype()));
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
    layout.total += layout.sizes.back();
  }
  return layout;
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

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  int64_t offset_ = 0;
  int64_t remaining_ = 0;
};

}  // namespace

grpc::ByteBuffer EncodeHello(const std::string& job_id, int stage) {
  v1::FrameHeader header;
  header.set_kind(v1::FRAME_KIND_HELLO);
  header.set_job_id(job_id);
  header.set_stage(stage);
  grpc::Slice slice = HeaderSlice(header);
  return grpc::ByteBuffer(&slice, 1);
}

absl::StatusOr<std::vector<grpc::ByteBuffer>> EncodeMessage(
    const std::string& job_id, const StageMessage& message,
    size_t chunk_bytes) {
  v1::FrameHeader header;
  header.set_kind(KindToProto(message.kind));
  header.set_job_id(job_id);
  header.set_step(message.step);
  header.set_micro_batch(message.micro_batch);
  header.set_chunk(message.chunk);
  header.set_weight_version(message.weight_version);
  header.set_value(message.value);
  for (const Tensor& t : message.tensors) {
    if (t.empty() || t.device() != Device::kCpu) {
      return absl::InvalidArgumentError("frames carry host tensors only");
    }
    v1::TensorMeta* meta = header.add_tensors();
    meta->set_dtype(DTypeToProto(t.dtype()));
    for (int64_t d : t.shape()) meta->add_shape(d);
  }
  ASSIGN_OR_RETURN(Layout layout, LayoutOf(header));
  header.set_total_bytes(layout.total);
  const int64_t chunk = std::max<int64_t>(kAlign, chunk_bytes);
  std::vector<grpc::ByteBuffer> frames;
  int64_t offset = 0;
  do {
    const int64_t end = std::min(layout.total, offset + chunk);
    header.set_offset(offset);
    std::vector<grpc::Slice> slices = {HeaderSlice(header)};
    // The tensors and alignment gaps that overlap [offset, end).
    int64_t pos = offset;
    for (size_t i = 0; i < message.tensors.size() && pos < end; ++i) {
      const int64_t t_begin = layout.offsets[i];
      const int64_t t_end = t_begin + layout.sizes[i];
      if (pos < t_begin) {  // alignment gap before tensor i
        const int64_t gap = std::min(end, t_begin) - pos;
        slices.emplace_back(kZeros, gap, grpc::Slice::STATIC_SLICE);
        pos += gap;
      }
      if (pos >= t_begin && pos < t_end && pos < end) {
        const int64_t len = std::min(end, t_end) - pos;
        slices.push_back(PayloadSlice(message.tensors[i], pos - t_begin, len));
        pos += len;
      }
    }
    frames.emplace_back(slices.data(), slices.size());
    offset = end;
  } while (offset < layout.total);
  return frames;
}

FrameAssembler::FrameAssembler(std::shared_ptr<HostBufferPool> pool)
    : pool_(pool != nullptr ? std::move(pool)
                            : HostBufferPool::Create(size_t{256} << 20)) {}

absl::StatusOr<DecodedFrame> FrameAssembler::Add(
    const grpc::ByteBuffer& frame) {
  std::vector<grpc::Slice> slices;
  if (!frame.Dump(&slices).ok()) {
    return absl::InvalidArgumentError("unreadable frame");
  }
  SliceReader reader(slices);
  reader.Init();
  uint8_t len_bytes[4];
  if (!reader.Read(len_bytes, 4)) {
    return absl::InvalidArgumentError("frame shorter than its length prefix");
  }
  const int64_t header_len = len_bytes[0] | (len_bytes[1] << 8) |
                             (len_bytes[2] << 16) |
                             (static_cast<int64_t>(len_bytes[3]) << 24);
  if (header_len > kMaxHeaderBytes || header_len > reader.remaining()) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame header of ", header_len, " bytes does not fit"));
  }
  std::string header_bytes(header_len, '\0');
  reader.Read(header_bytes.data(), header_len);
  DecodedFrame out;
  if (!out.header.ParseFromString(header_bytes)) {
    return absl::InvalidArgumentError("unparsable frame header");
  }
  const v1::FrameHeader& h = out.header;
  if (h.kind() == v1::FRAME_KIND_HELLO) return out;
  ASSIGN_OR_RETURN(MessageKind kind, KindFromProto(h.kind()));
  ASSIGN_OR_RETURN(Layout layout, LayoutOf(h));
  if (layout.total != h.total_bytes() || layout.total > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("message declares ", h.total_bytes(),
                     " bytes but its tensors need ", layout.total));
  }
  const Key key{static_cast<int>(kind), h.step(), h.micro_batch(), h.chunk()};
  auto it = partial_.find(key);
  if (it == partial_.end()) {
    if (h.offset() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("first frame of a message starts at byte ", h.offset()));
    }
    Partial p;
    p.header = h;
    p.storage = pool_->Get(static_cast<size_t>(layout.total));
    if (p.storage == nullptr) {
      return absl::ResourceExhaustedError("cannot allocate a message buffer");
    }
    it = partial_.emplace(key, std::move(p)).first;
  }
  Partial& p = it->second;
  if (h.offset() != p.received || h.total_bytes() != p.header.total_bytes()) {
    partial_.erase(it);
    return absl::InvalidArgumentError(absl::StrCat("frame at byte ", h.offset(),
                                                   " out of order (expected ",
                                                   p.received, ")"));
  }
  const int64_t payload = reader.remaining();
  if (payload > h.total_bytes() - p.received) {
    partial_.erase(it);
    return absl::InvalidArgumentError(absl::StrCat("frame carries ", payload,
                                                   " bytes past the message's ",
                                                   h.total_bytes()));
  }
  reader.Read(static_cast<char*>(p.storage->data()) + p.received, payload);
  p.received += payload;
  if (p.received < h.total_bytes()) return out;

  StageMessage message;
  message.kind = kind;
  message.step = h.step();
  message.micro_batch = h.micro_batch();
  message.chunk = h.chunk();
  message.weight_version = h.weight_version();
  message.value = h.value();
  for (int i = 0; i < h.tensors_size(); ++i) {
    const v1::TensorMeta& meta = h.tensors(i);
    ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(meta.dtype()));
    message.tensors.emplace_back(
        p.storage, Shape(meta.shape().begin(), meta.shape().end()), dtype,
        static_cast<size_t>(layout.offsets[i]));
  }
  partial_.erase(it);
  out.message = std::move(message);
  return out;
}

}  // namespace pipetrain
