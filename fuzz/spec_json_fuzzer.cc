// Fuzzes the spec parser and validators: the JSON a user submits (job
// files, REST bodies) through common/proto_json's strict parser into a
// JobSpec and into a bare TrainingSpec, each then checked by spec/'s
// validators the way the scheduler, pipetrainctl and the worker check it.
// A valid job also gets its schedule's theoretical bubble computed on
// every stage count its model allows, as the scheduler does once planned.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/proto_json.h"
#include "spec/job_spec.h"
#include "spec/training_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  const std::string json(reinterpret_cast<const char*>(data), size);

  v1::TrainingSpec training;
  if (ParseJson(json, &training).ok()) {
    (void)ValidateTrainingSpec(training);
  }

  v1::JobSpec job;
  if (!ParseJson(json, &job).ok()) return 0;
  if (!ValidateJobSpec(job).ok()) return 0;
  // A valid job is planned on 1..layers stages (or its fixed count).
  const int layers = job.training().model().layers_size();
  const int first = job.num_stages() > 0 ? job.num_stages() : 1;
  const int last = job.num_stages() > 0 ? job.num_stages() : layers;
  for (int k = first; k <= std::min(last, 16); ++k) {
    (void)JobTheoreticalBubble(job, k);
  }
  return 0;
}
