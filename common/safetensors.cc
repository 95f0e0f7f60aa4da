#include "common/safetensors.h"

#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/safetensors_json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

using nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";
constexpr size_t kLengthBytes = 8;
// The header's containers: the top object, a tensor's object, its arrays.
constexpr int kMaxHeaderDepth = 3;

struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  size_t size;
};

// The one table of the format's dtypes (house rule 16).
constexpr std::array<DtypeInfo, 15> kDtypes = {{
    {SafetensorsDtype::kBool, "BOOL", 1},
    {SafetensorsDtype::kU8, "U8", 1},
    {SafetensorsDtype::kI8, "I8", 1},
    {SafetensorsDtype::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDtype::kF8E4M3, "F8_E4M3", 1},
    {SafetensorsDtype::kI16, "I16", 2},
    {SafetensorsDtype::kU16, "U16", 2},
    {SafetensorsDtype::kF16, "F16", 2},
    {SafetensorsDtype::kBF16, "BF16", 2},
    {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kU32, "U32", 4},
    {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF64, "F64", 8},
    {SafetensorsDtype::kI64, "I64", 8},
    {SafetensorsDtype::kU64, "U64", 8},
}};

const DtypeInfo& Info(SafetensorsDtype dtype) {
  return kDtypes[static_cast<size_t>(dtype)];
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", what));
}

uint64_t ReadLittleEndian64(absl::string_view bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  }
  return v;
}

std::string LittleEndian64(uint64_t v) {
  std::string out(kLengthBytes, '\0');
  for (size_t i = 0; i < kLengthBytes; ++i) {
    out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  return out;
}

// product(shape) * element_size, checked.
absl::StatusOr<uint64_t> ByteSize(const std::vector<int64_t>& shape,
                                  size_t element_size) {
  ASSIGN_OR_RETURN(const uint64_t count, SafetensorsElementCount(shape));
  if (count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) /
                  element_size) {
    return absl::InvalidArgumentError("byte size overflows 63 bits");
  }
  return count * element_size;
}

absl::StatusOr<uint64_t> NonNegativeInt(const json& v, absl::string_view what) {
  if (!v.is_number_unsigned() && !v.is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is a ", v.type_name(), ", not an integer"));
  }
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is negative (", v.get<int64_t>(), ")"));
  }
  const uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " (", u, ") does not fit in 63 bits"));
  }
  return u;
}

absl::Status ParseMetadata(const json& value, SafetensorsMetadata* out) {
  if (!value.is_object()) {
    return Invalid(absl::StrCat("__metadata__ is a ", value.type_name(),
                                ", not an object of strings"));
  }
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return Invalid(absl::StrCat("__metadata__ value of \"", key, "\" is a ",
                                  v.type_name(), ", not a string"));
    }
    (*out)[key] = v.get<std::string>();
  }
  return absl::OkStatus();
}

// Checks a tensor's fields; `begin`/`end` are its data_offsets.
absl::Status ParseFields(const json& value, SafetensorsEntry* entry,
                         uint64_t* begin, uint64_t* end) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("is a ", value.type_name(), ", not an object"));
  }
  for (const auto& [key, v] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown field \"", key, "\""));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("has no \"", key, "\""));
    }
  }
  const json& dtype = value["dtype"];
  if (!dtype.is_string()) {
    return absl::InvalidArgumentError("dtype is not a string");
  }
  ASSIGN_OR_RETURN(entry->dtype,
                   SafetensorsDtypeFromName(dtype.get<std::string>()));
  const json& shape = value["shape"];
  if (!shape.is_array())
    return absl::InvalidArgumentError("shape is not an array");
  for (const json& d : shape) {
    ASSIGN_OR_RETURN(const uint64_t dim,
                     NonNegativeInt(d, "a shape dimension"));
    entry->shape.push_back(static_cast<int64_t>(dim));
  }
  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    return absl::InvalidArgumentError("data_offsets is not [begin, end]");
  }
  ASSIGN_OR_RETURN(*begin, NonNegativeInt(offsets[0], "data_offsets begin"));
  ASSIGN_OR_RETURN(*end, NonNegativeInt(offsets[1], "data_offsets end"));
  if (*end < *begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets end ", *end, " is before begin ", *begin));
  }
  ASSIGN_OR_RETURN(const uint64_t bytes,
                   ByteSize(entry->shape, SafetensorsDtypeSize(entry->dtype)));
  if (*end - *begin != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets [", *begin, ", ", *end, ") hold ",
                     *end - *begin, " bytes but shape and dtype need ", bytes));
  }
  return absl::OkStatus();
}

