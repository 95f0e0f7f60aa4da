#include "worker/data/npy_header.h"

#include <cstring>
#include <limits>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);

struct DtypeName {
  const char* descr;  // without the byte-order character
  NpyDtype dtype;
};

constexpr DtypeName kDtypes[] = {
    {"f4", NpyDtype::kFloat32}, {"i1", NpyDtype::kInt8},
    {"u1", NpyDtype::kUint8},   {"i2", NpyDtype::kInt16},
    {"u2", NpyDtype::kUint16},  {"i4", NpyDtype::kInt32},
    {"u4", NpyDtype::kUint32},  {"i8", NpyDtype::kInt64},
    {"u8", NpyDtype::kUint64},
};

// A cursor over the header's dict literal, which NumPy writes with repr():
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// followed by spaces and a newline. Every step checks the end of the text.
class DictReader {
 public:
  DictReader(absl::string_view text, const std::string& name)
      : text_(text), name_(name) {}

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  // Consumes `c` after optional spaces; false (consuming nothing) otherwise.
  bool Take(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }

  absl::StatusOr<std::string> String() {
    SkipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Error("expected a quoted string");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return Error("unterminated string");
    std::string out(text_.substr(pos_, end - pos_));
    if (out.find('\\') != std::string::npos) return Error("escape in string");
    pos_ = end + 1;
    return out;
  }

  absl::StatusOr<bool> Bool() {
    SkipSpace();
    for (const auto& [word, value] :
         {std::pair{"True", true}, {"False", false}}) {
      if (text_.substr(pos_, std::strlen(word)) == word) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    return Error("expected True or False");
  }

  // A non-negative decimal integer (a trailing 'L' of Python 2 allowed).
  absl::StatusOr<int64_t> Integer() {
    SkipSpace();
    const size_t start = pos_;
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (value > (std::numeric_limits<int64_t>::max() - 9) / 10) {
        return Error("dimension too large");
      }
      value = value * 10 + (text_[pos_++] - '0');
    }
    if (pos_ == start) return Error("expected a dimension");
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;
    return value;
  }

  // A tuple of dimensions: (), (n,) or (a, b, ...) with an optional comma.
  absl::StatusOr<std::vector<int64_t>> Shape() {
    if (!Take('(')) return Error("expected a shape tuple");
    std::vector<int64_t> dims;
    while (!Take(')')) {
      if (dims.size() >= 32) return Error("more than 32 dimensions");
      ASSIGN_OR_RETURN(const int64_t d, Integer());
      dims.push_back(d);
      if (Take(')')) break;
      if (!Take(',')) return Error("expected ',' or ')' in the shape");
    }
    return dims;
  }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": malformed .npy header: ", what, " at byte ",
                     pos_, " of the header dict"));
  }

 private:
  const absl::string_view text_;
  const std::string& name_;
  size_t pos_ = 0;
};

absl::StatusOr<NpyDtype> ParseDescr(const std::string& descr,
                                    const std::string& name) {
  if (descr.size() == 3) {
    for (const DtypeName& d : kDtypes) {
      if (descr.substr(1) != d.descr) continue;
      const bool one_byte = NpyItemSize(d.dtype) == 1;
      if (descr[0] == '<' || (descr[0] == '|' && one_byte)) return d.dtype;
      if (descr[0] == '>' && !one_byte) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": dtype '", descr,
            "' is big-endian; only little-endian arrays are read (write it "
            "with arr.astype(arr.dtype.newbyteorder('<')))"));
      }
      if (descr[0] == '>' || descr[0] == '=') return d.dtype;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      name, ": unsupported dtype '", descr,
      "' (supported: float32, int8/16/32/64, uint8/16/32/64; convert with "
      "arr.astype(np.float32) or an integer type)"));
}

// The header dict: exactly the three keys, each once, in any order.
absl::Status ParseDict(absl::string_view text, const std::string& name,
                       NpyHeader* header) {
  DictReader in(text, name);
  if (!in.Take('{')) return in.Error("expected '{'");
  bool have_descr = false, have_order = false, have_shape = false;
  while (!in.Take('}')) {
    ASSIGN_OR_RETURN(const std::string key, in.String());
    if (!in.Take(':')) return in.Error("expected ':'");
    if (key == "descr" && !have_descr) {
      ASSIGN_OR_RETURN(const std::string descr, in.String());
      ASSIGN_OR_RETURN(header->dtype, ParseDescr(descr, name));
      have_descr = true;
    } else if (key == "fortran_order" && !have_order) {
      ASSIGN_OR_RETURN(const bool fortran, in.Bool());
      if (fortran) {
        return absl::InvalidArgumentError(absl::StrCat(
            name,
            ": fortran_order is True; only C-order arrays are read "
            "(save np.ascontiguousarray(arr))"));
      }
      have_order = true;
    } else if (key == "shape" && !have_shape) {
      ASSIGN_OR_RETURN(header->shape, in.Shape());
      have_shape = true;
    } else {
      return in.Error(absl::StrCat("unexpected or repeated key '", key, "'"));
    }
    if (in.Take('}')) break;
    if (!in.Take(',')) return in.Error("expected ',' or '}'");
  }
  if (!in.AtEnd()) return in.Error("text after the dict");
  if (!have_descr || !have_order || !have_shape) {
    return in.Error("missing 'descr', 'fortran_order' or 'shape'");
  }
  return absl::OkStatus();
}

