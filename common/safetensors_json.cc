#include "common/safetensors_json.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace safetensors_internal {
namespace {

using nlohmann::json;

// A SAX handler that builds the value the way nlohmann's own DOM parser
// does, plus the two checks above. Returning false stops the parse.
class StrictDomBuilder {
 public:
  explicit StrictDomBuilder(int max_depth) : max_depth_(max_depth) {}

  bool null() { return Put(json(nullptr)); }
  bool boolean(bool v) { return Put(json(v)); }
  bool number_integer(json::number_integer_t v) { return Put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return Put(json(v)); }
  bool number_float(json::number_float_t v, const std::string&) {
    return Put(json(v));
  }
  bool string(std::string& v) { return Put(json(std::move(v))); }
  bool binary(json::binary_t&) { return Fail("binary values are not JSON"); }

  bool start_object(std::size_t) {
    if (!Open(json::object())) return false;
    keys_.emplace_back();
    return true;
  }
  bool key(std::string& k) {
    if (!keys_.back().insert(k).second) {
      return Fail(absl::StrCat("key \"", k, "\" appears twice in one object"));
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    keys_.pop_back();
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return Open(json::array()); }
  bool end_array() {
    open_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    return Fail(e.what());
  }

  const std::string& error() const { return error_; }
  json& root() { return root_; }

 private:
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  // Adds a scalar or a new container where the parse is, and returns it.
  // Pointers to open containers stay valid: only the innermost one grows.
  json* Add(json v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json* parent = open_.back();
    if (parent->is_array()) {
      parent->push_back(std::move(v));
      return &parent->back();
    }
    json& slot = (*parent)[key_];
    slot = std::move(v);
    return &slot;
  }
  bool Put(json v) {
    Add(std::move(v));
    return true;
  }
  bool Open(json container) {
    if (static_cast<int>(open_.size()) >= max_depth_) {
      return Fail(absl::StrCat("nested deeper than ", max_depth_, " levels"));
    }
    open_.push_back(Add(std::move(container)));
    return true;
  }

  const int max_depth_;
  json root_;
  std::vector<json*> open_;
  std::vector<std::set<std::string>> keys_;
  std::string key_;
  std::string error_;
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonStrict(absl::string_view text,
                                               int max_depth) {
  StrictDomBuilder builder(max_depth);
  bool ok = false;
  // The SAX parser reports errors through the handler; the try only keeps
  // a library exception (e.g. out of memory) from escaping (house rule 4).
  try {
    ok = json::sax_parse(text.begin(), text.end(), &builder);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!ok || !builder.error().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header is not valid JSON: ",
        builder.error().empty() ? "parse failed" : builder.error()));
  }
  return std::move(builder.root());
}

}  // namespace safetensors_internal
}  // namespace pipetrain
