#include "spec/init_from.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/message_differencer.h"

namespace pipetrain {
namespace {

using google::protobuf::util::MessageDifferencer;

absl::Status Bad(const std::string& init_from, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("init_from \"", init_from, "\": ", why));
}

// Whether layers of the same kind hold parameters of the same shapes. The
// parametrized kinds compare whole (every field of theirs shapes a
// parameter or changes what the parameters mean), except a layer norm's
// eps.
bool SameParameters(const v1::LayerSpec& a, const v1::LayerSpec& b) {
  switch (a.kind_case()) {
    case v1::LayerSpec::kLinear:
      return MessageDifferencer::Equals(a.linear(), b.linear());
    case v1::LayerSpec::kLayerNorm:
      return a.layer_norm().features() == b.layer_norm().features();
    case v1::LayerSpec::kEmbedding:
      return MessageDifferencer::Equals(a.embedding(), b.embedding());
    case v1::LayerSpec::kAttention:
      return MessageDifferencer::Equals(a.attention(), b.attention());
    case v1::LayerSpec::kTransformerBlock:
      return MessageDifferencer::Equals(a.transformer_block(),
                                        b.transformer_block());
    default:
      return true;  // no parameters
  }
}

std::string Brief(const v1::LayerSpec& layer) {
  std::string text = layer.ShortDebugString();
  return text.empty() ? "an empty layer" : text;
}

}  // namespace

absl::StatusOr<InitSource> ParseInitFrom(const std::string& init_from) {
  InitSource out;
  if (!absl::StartsWith(init_from, kInitFromJobPrefix)) {
    if (init_from.empty()) return Bad(init_from, "empty");
    out.path = init_from;
    return out;
  }
  out.kind = InitSource::Kind::kCheckpoint;
  std::string rest = init_from.substr(sizeof(kInitFromJobPrefix) - 1);
  const size_t at = rest.find('@');
  if (at != std::string::npos) {
    const std::string version = rest.substr(at + 1);
    if (!absl::SimpleAtoi(version, &out.version) || out.version <= 0) {
      return Bad(init_from, absl::StrCat("version \"", version,
                                         "\" is not a positive integer"));
    }
    rest.resize(at);
  }
  if (rest.empty()) {
    return Bad(init_from, "no job id (use job:ID or job:ID@VERSION)");
  }
  out.job_id = rest;
  return out;
}

absl::Status CheckSameParameters(const v1::ModelSpec& model,
                                 const v1::ModelSpec& saved) {
  if (model.input_kind() != saved.input_kind() ||
      !std::equal(model.input_shape().begin(), model.input_shape().end(),
                  saved.input_shape().begin(), saved.input_shape().end())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the saved model takes input [",
        absl::StrJoin(saved.input_shape(), ", "), "], this job's model [",
        absl::StrJoin(model.input_shape(), ", "), "]"));
  }
  if (model.layers_size() != saved.layers_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the saved model has ", saved.layers_size(),
                     " layers, this job's model ", model.layers_size()));
  }
  for (int i = 0; i < model.layers_size(); ++i) {
    const v1::LayerSpec& a = model.layers(i);
    const v1::LayerSpec& b = saved.layers(i);
    if (a.kind_case() != b.kind_case() || !SameParameters(a, b)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", i, " differs: saved {", Brief(b),
                       "}, this job's {", Brief(a), "}"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
