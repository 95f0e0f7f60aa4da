#include "worker/pipeline/stage_state.h"

namespace pipetrain {

int64_t ContextBytes(const std::vector<LayerContext>& contexts) {
  int64_t n = 0;
  for (const LayerContext& c : contexts) {
    for (const Tensor& t : c.saved) n += t.empty() ? 0 : t.bytes();
    n += ContextBytes(c.children);
  }
  return n;
}

}  // namespace pipetrain
