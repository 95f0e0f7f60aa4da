#include "scheduler/fake_stage_control.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {

absl::Status FakeStageControl::Enter(Call call) {
  const Method method = call.method;
  const std::string address = call.address;
  calls_.push_back(std::move(call));
  if (killed_.count(address) > 0) {
    return absl::UnavailableError(absl::StrCat(address, " is not answering"));
  }
  auto it =
      std::find_if(scripts_.begin(), scripts_.end(), [&](const Script& s) {
        return s.method == method &&
               (s.address.empty() || s.address == address);
      });
  if (it == scripts_.end()) return absl::OkStatus();
  const Script script = *it;
  scripts_.erase(it);
  if (!script.hold) return script.status;
  ++held_;
  const int64_t generation = release_generation_;
  auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return release_generation_ != generation;
  };
  mu_.Await(absl::Condition(&released));
  --held_;
  return release_outcome_;
}

absl::StatusOr<FakeStageControl::StageSim*> FakeStageControl::Holding(
    const std::string& address, const std::string& job_id) {
  auto it = stages_.find(address);
  if (it == stages_.end() || it->second.view.job_id != job_id) {
    return absl::NotFoundError(
        absl::StrCat(address, " holds no stage of ", job_id));
  }
  return &it->second;
}

absl::StatusOr<v1::ProfileResponse> FakeStageControl::Profile(
    const std::string& address, const v1::ProfileRequest& request) {
  absl::MutexLock lock(&mu_);
  const int64_t asked = request.fastest() ? -int64_t{request.repetitions()}
                                          : request.repetitions();
  RETURN_IF_ERROR(Enter({Method::kProfile, address, "", asked, {}}));
  v1::ProfileResponse out;
  out.set_device("fake");
  auto slowdown = profile_slowdown_.find(address);
  const double factor =
      slowdown == profile_slowdown_.end() ? 1.0 : slowdown->second;
  for (int l = 0; l < request.spec().model().layers_size(); ++l) {
    v1::LayerProfile* p = out.add_layers();
    p->set_layer(l);
    p->set_forward_seconds(0.001 * factor);
    p->set_backward_seconds(0.002 * factor);
    p->set_activation_bytes(1024);
    p->set_parameter_bytes(4096);
  }
  return out;
}

void FakeStageControl::SetProfileSlowdown(const std::string& address,
                                          double factor) {
  absl::MutexLock lock(&mu_);
  profile_slowdown_[address] = factor;
}

absl::StatusOr<v1::ConfigureResponse> FakeStageControl::Configure(
    const std::string& address, const v1::StageConfig& config) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(
      Enter({Method::kConfigure, address, config.job_id(), 0, config}));
  StageSim& sim = stages_[address];
  sim = StageSim();
  sim.view.job_id = config.job_id();
  sim.view.stage = config.stage();
  sim.view.num_stages = config.num_stages();
  sim.view.state = v1::STAGE_STATE_CONFIGURED;
  sim.view.layer_begin = config.layer_begin();
  sim.view.layer_end = config.layer_end();
  sim.view.next_step = config.start_step();
  sim.view.until_step = config.start_step();
  sim.view.awaiting_restore = config.restore_expected();
  sim.view.attempt = config.attempt();
  sim.checkpoint_every = config.spec().checkpoint_every();
  v1::ConfigureResponse out;
  if (config.stage() == 0) out.set_steps_per_epoch(steps_per_epoch_);
  return out;
}

absl::StatusOr<int64_t> FakeStageControl::Train(const std::string& address,
                                                const std::string& job_id,
                                                int64_t until_step) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(Enter({Method::kTrain, address, job_id, until_step, {}}));
  ASSIGN_OR_RETURN(StageSim * sim, Holding(address, job_id));
  Stage& s = sim->view;
  if (s.state == v1::STAGE_STATE_FAILED) {
    return absl::FailedPreconditionError("the stage failed: " + s.error);
  }
  if (s.awaiting_restore) {
    return absl::FailedPreconditionError("the stage's state was not restored");
  }
  if (s.state == v1::STAGE_STATE_RUNNING) {
    // The step in progress always finishes.
    s.until_step = std::max(until_step, s.next_step + 1);
    return s.until_step;
  }
  if (until_step <= s.next_step) {
    s.state = v1::STAGE_STATE_DONE;
    return s.next_step;
  }
  s.until_step = until_step;
  s.state = v1::STAGE_STATE_RUNNING;
  return until_step;
}

absl::Status FakeStageControl::Stop(const std::string& address,
                                    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(Enter({Method::kStop, address, job_id, 0, {}}));
  ASSIGN_OR_RETURN(StageSim * sim, Holding(address, job_id));
  *sim = StageSim();
  return absl::OkStatus();
}

absl::Status FakeStageControl::AwaitEvaluators(const std::string& job_id,
                                               int num_stages) {
  EvalBarrier& barrier = barriers_[job_id];
  const int64_t generation = barrier.generation;
  if (++barrier.arrived >= num_stages) {
    barrier.arrived = 0;
    ++barrier.generation;
    return absl::OkStatus();
  }
  auto joined = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return barriers_[job_id].generation != generation;
  };
  const bool all = mu_.AwaitWithTimeout(absl::Condition(&joined),
                                        absl::FromChrono(evaluate_wait_));
  if (all) return absl::OkStatus();
  --barriers_[job_id].arrived;
  return absl::DeadlineExceededError(
      "the other stages of the job never joined the evaluation");
}

