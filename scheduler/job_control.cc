// SchedulerCore's control thread and the calls that drive stage workers:
// starting, pausing, resuming, cancelling, finishing and evaluating jobs.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/job_entry.h"
#include "scheduler/scheduler_core.h"

namespace pipetrain {
namespace {

MemoryModel MemoryFor(const v1::JobSpec& spec) {
  if (spec.training().rematerialize()) return MemoryModel::kRematerialized;
  // ZB-H1 holds as many micro-batches as 1F1B (until their B pass).
  return spec.schedule() == v1::SCHEDULE_1F1B_FLUSH ||
                 spec.schedule() == v1::SCHEDULE_ZB_H1 ||
                 spec.schedule() == v1::SCHEDULE_ASYNC_1F1B ||
                 spec.schedule() == v1::SCHEDULE_2BW
             ? MemoryModel::kOneFOneB
             : MemoryModel::kGPipe;
}

double OptimizerStateFactor(const v1::OptimizerSpec& o) {
  if (o.has_adamw()) return 2.0;
  return o.has_sgd() && o.sgd().momentum() != 0 ? 1.0 : 0.0;
}

// Interleaving: the stage count K for `workers` idle workers (the largest
// that divides M and leaves every one of the K * v chunks a layer).
int InterleavedStageCount(const v1::JobSpec& spec, int workers, int v) {
  if (spec.num_stages() > 0) return spec.num_stages();
  const int64_t m = std::max<int64_t>(1, spec.training().micro_batches());
  const int layers = spec.training().model().layers_size();
  for (int k = std::min(workers, layers / v); k > 1; --k) {
    if (m % k == 0) return k;
  }
  return 1;
}

// Cuts `layers` into `chunks` contiguous non-empty ranges of about equal
// compute, as boundaries b[0] = 0 < ... < b[chunks] = layers.
std::vector<int> BalancedCuts(const std::vector<LayerCost>& layers,
                              int chunks) {
  const int n = static_cast<int>(layers.size());
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) {
    prefix[i + 1] =
        prefix[i] + layers[i].forward_seconds + layers[i].backward_seconds;
  }
  std::vector<int> cuts = {0};
  for (int j = 1; j < chunks; ++j) {
    const double target = prefix[n] * j / chunks;
    int b = cuts.back() + 1;
    while (b < n - (chunks - j) && prefix[b] < target) ++b;
    cuts.push_back(b);
  }
  cuts.push_back(n);
  return cuts;
}

}  // namespace

void SchedulerCore::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    Tick();
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(
                           static_cast<int>(options_.tick_seconds * 1000)));
  }
}

void SchedulerCore::Tick() {
  FlushProgress();
  registry_->Sweep(NowMs());
  std::vector<std::string> start, finish;
  std::vector<std::pair<std::string, std::string>> fail;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& id : job_order_) {
      JobEntry* e = jobs_.at(id).get();
      if (e->busy) continue;
      const v1::JobState state = e->job.state();
      if (state == v1::JOB_STATE_PENDING) {
        e->busy = true;
        start.push_back(id);
        continue;
      }
      if (state != v1::JOB_STATE_RUNNING && state != v1::JOB_STATE_PAUSED) {
        continue;
      }
      std::string why;
      bool done = state == v1::JOB_STATE_RUNNING;
      for (int s = 0; s < e->plan.stages_size() && why.empty(); ++s) {
        const auto w = registry_->Get(e->plan.stages(s).worker_id());
        const v1::StageReport& r = e->reports[s];
        if (!w.has_value() || w->state() == v1::WORKER_STATE_LOST) {
          why = absl::StrCat("worker ", e->plan.stages(s).worker_id(),
                             " of stage ", s, " was lost");
        } else if (w->job_id() != id) {
          why = absl::StrCat("worker ", w->id(), " of stage ", s,
                             " no longer runs this job (it restarted)");
        } else if (r.job_id() == id &&
                   r.status().state() == v1::STAGE_STATE_FAILED) {
          why = absl::StrCat("stage ", s, " failed: ", r.status().error());
        }
        done = done && r.job_id() == id &&
               r.status().state() == v1::STAGE_STATE_DONE &&
               r.status().next_step() >= e->job.total_steps();
      }
      if (!why.empty()) {
        e->busy = true;
        fail.emplace_back(id, why);
      } else if (done) {
        e->busy = true;
        finish.push_back(id);
      }
    }
  }
  for (const auto& [id, why] : fail) FailJob(id, why);
  for (const std::string& id : finish) Finish(id);
  for (const std::string& id : start) TryStart(id);
}

