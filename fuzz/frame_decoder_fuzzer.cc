// Fuzzes the stage-stream frame decoder (services/wire/frame_codec.h): the
// bytes a peer sends on an Exchange stream, header parse and payload
// reassembly across frames.
//
// Input: byte 0 picks the receiver's wire format: byte % 3 the wire dtype
// (f32, bf16, f16), byte / 3 % 3 the quantization of both directions
// (none, int8, int4), byte / 9 % 2 the group size (the default, or 4);
// then frames, each a 2-byte little-endian length and that many bytes, cut into
// up to three gRPC slices (a third byte per frame says where) so the reader
// crosses slice boundaries as it does on gRPC's receive buffers.
//
// Beyond "no crash, no sanitizer report": a message the decoder completes
// re-encodes and decodes to the same tensors (bit for bit; NaN as NaN)
// when its payload is not quantized; a quantized one re-encodes (unless it
// decoded to non-finite values, which the encoder must refuse with an
// error) and decodes to tensors of the same shapes, each element within
// half a quantization step of the value it re-encoded.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "services/wire/frame_codec.h"

namespace pipetrain {
namespace {

constexpr v1::DType kWireDTypes[] = {v1::DTYPE_F32, v1::DTYPE_BF16,
                                     v1::DTYPE_F16};
constexpr v1::WireQuantization kQuantizations[] = {v1::WIRE_QUANTIZATION_NONE,
                                                   v1::WIRE_QUANTIZATION_INT8,
                                                   v1::WIRE_QUANTIZATION_INT4};

WireFormat FormatOf(uint8_t byte) {
  WireFormat format;
  format.dtype = kWireDTypes[byte % 3];
  format.compression.set_activations(kQuantizations[byte / 3 % 3]);
  format.compression.set_gradients(kQuantizations[byte / 3 % 3]);
  format.compression.set_group_size(byte / 9 % 2 == 0 ? 0 : 4);
  return format;
}

// One frame of `bytes`, split into slices at `cut` (0 to 255) thirds.
grpc::ByteBuffer FrameOf(const uint8_t* data, size_t n, uint8_t cut) {
  const size_t a = n * (cut & 0x0f) / 16;
  const size_t b = a + (n - a) * (cut >> 4) / 16;
  std::vector<grpc::Slice> slices;
  for (auto [begin, end] :
       {std::pair{size_t{0}, a}, std::pair{a, b}, std::pair{b, n}}) {
    if (end > begin) slices.emplace_back(data + begin, end - begin);
  }
  if (slices.empty()) slices.emplace_back(data, 0);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

bool SameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

bool AllFinite(const Tensor& t) {
  for (int64_t e = 0; e < t.numel(); ++e) {
    if (!std::isfinite(t.f32()[e])) return false;
  }
  return true;
}

// Whether `b` is `a` within half a step of a group of a quantized row
// whose values span at most `span` (float32 rounding allowed for). A group
// narrower than levels * FLT_MIN encodes as its minimum (quantize.h): its
// error is under that range.
bool WithinHalfStep(float a, float b, double span, int bits) {
  const int levels = (1 << bits) - 1;
  const double step = span / levels;
  return std::fabs(static_cast<double>(a) - b) <=
         0.5 * step * 1.001 + 1e-6 * (std::fabs(a) + span) +
             levels * static_cast<double>(FLT_MIN);
}

// A decoded message survives a second trip through the codec: unchanged,
// or for a quantized payload within half a step.
void CheckRoundTrip(const StageMessage& in, const WireFormat& format) {
  const v1::WireQuantization q = PayloadQuantization(format, in.kind);
  auto frames = EncodeMessage("job", in, format, /*chunk_bytes=*/64);
  if (q != v1::WIRE_QUANTIZATION_NONE && !in.tensors.empty() &&
      !AllFinite(in.tensors[0])) {
    if (frames.ok()) __builtin_trap();  // NaN / Inf must not be sent
    return;
  }
  if (!frames.ok()) {
    // Finite values whose group range overflows float32 are refused too.
    if (q != v1::WIRE_QUANTIZATION_NONE) return;
    __builtin_trap();
  }
  FrameAssembler assembler;
  assembler.set_wire_format(format);
  std::optional<StageMessage> out;
  for (const grpc::ByteBuffer& frame : *frames) {
    auto decoded = assembler.Add(frame);
    if (!decoded.ok()) __builtin_trap();
    if (decoded->message) out = std::move(decoded->message);
  }
  if (!out || out->tensors.size() != in.tensors.size() ||
      out->step != in.step || out->micro_batch != in.micro_batch) {
    __builtin_trap();
  }
  for (size_t i = 0; i < in.tensors.size(); ++i) {
    const Tensor& a = in.tensors[i];
    const Tensor& b = out->tensors[i];
    if (a.shape() != b.shape()) __builtin_trap();
    if (i == 0 && q != v1::WIRE_QUANTIZATION_NONE) {
      // The tensor's whole range bounds every group's.
      double lo = 0, hi = 0;
      for (int64_t e = 0; e < a.numel(); ++e) {
        lo = std::min<double>(lo, a.f32()[e]);
        hi = std::max<double>(hi, a.f32()[e]);
      }
      const int bits = q == v1::WIRE_QUANTIZATION_INT8 ? 8 : 4;
      for (int64_t e = 0; e < a.numel(); ++e) {
        if (!WithinHalfStep(a.f32()[e], b.f32()[e], hi - lo, bits)) {
          __builtin_trap();
        }
      }
      continue;
    }
    for (int64_t e = 0; e < a.numel(); ++e) {
      if (!SameFloat(a.f32()[e], b.f32()[e])) __builtin_trap();
    }
  }
}

}  // namespace
}  // namespace pipetrain

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  if (size < 1) return 0;
  const WireFormat format = FormatOf(data[0]);
  FrameAssembler assembler;
  assembler.set_wire_format(format);
  size_t pos = 1;
  while (pos + 3 <= size) {
    const size_t len = data[pos] | (size_t{data[pos + 1]} << 8);
    const uint8_t cut = data[pos + 2];
    pos += 3;
    const size_t n = std::min(len, size - pos);
    absl::StatusOr<DecodedFrame> decoded =
        assembler.Add(FrameOf(data + pos, n, cut));
    pos += n;
    if (decoded.ok() && decoded->message) {
      CheckRoundTrip(*decoded->message, format);
    }
  }
  return 0;
}