absl::StatusOr<v1::EvalResult> FakeStageControl::Evaluate(
    const std::string& address, const std::string& job_id,
    int64_t max_samples) {
  absl::MutexLock lock(&mu_);
  const absl::Status scripted =
      Enter({Method::kEvaluate, address, job_id, max_samples, {}});
  if (killed_.count(address) > 0) return scripted;  // joins nothing
  ASSIGN_OR_RETURN(StageSim * sim, Holding(address, job_id));
  const Stage view = sim->view;
  // A failing stage still takes part, so that its neighbours finish.
  RETURN_IF_ERROR(AwaitEvaluators(job_id, view.num_stages));
  RETURN_IF_ERROR(scripted);
  if (view.state == v1::STAGE_STATE_RUNNING) {
    return absl::FailedPreconditionError("the stage is training");
  }
  v1::EvalResult out;
  if (view.stage == view.num_stages - 1) {
    out = eval_result_;
    out.set_step(view.next_step);
  }
  return out;
}

absl::StatusOr<v1::GetTraceResponse> FakeStageControl::GetTrace(
    const std::string& address, const std::string& job_id, int64_t since_step) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(Enter({Method::kGetTrace, address, job_id, since_step, {}}));
  ASSIGN_OR_RETURN(StageSim * sim, Holding(address, job_id));
  v1::GetTraceResponse out;
  for (const v1::TraceEvent& e : sim->trace) {
    if (e.step() >= since_step) *out.add_events() = e;
  }
  return out;
}

void FakeStageControl::SetStepsPerEpoch(int64_t steps) {
  absl::MutexLock lock(&mu_);
  steps_per_epoch_ = steps;
}

void FakeStageControl::SetEvalResult(const v1::EvalResult& result) {
  absl::MutexLock lock(&mu_);
  eval_result_ = result;
}

void FakeStageControl::SetEvaluateWait(std::chrono::milliseconds wait) {
  absl::MutexLock lock(&mu_);
  evaluate_wait_ = wait;
}

void FakeStageControl::FailNext(Method method, const std::string& address,
                                absl::Status status) {
  absl::MutexLock lock(&mu_);
  scripts_.push_back({method, address, false, std::move(status)});
}

void FakeStageControl::HoldNext(Method method, const std::string& address) {
  absl::MutexLock lock(&mu_);
  scripts_.push_back({method, address, true, absl::OkStatus()});
}

bool FakeStageControl::WaitUntilHeld(std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  auto held = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_ > 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&held),
                              absl::FromChrono(timeout));
}

void FakeStageControl::Release(absl::Status outcome) {
  absl::MutexLock lock(&mu_);
  release_outcome_ = std::move(outcome);
  ++release_generation_;
}

void FakeStageControl::SetTrace(const std::string& address,
                                std::vector<v1::TraceEvent> events) {
  absl::MutexLock lock(&mu_);
  stages_[address].trace = std::move(events);
}

void FakeStageControl::Advance(int64_t steps) {
  absl::MutexLock lock(&mu_);
  for (auto& [address, sim] : stages_) {
    Stage& s = sim.view;
    if (s.state != v1::STAGE_STATE_RUNNING) continue;
    const int64_t end = std::min(s.until_step, s.next_step + steps);
    for (; s.next_step < end; ++s.next_step, TakeSnapshots(&sim)) {
      v1::StepResult r;
      r.set_step(s.next_step);
      r.set_loss(1.0 / (1.0 + s.next_step));
      r.set_accuracy(s.next_step / (1.0 + s.next_step));
      r.set_seconds(0.5);
      r.set_weight_version(s.next_step + 1);
      r.set_epoch(s.next_step / std::max<int64_t>(1, steps_per_epoch_));
      sim.unreported.push_back(r);
    }
    if (s.next_step >= s.until_step) s.state = v1::STAGE_STATE_DONE;
  }
}

void FakeStageControl::Kill(const std::string& address) {
  absl::MutexLock lock(&mu_);
  killed_.insert(address);
  stages_.erase(address);
}

void FakeStageControl::Revive(const std::string& address) {
  absl::MutexLock lock(&mu_);
  killed_.erase(address);
}

void FakeStageControl::FailStage(const std::string& address,
                                 const std::string& error) {
  absl::MutexLock lock(&mu_);
  Stage& s = stages_[address].view;
  s.state = v1::STAGE_STATE_FAILED;
  s.error = error;
}

void FakeStageControl::AddPeriodicEvaluation(const std::string& address,
                                             const v1::EvalResult& eval) {
  absl::MutexLock lock(&mu_);
  stages_[address].evaluations.push_back(eval);
}