void SchedulerCore::TryStart(const std::string& job_id) {
  v1::Job job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = jobs_.at(job_id)->job;
  }
  const std::vector<v1::WorkerInfo> idle =
      registry_->Idle(job.spec().worker_selector());
  const int need = std::max(1, job.spec().num_stages());
  if (static_cast<int>(idle.size()) < need) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.at(job_id)->busy = false;  // wait for workers
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    SetState(jobs_.at(job_id).get(), v1::JOB_STATE_PLANNING);
  }
  absl::StatusOr<v1::Plan> plan = PlanJob(job, idle);
  absl::Status status = plan.status();
  if (status.ok()) {
    for (const auto& s : plan->stages()) {
      status = registry_->Assign(s.worker_id(), job_id, s.stage());
      if (!status.ok()) break;
    }
  }
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    JobEntry* e = jobs_.at(job_id).get();
    e->plan = *plan;
    e->has_plan = true;
    e->reports.assign(plan->stages_size(), v1::StageReport());
    if (store_ != nullptr) {
      const absl::Status s = store_->PutPlan(*plan);
      if (!s.ok()) PT_LOG(ERROR) << "cannot persist the plan: " << s;
    }
    PT_LOG(INFO) << job_id << " plan:\n" << plan->explanation();
  }
  if (status.ok()) status = LaunchStages(job_id, *plan);
  if (!status.ok()) {
    FailJob(job_id, absl::StrCat("could not start: ", status.ToString()));
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = jobs_.at(job_id).get();
  SetState(e, v1::JOB_STATE_RUNNING);
  e->busy = false;
}