// Tensors must tile the data section exactly: sorted by offset, each
// starts where the previous ended, the last ends at the end of the buffer.
absl::Status CheckTiling(std::vector<SafetensorsEntry>* tensors,
                         uint64_t data_start, uint64_t data_bytes) {
  std::stable_sort(tensors->begin(), tensors->end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.offset != b.offset ? a.offset < b.offset
                                                 : a.size < b.size;
                   });
  uint64_t expected = 0;
  for (const SafetensorsEntry& t : *tensors) {
    const uint64_t begin = t.offset - data_start;
    if (begin != expected) {
      return Invalid(absl::StrCat(
          "tensor \"", t.name, "\" starts at data offset ", begin, " but ",
          begin < expected ? "the previous tensor ends at "
                           : "there is a gap: the previous tensor ends at ",
          expected, begin < expected ? " (overlap)" : ""));
    }
    expected = begin + t.size;
  }
  if (expected != data_bytes) {
    return Invalid(absl::StrCat("the data section has ", data_bytes,
                                " bytes but the tensors cover ", expected));
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::string_view> HeaderText(absl::string_view bytes) {
  if (bytes.size() < kLengthBytes) {
    return Invalid(absl::StrCat("truncated: ", bytes.size(),
                                " bytes, less than the 8-byte header length"));
  }
  const uint64_t n = ReadLittleEndian64(bytes);
  if (n > kMaxSafetensorsHeaderBytes) {
    return Invalid(absl::StrCat("header length ", n, " is over the limit of ",
                                kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (n > bytes.size() - kLengthBytes) {
    return Invalid(absl::StrCat("header length ", n,
                                " runs past the end of the file (",
                                bytes.size(), " bytes)"));
  }
  absl::string_view text = bytes.substr(kLengthBytes, n);
  if (text.empty() || text.front() != '{') {
    return Invalid("header does not start with '{'");
  }
  return text;
}

}  // namespace

absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype) {
  return Info(dtype).name;
}

size_t SafetensorsDtypeSize(SafetensorsDtype dtype) { return Info(dtype).size; }

absl::StatusOr<SafetensorsDtype> SafetensorsDtypeFromName(
    absl::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (name == info.name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name, "\""));
}

absl::StatusOr<uint64_t> SafetensorsElementCount(
    const std::vector<int64_t>& shape) {
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  uint64_t count = 1;
  for (const int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    }
    const uint64_t dim = static_cast<uint64_t>(d);
    if (dim != 0 && count > kMax / dim) {
      return absl::InvalidArgumentError("element count overflows 63 bits");
    }
    count *= dim;
  }
  return count;
}

absl::StatusOr<SafetensorsIndex> ParseSafetensors(absl::string_view bytes) {
  ASSIGN_OR_RETURN(const absl::string_view text, HeaderText(bytes));
  absl::StatusOr<json> header =
      safetensors_internal::ParseJsonStrict(text, kMaxHeaderDepth);
  if (!header.ok()) return Invalid(header.status().message());
  if (!header->is_object()) return Invalid("header is not a JSON object");
  const uint64_t data_start = kLengthBytes + text.size();
  SafetensorsIndex index;
  for (const auto& [name, value] : header->items()) {
    if (name == kMetadataKey) {
      RETURN_IF_ERROR(ParseMetadata(value, &index.metadata));
      continue;
    }
    if (name.empty()) return Invalid("a tensor has an empty name");
    SafetensorsEntry entry;
    entry.name = name;
    uint64_t begin = 0, end = 0;
    absl::Status fields = ParseFields(value, &entry, &begin, &end);
    if (!fields.ok()) {
      return Invalid(absl::StrCat("tensor \"", name, "\": ", fields.message()));
    }
    if (end > bytes.size() - data_start) {
      return Invalid(absl::StrCat("tensor \"", name, "\": data_offsets end ",
                                  end, " is past the end of the data (",
                                  bytes.size() - data_start, " bytes)"));
    }
    entry.offset = data_start + begin;
    entry.size = end - begin;
    index.tensors.push_back(std::move(entry));
  }
  RETURN_IF_ERROR(
      CheckTiling(&index.tensors, data_start, bytes.size() - data_start));
  return index;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(std::string bytes) {
  ASSIGN_OR_RETURN(SafetensorsIndex index, ParseSafetensors(bytes));
  return SafetensorsFile(std::move(bytes), std::move(index));
}

const SafetensorsEntry* SafetensorsFile::Find(absl::string_view name) const {
  for (const SafetensorsEntry& e : index_.tensors) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::StatusOr<SafetensorsFile> ReadSafetensorsFile(const std::string& path,
                                                    uint64_t max_bytes) {
  ASSIGN_OR_RETURN(std::string bytes, ReadRegularFile(path, max_bytes));
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::FromBytes(std::move(bytes));
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat(path, ": ", file.status().message()));
  }
  return file;
}

