// Rescaling a measured profile: one taken at one speed, as a worker (or a
// process under a CPU limit) of another speed would see it. Shared by the
// worker's profiler (its cgroup CPU share) and the scheduler's growth
// decision (a joining worker's profile as the job's reference worker would
// see it), so that every per-layer time a profile carries is scaled alike.
#ifndef PIPETRAIN_SPEC_PROFILE_SCALE_H_
#define PIPETRAIN_SPEC_PROFILE_SCALE_H_

#include "pipetrain/v1/stage.pb.h"

namespace pipetrain {

// Multiplies every layer's forward, backward and optimizer seconds by
// `factor` (positive; anything else leaves the profile as it is).
void ScaleLayerTimes(double factor, v1::ProfileResponse* profile);

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_PROFILE_SCALE_H_