std::optional<v1::StageReport> FakeStageControl::Report(
    const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = stages_.find(address);
  if (it == stages_.end() || it->second.view.job_id.empty()) {
    return std::nullopt;
  }
  StageSim& sim = it->second;
  v1::StageReport out;
  out.set_job_id(sim.view.job_id);
  out.set_stage(sim.view.stage);
  out.set_attempt(sim.view.attempt);
  v1::GetStatusResponse* status = out.mutable_status();
  status->set_state(sim.view.state);
  status->set_next_step(sim.view.next_step);
  status->set_weight_version(sim.view.next_step);
  status->set_error(sim.view.error);
  status->set_idle_fraction(0.25);
  for (const v1::StepResult& r : sim.unreported) *status->add_results() = r;
  for (const v1::EvalResult& e : sim.evaluations) {
    *status->add_evaluations() = e;
  }
  sim.unreported.clear();
  sim.evaluations.clear();
  return out;
}

FakeStageControl::Stage FakeStageControl::StageAt(
    const std::string& address) const {
  absl::MutexLock lock(&mu_);
  auto it = stages_.find(address);
  return it == stages_.end() ? Stage() : it->second.view;
}

std::vector<FakeStageControl::Call> FakeStageControl::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

std::vector<FakeStageControl::Call> FakeStageControl::CallsOf(
    Method method) const {
  absl::MutexLock lock(&mu_);
  std::vector<Call> out;
  for (const Call& c : calls_) {
    if (c.method == method) out.push_back(c);
  }
  return out;
}

StateTensor FakeStageControl::LayerState(int layer, int64_t step) {
  StateTensor t;
  t.name = absl::StrCat("layers.", layer, ".weight");
  t.shape = {2};
  const float values[2] = {static_cast<float>(layer), static_cast<float>(step)};
  t.data.assign(reinterpret_cast<const char*>(values), sizeof(values));
  return t;
}

void FakeStageControl::TakeSnapshots(StageSim* sim) {
  const int64_t b = sim->view.next_step;
  auto asked = std::find(sim->requested.begin(), sim->requested.end(), b);
  const bool periodic =
      sim->checkpoint_every > 0 && b > 0 && b % sim->checkpoint_every == 0;
  if (asked == sim->requested.end() && !periodic) return;
  if (asked != sim->requested.end()) sim->requested.erase(asked);
  std::vector<int64_t>& held = sim->view.snapshots;
  if (std::find(held.begin(), held.end(), b) != held.end()) return;
  held.push_back(b);
  if (held.size() > 2) held.erase(held.begin());
}

absl::StatusOr<int64_t> FakeStageControl::Snapshot(const std::string& address,
                                                   const std::string& job_id,
                                                   int64_t step) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(Enter({Method::kSnapshot, address, job_id, step, {}}));
  ASSIGN_OR_RETURN(StageSim * sim, Holding(address, job_id));
  if (step < sim->view.next_step) {
    return absl::FailedPreconditionError(
        absl::StrCat("the stage is past step ", step, "; its next step is ",
                     sim->view.next_step));
  }
  sim->requested.push_back(step);
  // Between Advance calls a stage sits at the boundary before next_step.
  TakeSnapshots(sim);
  return step;
}

absl::Status FakeStageControl::FetchSnapshot(const std::string& address,
                                             const std::string& job_id,
                                             int64_t step,
                                             const StageStateSink& sink) {
  std::vector<StateTensor> tensors;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Enter({Method::kFetchSnapshot, address, job_id, step, {}}));
    ASSIGN_OR_RETURN(StageSim * sim, Holding(address, job_id));
    const std::vector<int64_t>& held = sim->view.snapshots;
    if (std::find(held.begin(), held.end(), step) == held.end()) {
      return absl::NotFoundError(
          absl::StrCat(address, " holds no snapshot of step ", step));
    }
    for (int l = sim->view.layer_begin; l < sim->view.layer_end; ++l) {
      tensors.push_back(LayerState(l, step));
    }
  }
  // The sink runs without the lock: it may write files or call back.
  for (StateTensor& t : tensors) {
    RETURN_IF_ERROR(sink({step, step, step}, std::move(t)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FakeStageControl::RestoreState(
    const std::string& address, const std::string& job_id,
    const StageStateInfo& info, const std::vector<StateTensor>& tensors) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(
      Enter({Method::kRestoreState, address, job_id, info.step, {}}));
  ASSIGN_OR_RETURN(StageSim * sim, Holding(address, job_id));
  Stage& s = sim->view;
  if (!s.awaiting_restore) {
    return absl::FailedPreconditionError("the stage expects no restore");
  }
  int64_t loaded = 0;
  for (int l = s.layer_begin; l < s.layer_end; ++l) {
    const StateTensor want = LayerState(l, s.next_step);
    auto it =
        std::find_if(tensors.begin(), tensors.end(),
                     [&](const StateTensor& t) { return t.name == want.name; });
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat("missing ", want.name));
    }
    if (it->shape != want.shape || it->data != want.data) {
      return absl::InvalidArgumentError(
          absl::StrCat(want.name, " is not the state of step ", s.next_step));
    }
    ++loaded;
  }
  s.awaiting_restore = false;
  s.restored_tensors = loaded;
  return loaded;
}

}  // namespace pipetrain
