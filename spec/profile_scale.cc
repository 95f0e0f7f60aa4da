#include "spec/profile_scale.h"

namespace pipetrain {

void ScaleLayerTimes(double factor, v1::ProfileResponse* profile) {
  if (!(factor > 0) || factor == 1.0) return;
  for (v1::LayerProfile& l : *profile->mutable_layers()) {
    l.set_forward_seconds(l.forward_seconds() * factor);
    l.set_backward_seconds(l.backward_seconds() * factor);
    l.set_optimizer_seconds(l.optimizer_seconds() * factor);
  }
}

}  // namespace pipetrain
