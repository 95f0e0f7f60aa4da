#include "worker/nn/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

absl::Status BadField(const char* field, float value, const char* want) {
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer.", field, " = ", value, ": ", want));
}

std::vector<std::string> SlotNames(const v1::OptimizerSpec& spec) {
  if (spec.has_adamw()) return {"m", "v"};
  if (spec.has_sgd() && spec.sgd().momentum() != 0) return {"momentum"};
  return {};
}

}  // namespace

Optimizer::Optimizer(const v1::OptimizerSpec& spec, Backend* backend)
    : spec_(spec), backend_(backend), slot_names_(SlotNames(spec)) {}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const v1::OptimizerSpec& spec, Backend* backend) {
  if (spec.clip_grad_norm() < 0) {
    return BadField("clip_grad_norm", spec.clip_grad_norm(), "must be >= 0");
  }
  v1::OptimizerSpec resolved = spec;
  switch (spec.kind_case()) {
    case v1::OptimizerSpec::kSgd: {
      const auto& s = spec.sgd();
      if (!(s.lr() > 0)) return BadField("sgd.lr", s.lr(), "must be > 0");
      if (s.momentum() < 0 || s.momentum() >= 1) {
        return BadField("sgd.momentum", s.momentum(), "must be in [0, 1)");
      }
      if (s.weight_decay() < 0) {
        return BadField("sgd.weight_decay", s.weight_decay(), "must be >= 0");
      }
      break;
    }
    case v1::OptimizerSpec::kAdamw: {
      auto* a = resolved.mutable_adamw();
      if (!(a->lr() > 0)) return BadField("adamw.lr", a->lr(), "must be > 0");
      if (a->beta1() == 0) a->set_beta1(0.9f);
      if (a->beta2() == 0) a->set_beta2(0.999f);
      if (a->eps() == 0) a->set_eps(1e-8f);
      if (a->beta1() < 0 || a->beta1() >= 1) {
        return BadField("adamw.beta1", a->beta1(), "must be in [0, 1)");
      }
      if (a->beta2() < 0 || a->beta2() >= 1) {
        return BadField("adamw.beta2", a->beta2(), "must be in [0, 1)");
      }
      if (a->weight_decay() < 0) {
        return BadField("adamw.weight_decay", a->weight_decay(),
                        "must be >= 0");
      }
      break;
    }
    case v1::OptimizerSpec::KIND_NOT_SET:
      return absl::InvalidArgumentError(
          "optimizer: set one of optimizer.sgd or optimizer.adamw");
  }
  return std::unique_ptr<Optimizer>(new Optimizer(resolved, backend));
}

absl::StatusOr<Optimizer::State*> Optimizer::StateFor(Param* param,
                                                      bool needs_v) {
  auto [it, inserted] = state_.try_emplace(param);
  if (inserted) {
    ASSIGN_OR_RETURN(it->second.m, backend_->Allocate(param->value.shape()));
    if (needs_v) {
      ASSIGN_OR_RETURN(it->second.v, backend_->Allocate(param->value.shape()));
    }
  }
  return &it->second;
}

absl::Status Optimizer::Step(const std::vector<Param*>& params,
                             float grad_scale) {
  StartStep();
  return Update(params, grad_scale);
}

absl::Status Optimizer::Update(const std::vector<Param*>& params,
                               float grad_scale) {
  for (Param* p : params) {
    if (p->grad_fresh) continue;
    const int64_t n = p->value.numel();
    if (spec_.has_sgd()) {
      const auto& s = spec_.sgd();
      float* m = nullptr;
      if (s.momentum() != 0) {
        ASSIGN_OR_RETURN(State * st, StateFor(p, false));
        m = st->m.f32();
      }
      RETURN_IF_ERROR(backend_->SgdUpdate(n, p->value.f32(), p->grad.f32(), m,
                                          s.lr(), s.momentum(),
                                          s.weight_decay(), grad_scale));
    } else {
      const auto& a = spec_.adamw();
      ASSIGN_OR_RETURN(State * st, StateFor(p, true));
      const float bias1 =
          1.0f - std::pow(a.beta1(), static_cast<float>(steps_));
      const float bias2 =
          1.0f - std::pow(a.beta2(), static_cast<float>(steps_));
      RETURN_IF_ERROR(backend_->AdamWUpdate(
          n, p->value.f32(), p->grad.f32(), st->m.f32(), st->v.f32(), a.lr(),
          a.beta1(), a.beta2(), a.eps(), a.weight_decay(), bias1, bias2,
          grad_scale));
    }
    ++p->version;
    p->grad_fresh = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> Optimizer::ExportSlots(
    const Param& param) const {
  std::vector<Tensor> out;
  auto it = state_.find(&param);
  if (it == state_.end()) return out;
  // Slot order: m holds "momentum" (SGD) or "m" (AdamW), v holds "v".
  for (const Tensor* slot : {&it->second.m, &it->second.v}) {
    if (out.size() == slot_names_.size()) break;
    ASSIGN_OR_RETURN(Tensor host, ToHost(backend_, *slot));
    out.push_back(std::move(host));
  }
  return out;
}

absl::Status Optimizer::ImportSlots(const Param& param,
                                    const std::vector<Tensor>& host) {
  if (host.empty()) {
    state_.erase(&param);
    return absl::OkStatus();
  }
  if (host.size() != slot_names_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(param.name, ": the optimizer keeps ", slot_names_.size(),
                     " state tensors per parameter, got ", host.size()));
  }
  State state;
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i].shape() != param.value.shape()) {
      return absl::InvalidArgumentError(
          absl::StrCat(param.name, ": optimizer slot ", slot_names_[i],
                       " has shape ", ShapeToString(host[i].shape()),
                       ", the parameter ", ShapeToString(param.value.shape())));
    }
    ASSIGN_OR_RETURN(Tensor device, ToDevice(backend_, host[i]));
    (i == 0 ? state.m : state.v) = std::move(device);
  }
  state_[&param] = std::move(state);
  return absl::OkStatus();
}

absl::StatusOr<double> GradSumSquares(Backend* backend,
                                      const std::vector<Param*>& params) {
  double total = 0.0;
  for (const Param* p : params) {
    if (p->grad_fresh) continue;
    ASSIGN_OR_RETURN(double s,
                     backend->SumSquares(p->grad.numel(), p->grad.f32()));
    total += s;
  }
  return total;
}

float ClipScale(double sum_squares, float max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double norm = std::sqrt(sum_squares);
  if (norm <= max_norm) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

}  // namespace pipetrain
