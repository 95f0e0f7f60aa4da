#include "worker/nn/model_state.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

constexpr absl::string_view kLayersPrefix = "layers.";
constexpr absl::string_view kOptimizerPrefix = "optimizer.";

// Names come from the network: quote at most a bounded prefix.
std::string Quoted(absl::string_view name) {
  constexpr size_t kMax = 200;
  if (name.size() <= kMax) return absl::StrCat("'", name, "'");
  return absl::StrCat("'", name.substr(0, kMax), "...'");
}

absl::Status BadName(absl::string_view name, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "state tensor ", Quoted(name), ": ", why,
      " (expected layers.{i}.{param} or optimizer.layers.{i}.{param}.{slot})"));
}

bool ValidPath(absl::string_view path) {
  if (path.empty() || path.front() == '.' || path.back() == '.') return false;
  if (absl::StrContains(path, "..")) return false;
  return std::all_of(path.begin(), path.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
           c == '.';
  });
}

Shape CheckpointShape(const Param& param) {
  Shape shape = param.value.shape();
  if (param.transposed) std::reverse(shape.begin(), shape.end());
  return shape;
}

// [rows, cols] -> [cols, rows] on the host. Its own inverse, so it converts
// a transposed param's values both ways.
Tensor Transpose2D(const Tensor& host) {
  const int64_t rows = host.dim(0);
  const int64_t cols = host.dim(1);
  Tensor out = Tensor::Host({cols, rows});
  const float* in = host.f32();
  float* o = out.f32();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) o[c * rows + r] = in[r * cols + c];
  }
  return out;
}

Tensor SwapLayout(const Param& param, Tensor host) {
  return param.transposed ? Transpose2D(host) : host;
}

std::vector<const Model*> ConstModels(const std::vector<Model*>& models) {
  return std::vector<const Model*>(models.begin(), models.end());
}

// What ImportTrainingState found for one parameter, checked.
struct ParamImport {
  Param* param = nullptr;
  const Tensor* value = nullptr;
  std::vector<const Tensor*> slots;  // empty: fresh optimizer state
};

absl::Status CheckOwnedTensors(const TrainingState& state,
                               const StateLayout& layout) {
  for (const auto& [name, tensor] : state.tensors) {
    bool owned = false;
    ASSIGN_OR_RETURN(Shape shape, layout.ShapeOf(name, &owned));
    if (!owned) continue;
    if (tensor.dtype() != DType::kF32 || tensor.device() != Device::kCpu) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state tensor ", Quoted(name), ": must be a float32 host tensor"));
    }
    if (tensor.shape() != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("state tensor ", Quoted(name), ": shape ",
                       ShapeToString(tensor.shape()),
                       " does not match the model's ", ShapeToString(shape)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ParamImport> FindParam(const TrainingState& state, Param* param,
                                      const std::vector<std::string>& slots) {
  ParamImport out;
  out.param = param;
  auto it = state.tensors.find(param->name);
  if (it == state.tensors.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state tensor ", Quoted(param->name),
                     " is missing (every parameter of the stage must come)"));
  }
  out.value = &it->second;
  std::vector<std::string> missing;
  for (const std::string& slot : slots) {
    auto s = state.tensors.find(OptimizerStateName(param->name, slot));
    if (s == state.tensors.end()) {
      missing.push_back(slot);
    } else {
      out.slots.push_back(&s->second);
    }
  }
  if (!out.slots.empty() && !missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state tensor ",
        Quoted(OptimizerStateName(param->name, missing.front())),
        " is missing: a parameter's optimizer slots (",
        absl::StrJoin(slots, ", "), ") come all together or not at all"));
  }
  return out;
}

absl::Status Apply(const ParamImport& in, Optimizer* optimizer,
                   Backend* backend) {
  const Tensor value = SwapLayout(*in.param, *in.value);
  RETURN_IF_ERROR(
      backend->CopyFromHost(value.f32(), value.numel(), in.param->value.f32()));
  ++in.param->version;
  std::vector<Tensor> slots;
  for (const Tensor* slot : in.slots) {
    slots.push_back(SwapLayout(*in.param, *slot));
  }
  return optimizer->ImportSlots(*in.param, slots);
}

}  // namespace

