// Fuzzes the stage-stream frame decoder (services/wire/frame_codec.h): the
// bytes a peer sends on an Exchange stream, header parse and payload
// reassembly across frames.
//
// Input: byte 0 picks the receiver's wire dtype (f32, bf16, f16); then
// frames, each a 2-byte little-endian length and that many bytes, cut into
// up to three gRPC slices (a third byte per frame says where) so the reader
// crosses slice boundaries as it does on gRPC's receive buffers.
//
// Beyond "no crash, no sanitizer report": a message the decoder completes
// re-encodes and decodes to the same tensors (bit for bit; NaN as NaN).
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

// A decoded message survives a second trip through the codec unchanged.
void CheckRoundTrip(const StageMessage& in, v1::DType wire) {
  auto frames = EncodeMessage("job", in, wire, /*chunk_bytes=*/64);
  if (!frames.ok()) __builtin_trap();
  FrameAssembler assembler;
  assembler.set_wire_dtype(wire);
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
  const v1::DType wire = kWireDTypes[data[0] % 3];
  FrameAssembler assembler;
  assembler.set_wire_dtype(wire);
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
      CheckRoundTrip(*decoded->message, wire);
    }
  }
  return 0;
}
