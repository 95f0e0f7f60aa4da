// Writes frame_decoder_fuzzer's seed inputs (valid streams of frames from
// the real encoder, and a few broken ones) into the directory given as the
// only argument. The seeds are committed in fuzz/corpus/frame_decoder;
// rerun this when the frame format changes.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "services/wire/frame_codec.h"

namespace pipetrain {
namespace {

std::string Bytes(const grpc::ByteBuffer& frame) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!frame.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// The fuzzer's format byte: dtype index + 3 x quantization (none, int8,
// int4) + 9 x (group size 4 rather than the default).
char FormatByte(v1::DType wire,
                v1::WireQuantization q = v1::WIRE_QUANTIZATION_NONE,
                bool groups_of_4 = false) {
  const int dtype = wire == v1::DTYPE_F32 ? 0 : wire == v1::DTYPE_BF16 ? 1 : 2;
  const int quant = q == v1::WIRE_QUANTIZATION_NONE   ? 0
                    : q == v1::WIRE_QUANTIZATION_INT8 ? 1
                                                      : 2;
  return static_cast<char>(dtype + 3 * quant + (groups_of_4 ? 9 : 0));
}

// The fuzzer's input for `frames` received in `format` (FormatByte), then
// each frame as a 2-byte length, a slice-cut byte and its bytes.
std::string Input(char format, const std::vector<std::string>& frames) {
  std::string out(1, format);
  for (const std::string& f : frames) {
    out.push_back(static_cast<char>(f.size() & 0xff));
    out.push_back(static_cast<char>((f.size() >> 8) & 0xff));
    out.push_back(static_cast<char>(0x48));  // three slices
    out += f;
  }
  return out;
}

std::string Input(v1::DType wire, const std::vector<std::string>& frames) {
  return Input(FormatByte(wire), frames);
}

std::vector<std::string> Encoded(const StageMessage& m,
                                 const WireFormat& format, size_t chunk) {
  std::vector<std::string> out;
  auto frames = EncodeMessage("job-1", m, format, chunk);
  if (!frames.ok()) return out;
  for (const grpc::ByteBuffer& f : *frames) out.push_back(Bytes(f));
  return out;
}

std::vector<std::string> Encoded(const StageMessage& m, v1::DType wire,
                                 size_t chunk) {
  WireFormat format;
  format.dtype = wire;
  return Encoded(m, format, chunk);
}

WireFormat QuantizedFormat(v1::WireQuantization q, bool groups_of_4) {
  WireFormat format;
  format.compression.set_activations(q);
  format.compression.set_gradients(q);
  format.compression.set_group_size(groups_of_4 ? 4 : 0);
  return format;
}

StageMessage Activation(MessageKind kind) {
  StageMessage m;
  m.kind = kind;
  m.step = 3;
  m.micro_batch = 1;
  m.weight_version = 2;
  m.samples = kind == MessageKind::kGradient ? 0 : 60000;
  m.tensors = {Tensor::HostFrom({2, 3}, {1, -2, 0.5f, 3, 4.25f, -0.125f})};
  return m;
}

void Write(const std::string& dir, const std::string& name,
           const std::string& bytes) {
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  using namespace pipetrain;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const StageMessage act = Activation(MessageKind::kActivation);
  Write(dir, "hello", Input(v1::DTYPE_F32, {Bytes(EncodeHello("job-1", 1))}));
  Write(dir, "activation_f32_one_frame",
        Input(v1::DTYPE_F32, Encoded(act, v1::DTYPE_F32, 1 << 20)));
  Write(dir, "activation_f32_chunked",
        Input(v1::DTYPE_F32, Encoded(act, v1::DTYPE_F32, 16)));
  Write(dir, "activation_bf16_chunked",
        Input(v1::DTYPE_BF16, Encoded(act, v1::DTYPE_BF16, 8)));
  StageMessage grad = Activation(MessageKind::kGradient);
  Write(dir, "gradient_f16",
        Input(v1::DTYPE_F16, Encoded(grad, v1::DTYPE_F16, 1 << 20)));
  StageMessage norm;
  norm.kind = MessageKind::kNormPartial;
  norm.value = 2.5;
  Write(dir, "norm_partial",
        Input(v1::DTYPE_F32, Encoded(norm, v1::DTYPE_F32, 1 << 20)));
  // Broken streams: frames out of order, a cut header, a wrong dtype.
  std::vector<std::string> chunked = Encoded(act, v1::DTYPE_F32, 16);
  std::swap(chunked.front(), chunked.back());
  Write(dir, "out_of_order", Input(v1::DTYPE_F32, chunked));
  std::string cut = Encoded(act, v1::DTYPE_F32, 1 << 20).front();
  cut.resize(cut.size() / 3);
  Write(dir, "truncated", Input(v1::DTYPE_F32, {cut}));
  Write(dir, "bf16_on_f32_stream",
        Input(v1::DTYPE_F32, Encoded(act, v1::DTYPE_BF16, 1 << 20)));
  // Quantized wires: rows of 3 and 7 elements cut by 8-byte frames, groups
  // of 4 (the last shorter), int4's padding nibble; and mismatches.
  StageMessage wide = Activation(MessageKind::kActivation);
  wide.tensors = {Tensor::HostFrom(
      {2, 7}, {1, -2, 0.5f, 3, 4.25f, -0.125f, 9, 0, 0, 0, 0, 0, 0, 0.25f})};
  const auto int8 = v1::WIRE_QUANTIZATION_INT8;
  const auto int4 = v1::WIRE_QUANTIZATION_INT4;
  Write(dir, "activation_int8_chunked",
        Input(FormatByte(v1::DTYPE_F32, int8),
              Encoded(act, QuantizedFormat(int8, false), 8)));
  Write(dir, "activation_int4_groups_of_4",
        Input(FormatByte(v1::DTYPE_F32, int4, true),
              Encoded(wide, QuantizedFormat(int4, true), 8)));
  StageMessage wide_grad = wide;
  wide_grad.kind = MessageKind::kGradient;
  wide_grad.samples = 0;
  Write(dir, "gradient_int8_groups_of_4",
        Input(FormatByte(v1::DTYPE_F32, int8, true),
              Encoded(wide_grad, QuantizedFormat(int8, true), 16)));
  Write(dir, "int4_on_int8_stream",
        Input(FormatByte(v1::DTYPE_F32, int8),
              Encoded(act, QuantizedFormat(int4, false), 1 << 20)));
  Write(dir, "f32_on_int8_stream",
        Input(FormatByte(v1::DTYPE_F32, int8),
              Encoded(act, v1::DTYPE_F32, 1 << 20)));
  return 0;
}