absl::StatusOr<v1::Plan> SchedulerCore::PlanJob(
    const v1::Job& job, const std::vector<v1::WorkerInfo>& workers) {
  const auto start = std::chrono::steady_clock::now();
  const v1::TrainingSpec& training = job.spec().training();
  v1::ProfileRequest profile_request;
  *profile_request.mutable_spec() = training;
  profile_request.set_repetitions(3);
  ASSIGN_OR_RETURN(v1::ProfileResponse profile,
                   control_->Profile(workers[0].address(), profile_request));
  PlanRequest request;
  for (const v1::LayerProfile& l : profile.layers()) {
    LayerCost c;
    c.forward_seconds = l.forward_seconds();
    c.backward_seconds = l.backward_seconds();
    c.activation_bytes = l.activation_bytes();
    c.parameter_bytes = l.parameter_bytes();
    request.layers.push_back(c);
  }
  const double reference = workers[0].gemm_gflops();
  for (const v1::WorkerInfo& w : workers) {
    PlannerWorker p;
    p.id = w.id();
    p.speed = reference > 0 && w.gemm_gflops() > 0 ? w.gemm_gflops() / reference
                                                   : 1.0;
    p.memory_bytes = w.memory_bytes();
    auto zone = w.labels().find("zone");
    p.zone = zone == w.labels().end() ? "" : zone->second;
    request.workers.push_back(p);
  }
  request.topology = options_.topology;
  request.micro_batches =
      static_cast<int>(std::max<int64_t>(1, training.micro_batches()));
  request.num_stages = job.spec().num_stages();
  const bool interleaved = job.spec().schedule() == v1::SCHEDULE_INTERLEAVED;
  const int v = std::max(2, job.spec().virtual_stages());
  if (interleaved) {
    // The planner picks the workers and their order for K stages; the
    // layers are then cut into K * v chunks of equal compute, chunk j on
    // worker j mod K.
    request.num_stages =
        InterleavedStageCount(job.spec(), static_cast<int>(workers.size()), v);
  }
  request.memory = MemoryFor(job.spec());
  request.optimizer_state_factor = OptimizerStateFactor(training.optimizer());
  ASSIGN_OR_RETURN(PipelinePlan plan, PlanPipeline(request));
  const int k = static_cast<int>(plan.stages.size());
  auto even =
      EvaluatePlacement(request, EvenSplit(training.model().layers_size(), k));

  v1::Plan out;
  out.set_job_id(job.id());
  for (int s = 0; s < k; ++s) {
    const StageAssignment& a = plan.stages[s];
    v1::PlannedStage* p = out.add_stages();
    p->set_stage(s);
    p->set_layer_begin(a.layer_begin);
    p->set_layer_end(a.layer_end);
    p->set_worker_id(workers[a.worker].id());
    p->set_worker_address(workers[a.worker].address());
    p->set_compute_seconds(a.compute_seconds);
    p->set_transfer_seconds(a.transfer_seconds);
    p->set_memory_bytes(a.memory_bytes);
    p->set_memory_limit_bytes(workers[a.worker].memory_bytes());
  }
  if (interleaved) {
    const std::vector<int> cuts = BalancedCuts(request.layers, k * v);
    for (int s = 0; s < k; ++s) {
      v1::PlannedStage* p = out.mutable_stages(s);
      for (int c = 0; c < v; ++c) {
        v1::LayerRange* range = p->add_chunks();
        range->set_begin(cuts[c * k + s]);
        range->set_end(cuts[c * k + s + 1]);
      }
      p->set_layer_begin(p->chunks(0).begin());
      p->set_layer_end(p->chunks(v - 1).end());
    }
    std::string chunks = absl::StrCat("interleaved: ", k * v,
                                      " chunks of equal compute at layers");
    for (int c : cuts) absl::StrAppend(&chunks, " ", c);
    plan.explanation += chunks + "\n";
  }
  out.set_bottleneck_seconds(plan.bottleneck_seconds);
  out.set_bottleneck_stage(plan.bottleneck_stage);
  // The schedule sets the bubble: a step is M bottleneck micro-batches of
  // work stretched by it (GPipe: (M + K - 1) * bottleneck).
  const double bubble = model_->TheoreticalBubble(job.spec(), k);
  out.set_predicted_bubble(bubble);
  out.set_predicted_step_seconds(request.micro_batches *
                                 plan.bottleneck_seconds / (1.0 - bubble));
  if (even.ok())
    out.set_even_split_bottleneck_seconds(even->bottleneck_seconds);
  out.set_explanation(absl::StrCat("profiled on ", workers[0].id(), " (",
                                   profile.device(), ")\n", plan.explanation));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  out.set_planning_seconds(seconds);
  if (planning_seconds_ != nullptr) planning_seconds_->Observe(seconds);
  return out;
}