uint32_t LittleEndian(absl::string_view bytes) {
  uint32_t v = 0;
  for (size_t i = bytes.size(); i-- > 0;) {
    v = (v << 8) | static_cast<uint8_t>(bytes[i]);
  }
  return v;
}

// Where the dict starts and how long it is, from the preamble.
absl::Status ParsePreamble(absl::string_view file, const std::string& name,
                           int64_t* dict_start, int64_t* dict_bytes) {
  if (file.size() < 10 || file.substr(0, 6) != kMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is not a .npy file (no \\x93NUMPY magic string)"));
  }
  const int major = static_cast<uint8_t>(file[6]);
  const int minor = static_cast<uint8_t>(file[7]);
  if (minor != 0 || major < 1 || major > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": .npy format version ", major, ".", minor,
                     " is not supported (1.0, 2.0 or 3.0)"));
  }
  const int length_bytes = major == 1 ? 2 : 4;
  if (static_cast<int64_t>(file.size()) < 8 + length_bytes) {
    return absl::DataLossError(absl::StrCat(name, ": .npy header cut short"));
  }
  *dict_start = 8 + length_bytes;
  *dict_bytes = LittleEndian(file.substr(8, length_bytes));
  if (*dict_bytes > kMaxNpyHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": .npy header of ", *dict_bytes,
                     " bytes exceeds the limit of ", kMaxNpyHeaderBytes));
  }
  if (static_cast<int64_t>(file.size()) < *dict_start + *dict_bytes) {
    return absl::DataLossError(
        absl::StrCat(name, ": the file (", file.size(),
                     " bytes) is shorter than its .npy header says (",
                     *dict_start + *dict_bytes, " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status CountElements(const std::string& name, NpyHeader* header) {
  const int64_t item = NpyItemSize(header->dtype);
  int64_t n = 1;
  for (int64_t d : header->shape) {
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / item / d) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": shape (", absl::StrJoin(header->shape, ", "),
                       ") is too large"));
    }
    n *= d;
  }
  header->elements = n;
  header->data_bytes = n * item;
  return absl::OkStatus();
}

}  // namespace

int64_t NpyItemSize(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kInt8:
    case NpyDtype::kUint8:
      return 1;
    case NpyDtype::kInt16:
    case NpyDtype::kUint16:
      return 2;
    case NpyDtype::kFloat32:
    case NpyDtype::kInt32:
    case NpyDtype::kUint32:
      return 4;
    case NpyDtype::kInt64:
    case NpyDtype::kUint64:
      return 8;
  }
  return 1;
}

const char* NpyDtypeName(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kFloat32:
      return "float32";
    case NpyDtype::kInt8:
      return "int8";
    case NpyDtype::kUint8:
      return "uint8";
    case NpyDtype::kInt16:
      return "int16";
    case NpyDtype::kUint16:
      return "uint16";
    case NpyDtype::kInt32:
      return "int32";
    case NpyDtype::kUint32:
      return "uint32";
    case NpyDtype::kInt64:
      return "int64";
    case NpyDtype::kUint64:
      return "uint64";
  }
  return "unknown";
}

bool NpyIsInteger(NpyDtype dtype) { return dtype != NpyDtype::kFloat32; }

absl::StatusOr<NpyHeader> ParseNpyFile(absl::string_view file,
                                       const std::string& name) {
  int64_t dict_start = 0, dict_bytes = 0;
  RETURN_IF_ERROR(ParsePreamble(file, name, &dict_start, &dict_bytes));
  NpyHeader header;
  RETURN_IF_ERROR(
      ParseDict(file.substr(dict_start, dict_bytes), name, &header));
  RETURN_IF_ERROR(CountElements(name, &header));
  header.data_offset = dict_start + dict_bytes;
  const int64_t have = static_cast<int64_t>(file.size()) - header.data_offset;
  if (have != header.data_bytes) {
    return absl::DataLossError(absl::StrCat(
        name, ": the header announces ", NpyDtypeName(header.dtype), " (",
        absl::StrJoin(header.shape, ", "), ") = ", header.data_bytes,
        " data bytes, the file holds ", have,
        have < header.data_bytes ? " (cut short)" : " (trailing bytes)"));
  }
  return header;
}

int64_t NpyIntegerAt(const uint8_t* data, NpyDtype dtype, int64_t index) {
  auto load = [&](auto zero) -> int64_t {
    decltype(zero) v;
    std::memcpy(&v, data + index * sizeof(v), sizeof(v));  // little-endian
    return static_cast<int64_t>(v);
  };
  switch (dtype) {
    case NpyDtype::kInt8:
      return load(int8_t{});
    case NpyDtype::kUint8:
      return load(uint8_t{});
    case NpyDtype::kInt16:
      return load(int16_t{});
    case NpyDtype::kUint16:
      return load(uint16_t{});
    case NpyDtype::kInt32:
      return load(int32_t{});
    case NpyDtype::kUint32:
      return load(uint32_t{});
    case NpyDtype::kInt64:
      return load(int64_t{});
    case NpyDtype::kUint64:
      return load(uint64_t{});
    case NpyDtype::kFloat32:
      break;
  }
  return -1;
}

}  // namespace pipetrain