absl::StatusOr<StateName> ParseStateName(absl::string_view name) {
  StateName out;
  absl::string_view rest = name;
  const bool optimizer = absl::ConsumePrefix(&rest, kOptimizerPrefix);
  if (!absl::ConsumePrefix(&rest, kLayersPrefix)) {
    return BadName(name, "unknown name");
  }
  const size_t dot = rest.find('.');
  if (dot == absl::string_view::npos) return BadName(name, "no parameter");
  const absl::string_view index = rest.substr(0, dot);
  if (index.empty() || index.size() > 9 ||
      !std::all_of(index.begin(), index.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(index, &out.layer)) {
    return BadName(name, "the layer index is not a number");
  }
  absl::string_view path = rest.substr(dot + 1);
  if (!ValidPath(path)) return BadName(name, "malformed parameter name");
  if (optimizer) {
    const size_t last = path.rfind('.');
    if (last == absl::string_view::npos) {
      return BadName(name, "no optimizer slot");
    }
    out.slot = std::string(path.substr(last + 1));
    path = path.substr(0, last);
  }
  out.param = std::string(path);
  return out;
}

std::string OptimizerStateName(absl::string_view param_name,
                               absl::string_view slot) {
  return absl::StrCat(kOptimizerPrefix, param_name, ".", slot);
}

StateLayout StateLayout::Of(const std::vector<const Model*>& models,
                            const Optimizer& optimizer) {
  StateLayout out;
  out.slots_ = optimizer.slot_names();
  for (const Model* model : models) {
    out.ranges_.emplace_back(model->begin(), model->end());
    for (const Param* p : model->params()) {
      const Shape shape = CheckpointShape(*p);
      out.tensors_[p->name] = shape;
      out.params_.push_back(p->name);
      for (const std::string& slot : out.slots_) {
        out.tensors_[OptimizerStateName(p->name, slot)] = shape;
      }
      out.total_bytes_ += p->value.numel() *
                          static_cast<int64_t>(sizeof(float)) *
                          static_cast<int64_t>(1 + out.slots_.size());
    }
  }
  return out;
}

bool StateLayout::OwnsLayer(int layer) const {
  return std::any_of(ranges_.begin(), ranges_.end(), [layer](const auto& r) {
    return layer >= r.first && layer < r.second;
  });
}

absl::StatusOr<Shape> StateLayout::ShapeOf(absl::string_view name,
                                           bool* owned) const {
  ASSIGN_OR_RETURN(StateName parsed, ParseStateName(name));
  *owned = OwnsLayer(parsed.layer);
  if (!*owned) return Shape();
  auto it = tensors_.find(std::string(name));
  if (it != tensors_.end()) return it->second;
  const std::string param =
      absl::StrCat(kLayersPrefix, parsed.layer, ".", parsed.param);
  if (!parsed.slot.empty() && tensors_.count(param) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state tensor ", Quoted(name), ": the optimizer keeps no slot ",
        Quoted(parsed.slot), " (its slots: ",
        slots_.empty() ? "none" : absl::StrJoin(slots_, ", "), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("state tensor ", Quoted(name), ": layer ", parsed.layer,
                   " has no parameter ", Quoted(parsed.param)));
}

absl::StatusOr<TrainingState> ExportTrainingState(
    const std::vector<const Model*>& models, const Optimizer& optimizer,
    Backend* backend) {
  TrainingState out;
  out.optimizer_steps = optimizer.steps();
  const std::vector<std::string>& slots = optimizer.slot_names();
  for (const Model* model : models) {
    for (const Param* p : model->params()) {
      ASSIGN_OR_RETURN(Tensor value, ToHost(backend, p->value));
      out.tensors[p->name] = SwapLayout(*p, std::move(value));
      ASSIGN_OR_RETURN(std::vector<Tensor> state, optimizer.ExportSlots(*p));
      for (size_t i = 0; i < slots.size(); ++i) {
        // No state yet equals zero state (the optimizer starts from zeros),
        // so every parameter's slots are saved and a reader can insist on
        // all of them.
        Tensor slot = i < state.size() ? SwapLayout(*p, std::move(state[i]))
                                       : Tensor::Host(CheckpointShape(*p));
        if (i >= state.size()) std::fill_n(slot.f32(), slot.numel(), 0.0f);
        out.tensors[OptimizerStateName(p->name, slots[i])] = std::move(slot);
      }
    }
  }
  return out;
}

absl::Status ImportTrainingState(const TrainingState& state,
                                 const std::vector<Model*>& models,
                                 Optimizer* optimizer, Backend* backend) {
  const StateLayout layout = StateLayout::Of(ConstModels(models), *optimizer);
  RETURN_IF_ERROR(CheckOwnedTensors(state, layout));
  std::vector<ParamImport> imports;
  bool any_slots = false;
  for (Model* model : models) {
    for (Param* p : model->params()) {
      ASSIGN_OR_RETURN(ParamImport in,
                       FindParam(state, p, optimizer->slot_names()));
      any_slots = any_slots || !in.slots.empty();
      imports.push_back(std::move(in));
    }
  }
  // The optimizer state comes for every parameter or for none (a fresh
  // optimizer): a stream cut short must not pass for a fresh start.
  for (const ParamImport& in : imports) {
    if (any_slots && in.slots.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state tensor ",
          Quoted(OptimizerStateName(in.param->name,
                                    optimizer->slot_names().front())),
          " is missing: optimizer state must come for every parameter or "
          "for none"));
    }
  }
  // Everything checked: only now change the models.
  for (const ParamImport& in : imports) {
    RETURN_IF_ERROR(Apply(in, optimizer, backend));
  }
  const bool fresh = !optimizer->slot_names().empty() && !any_slots;
  optimizer->set_steps(fresh ? 0 : state.optimizer_steps);
  return absl::OkStatus();
}

}  // namespace pipetrain