absl::Status SchedulerCore::LaunchStages(const std::string& job_id,
                                         const v1::Plan& plan) {
  v1::JobSpec spec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spec = jobs_.at(job_id)->job.spec();
  }
  const int k = plan.stages_size();
  int64_t steps_per_epoch = 0;
  for (int s = k - 1; s >= 0; --s) {
    v1::StageConfig config;
    config.set_job_id(job_id);
    *config.mutable_spec() = spec.training();
    config.set_stage(s);
    config.set_num_stages(k);
    config.set_layer_begin(plan.stages(s).layer_begin());
    config.set_layer_end(plan.stages(s).layer_end());
    if (s + 1 < k) config.set_downstream(plan.stages(s + 1).worker_address());
    if (plan.stages(s).chunks_size() > 0) {
      // Interleaved: chunk c of worker s feeds chunk c (or c + 1, from the
      // last worker) of the next worker, so the last one links to the first.
      config.set_virtual_stages(plan.stages(s).chunks_size());
      *config.mutable_chunks() = plan.stages(s).chunks();
      config.set_downstream(plan.stages((s + 1) % k).worker_address());
    }
    config.set_schedule(spec.schedule());
    config.set_wire_dtype(spec.wire_dtype());
    config.set_recv_timeout_s(options_.stage_recv_timeout_seconds);
    config.set_vertical_sync(spec.vertical_sync());
    ASSIGN_OR_RETURN(
        v1::ConfigureResponse r,
        control_->Configure(plan.stages(s).worker_address(), config));
    if (s == 0) steps_per_epoch = r.steps_per_epoch();
  }
  const v1::TrainingSpec& t = spec.training();
  const int64_t total =
      t.steps() > 0 ? t.steps() : t.epochs() * steps_per_epoch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    JobEntry* e = jobs_.at(job_id).get();
    e->job.set_total_steps(total);
    PersistJob(e->job);
  }
  for (int s = k - 1; s >= 0; --s) {
    RETURN_IF_ERROR(
        control_->Train(plan.stages(s).worker_address(), job_id, total)
            .status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::TensorProto>> SchedulerCore::FetchWeights(
    const std::vector<std::string>& addresses, const std::string& job_id) {
  std::vector<v1::TensorProto> weights;
  for (const std::string& address : addresses) {
    ASSIGN_OR_RETURN(v1::GetWeightsResponse r,
                     control_->GetWeights(address, job_id));
    for (v1::TensorProto& t : *r.mutable_weights()) {
      weights.push_back(std::move(t));
    }
  }
  return weights;
}

void SchedulerCore::Finish(const std::string& job_id) {
  v1::Job job;
  std::vector<std::string> addresses;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = jobs_.at(job_id)->job;
    addresses = jobs_.at(job_id)->Addresses();
  }
  absl::StatusOr<v1::EvalResult> eval = absl::UnknownError("not evaluated");
  auto weights = FetchWeights(addresses, job_id);
  if (weights.ok()) {
    eval = model_->Evaluate(job.spec().training(), *weights,
                            job.spec().eval_samples());
  } else {
    eval = weights.status();
  }
  registry_->Release(job_id);
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = jobs_.at(job_id).get();
  if (eval.ok()) {
    eval->set_step(e->job.step());
    *e->job.mutable_eval() = *eval;
    PT_LOG(INFO) << job_id << " evaluated: loss " << eval->loss()
                 << ", accuracy " << eval->accuracy() << " on "
                 << eval->samples() << " samples";
  } else {
    e->job.set_error(
        absl::StrCat("evaluation failed: ", eval.status().ToString()));
  }
  SetState(e, v1::JOB_STATE_COMPLETED);
  e->busy = false;
}

void SchedulerCore::StopStages(const std::vector<std::string>& addresses,
                               const std::string& job_id) {
  for (const std::string& address : addresses) {
    const absl::Status s = control_->Stop(address, job_id);
    if (!s.ok() && !absl::IsUnavailable(s) && !absl::IsNotFound(s)) {
      PT_LOG(WARNING) << "stopping " << job_id << " on " << address << ": "
                      << s;
    }
  }
}

void SchedulerCore::FailJob(const std::string& job_id, const std::string& why) {
  std::vector<std::string> addresses;
  {
    std::lock_guard<std::mutex> lock(mu_);
    addresses = jobs_.at(job_id)->Addresses();
  }
  PT_LOG(WARNING) << job_id << " failed: " << why;
  StopStages(addresses, job_id);
  registry_->Release(job_id);
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = jobs_.at(job_id).get();
  e->job.set_error(why);
  SetState(e, v1::JOB_STATE_FAILED);
  e->busy = false;
}

absl::StatusOr<v1::Job> SchedulerCore::PauseJob(const v1::JobActionRequest& r) {
  std::vector<std::string> addresses;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(JobEntry * e, Find(r.job_id()));
    if (e->job.state() != v1::JOB_STATE_RUNNING || e->busy) {
      return absl::FailedPreconditionError(
          absl::StrCat(r.job_id(), " is ", v1::JobState_Name(e->job.state()),
                       "; only a running job can be paused"));
    }
    e->busy = true;
    addresses = e->Addresses();
  }
  // Stage 0 leads: the target it reports (after the step it is in) is one
  // every later stage can still reach.
  absl::StatusOr<int64_t> target = control_->Train(addresses[0], r.job_id(), 0);
  for (size_t s = 1; target.ok() && s < addresses.size(); ++s) {
    target = control_->Train(addresses[s], r.job_id(), *target);
  }
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = jobs_.at(r.job_id()).get();
  e->busy = false;
  if (!target.ok()) return target.status();
  SetState(e, v1::JOB_STATE_PAUSED);
  return e->job;
}