// ---- Writing ----

namespace {

// The layout order (see the header) as indices into `tensors`.
std::vector<size_t> LayoutOrder(
    const std::vector<SafetensorsTensorView>& tensors) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const size_t sa = SafetensorsDtypeSize(tensors[a].dtype);
    const size_t sb = SafetensorsDtypeSize(tensors[b].dtype);
    return sa != sb ? sa > sb : tensors[a].name < tensors[b].name;
  });
  return order;
}

absl::Status CheckTensor(const SafetensorsTensorView& t,
                         std::set<absl::string_view>* names) {
  if (t.name.empty()) return Invalid("a tensor has an empty name");
  if (t.name == kMetadataKey) {
    return Invalid("a tensor may not be named __metadata__");
  }
  if (!names->insert(t.name).second) {
    return Invalid(absl::StrCat("tensor \"", t.name, "\" appears twice"));
  }
  absl::StatusOr<uint64_t> bytes =
      ByteSize(t.shape, SafetensorsDtypeSize(t.dtype));
  if (!bytes.ok()) {
    return Invalid(
        absl::StrCat("tensor \"", t.name, "\": ", bytes.status().message()));
  }
  if (*bytes != t.data.size()) {
    return Invalid(absl::StrCat("tensor \"", t.name, "\" has ", t.data.size(),
                                " bytes of data but its shape and dtype need ",
                                *bytes));
  }
  return absl::OkStatus();
}

// The 8-byte length, the JSON and its padding.
absl::StatusOr<std::string> BuildHeader(
    const std::vector<SafetensorsTensorView>& tensors,
    const std::vector<size_t>& order, const SafetensorsMetadata& metadata) {
  // ordered_json keeps the reference writer's key order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const size_t i : order) {
    const SafetensorsTensorView& t = tensors[i];
    header[t.name] = {{"dtype", std::string(SafetensorsDtypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text;
  try {  // dump throws on a string that is not UTF-8 (house rule 4)
    text = header.dump();
  } catch (const std::exception& e) {
    return Invalid(
        absl::StrCat("a name or metadata value is not UTF-8: ", e.what()));
  }
  text.append((kLengthBytes - text.size() % kLengthBytes) % kLengthBytes, ' ');
  return absl::StrCat(LittleEndian64(text.size()), text);
}

}  // namespace

absl::Status WriteSafetensors(const std::vector<SafetensorsTensorView>& tensors,
                              const SafetensorsMetadata& metadata,
                              const ByteSink& sink) {
  std::set<absl::string_view> names;
  for (const SafetensorsTensorView& t : tensors) {
    RETURN_IF_ERROR(CheckTensor(t, &names));
  }
  const std::vector<size_t> order = LayoutOrder(tensors);
  ASSIGN_OR_RETURN(const std::string header,
                   BuildHeader(tensors, order, metadata));
  RETURN_IF_ERROR(sink(header));
  for (const size_t i : order) {
    if (!tensors[i].data.empty()) RETURN_IF_ERROR(sink(tensors[i].data));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<SafetensorsTensorView>& tensors,
    const SafetensorsMetadata& metadata) {
  std::string out;
  RETURN_IF_ERROR(
      WriteSafetensors(tensors, metadata, [&out](absl::string_view piece) {
        out.append(piece.data(), piece.size());
        return absl::OkStatus();
      }));
  return out;
}

}  // namespace pipetrain
