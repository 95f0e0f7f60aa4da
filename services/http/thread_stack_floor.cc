// civetweb (Debian's 1.15) starts its threads with a compiled-in 100 KiB
// stack. glibc places a thread's static TLS on its stack, and a worker
// linked with cuBLAS and OpenBLAS needs about 170 KiB of static TLS, so
// those threads could not start (pthread_create fails with EINVAL). This
// definition interposes pthread_attr_setstacksize for the whole process and
// raises requested sizes to at least 1 MiB; sizes above that pass unchanged.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace {

constexpr size_t kMinThreadStackBytes = size_t{1} << 20;

using SetStackSizeFn = int (*)(pthread_attr_t*, size_t);

SetStackSizeFn RealSetStackSize() {
  static const SetStackSizeFn real = reinterpret_cast<SetStackSizeFn>(
      dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  return RealSetStackSize()(attr, std::max(size, kMinThreadStackBytes));
}

namespace pipetrain {
// Referenced by HttpServer so that the linker keeps this object.
size_t ThreadStackFloorBytes() { return kMinThreadStackBytes; }
}  // namespace pipetrain