absl::StatusOr<v1::Job> SchedulerCore::ResumeJob(
    const v1::JobActionRequest& r) {
  std::vector<std::string> addresses;
  int64_t total = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(JobEntry * e, Find(r.job_id()));
    if (e->job.state() != v1::JOB_STATE_PAUSED || e->busy) {
      return absl::FailedPreconditionError(
          absl::StrCat(r.job_id(), " is ", v1::JobState_Name(e->job.state()),
                       "; only a paused job can be resumed"));
    }
    e->busy = true;
    addresses = e->Addresses();
    total = e->job.total_steps();
  }
  absl::Status status;
  for (size_t s = addresses.size(); status.ok() && s-- > 0;) {
    status = control_->Train(addresses[s], r.job_id(), total).status();
  }
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = jobs_.at(r.job_id()).get();
  e->busy = false;
  RETURN_IF_ERROR(status);
  SetState(e, v1::JOB_STATE_RUNNING);
  return e->job;
}

absl::StatusOr<v1::Job> SchedulerCore::CancelJob(
    const v1::JobActionRequest& r) {
  std::vector<std::string> addresses;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(JobEntry * e, Find(r.job_id()));
    const v1::JobState s = e->job.state();
    if (s == v1::JOB_STATE_COMPLETED || s == v1::JOB_STATE_FAILED ||
        s == v1::JOB_STATE_CANCELLED) {
      return absl::FailedPreconditionError(absl::StrCat(
          r.job_id(), " already ended (", v1::JobState_Name(s), ")"));
    }
    if (e->busy) {
      return absl::UnavailableError(
          absl::StrCat(r.job_id(), " is being started or stopped; try again"));
    }
    e->busy = true;
    addresses = e->Addresses();
  }
  StopStages(addresses, r.job_id());
  registry_->Release(r.job_id());
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = jobs_.at(r.job_id()).get();
  e->busy = false;
  SetState(e, v1::JOB_STATE_CANCELLED);
  return e->job;
}

absl::StatusOr<v1::EvalResult> SchedulerCore::Evaluate(
    const v1::EvaluateRequest& r) {
  std::vector<std::string> addresses;
  v1::TrainingSpec spec;
  int64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(JobEntry * e, Find(r.job_id()));
    if (!e->has_plan || e->job.state() == v1::JOB_STATE_FAILED ||
        e->job.state() == v1::JOB_STATE_CANCELLED) {
      return absl::FailedPreconditionError(
          absl::StrCat(r.job_id(), " has no trained stages to evaluate (state ",
                       v1::JobState_Name(e->job.state()), ")"));
    }
    addresses = e->Addresses();
    spec = e->job.spec().training();
    step = e->job.step();
  }
  // While the job runs, stages may hold weights one step apart.
  ASSIGN_OR_RETURN(std::vector<v1::TensorProto> weights,
                   FetchWeights(addresses, r.job_id()));
  ASSIGN_OR_RETURN(v1::EvalResult result,
                   model_->Evaluate(spec, weights, r.max_samples()));
  result.set_step(step);
  return result;
}

}  // namespace pipetrain
