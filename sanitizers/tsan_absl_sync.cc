// ThreadSanitizer's view of abseil's Mutex and CondVar, for TSan builds
// against Debian's (uninstrumented) abseil.
//
// Why: TSan learns happens-before edges from the synchronization it sees.
// abseil announces its locks to TSan (__tsan_mutex_pre_lock, ...) only when
// abseil itself is compiled with -fsanitize=thread; Debian's libabsl is not,
// so every access guarded by an absl::Mutex would be reported as a race.
// This library, LD_PRELOADed into the TSan tests (make tsan), defines the
// public Mutex and CondVar entry points ahead of libabsl_synchronization,
// makes the same annotations abseil's own TSan build makes (mutex.cc's
// ABSL_TSAN_MUTEX_* calls) and calls the real function (dlsym RTLD_NEXT).
// Because it is preloaded, gRPC's absl::Mutex-based locks are annotated
// too. The __tsan_* hooks are weak: a process without TSan (ctest itself)
// loads this library and runs abseil unchanged.
//
// Built against the abseil headers of the system (the inline namespace in
// the mangled names, e.g. absl::debian3, comes from them).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"

extern "C" {
// The TSan runtime's mutex annotation interface
// (sanitizer/tsan_interface.h); weak so that non-TSan processes load this.
void __tsan_mutex_pre_lock(void* addr, unsigned flags) __attribute__((weak));
void __tsan_mutex_post_lock(void* addr, unsigned flags, int recursion)
    __attribute__((weak));
int __tsan_mutex_pre_unlock(void* addr, unsigned flags) __attribute__((weak));
void __tsan_mutex_post_unlock(void* addr, unsigned flags) __attribute__((weak));
}

namespace {

constexpr unsigned kReadLock = 1 << 3;       // __tsan_mutex_read_lock
constexpr unsigned kTryLock = 1 << 4;        // __tsan_mutex_try_lock
constexpr unsigned kTryLockFailed = 1 << 5;  // __tsan_mutex_try_lock_failed

bool Tsan() { return __tsan_mutex_pre_lock != nullptr; }

void PreLock(void* mu, unsigned flags) {
  if (Tsan()) __tsan_mutex_pre_lock(mu, flags);
}
void PostLock(void* mu, unsigned flags) {
  if (Tsan()) __tsan_mutex_post_lock(mu, flags, 0);
}
void PreUnlock(void* mu, unsigned flags) {
  if (Tsan()) __tsan_mutex_pre_unlock(mu, flags);
}
void PostUnlock(void* mu, unsigned flags) {
  if (Tsan()) __tsan_mutex_post_unlock(mu, flags);
}
// A wait that releases `mu` and takes it again before returning: TSan sees
// an unlock now; the caller announces the lock once the wait returns.
void ReleaseForWait(void* mu, unsigned flags) {
  PreUnlock(mu, flags);
  PostUnlock(mu, flags);
  PreLock(mu, flags);
}

// The next definition of `symbol` (libabsl_synchronization's).
void* Real(const char* symbol) {
  void* fn = dlsym(RTLD_NEXT, symbol);
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found\n", symbol);
    std::abort();
  }
  return fn;
}

// The real member function `symbol`, called as a function of (this,
// args...) (the Itanium C++ ABI). A macro, so that each call site (one per
// symbol) has its own cached lookup.
#define PT_CALL_REAL(R, symbol, ...)                              \
  ([](auto... args) -> R {                                        \
    static auto* fn =                                             \
        reinterpret_cast<R (*)(decltype(args)...)>(Real(symbol)); \
    return fn(args...);                                           \
  }(__VA_ARGS__))

}  // namespace

// Itanium-mangled names of the functions interposed below (inline namespace
// spliced in from the headers).
#define PT_NS_STR2(x) #x
#define PT_NS_STR(x) PT_NS_STR2(x)
#define PT_ABSL \
  "_ZN4absl" PT_NS_LEN PT_NS_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME)
#define PT_NS_LEN "7"  // strlen("debian3"); checked below
static_assert(sizeof(PT_NS_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME)) == 8,
              "update PT_NS_LEN for this abseil's inline namespace");

// ~Mutex is not defined here: TSan drops a heap mutex's state when its
// memory is freed, and announcing the destruction would be a write racing
// with the last unlock's annotation on threads that libgrpc orders.
// The *WithTimeout variants are not defined here: abseil implements each
// as a call to its *WithDeadline sibling through the PLT, which lands
// below (defining both would announce every such wait twice).
namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  PreLock(this, 0);
  PT_CALL_REAL(void, PT_ABSL "5Mutex4LockEv", this);
  PostLock(this, 0);
}

void Mutex::ReaderLock() {
  PreLock(this, kReadLock);
  PT_CALL_REAL(void, PT_ABSL "5Mutex10ReaderLockEv", this);
  PostLock(this, kReadLock);
}

void Mutex::Unlock() {
  PreUnlock(this, 0);
  PT_CALL_REAL(void, PT_ABSL "5Mutex6UnlockEv", this);
  PostUnlock(this, 0);
}

void Mutex::ReaderUnlock() {
  PreUnlock(this, kReadLock);
  PT_CALL_REAL(void, PT_ABSL "5Mutex12ReaderUnlockEv", this);
  PostUnlock(this, kReadLock);
}

bool Mutex::TryLock() {
  PreLock(this, kTryLock);
  const bool locked = PT_CALL_REAL(bool, PT_ABSL "5Mutex7TryLockEv", this);
  PostLock(this, kTryLock | (locked ? 0 : kTryLockFailed));
  return locked;
}

bool Mutex::ReaderTryLock() {
  PreLock(this, kReadLock | kTryLock);
  const bool locked =
      PT_CALL_REAL(bool, PT_ABSL "5Mutex13ReaderTryLockEv", this);
  PostLock(this, kReadLock | kTryLock | (locked ? 0 : kTryLockFailed));
  return locked;
}

void Mutex::LockWhen(const Condition& cond) {
  PreLock(this, 0);
  PT_CALL_REAL(void, PT_ABSL "5Mutex8LockWhenERKNS0_9ConditionE", this, &cond);
  PostLock(this, 0);
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  PreLock(this, 0);
  const bool met = PT_CALL_REAL(
      bool, PT_ABSL "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
      this, &cond, deadline);
  PostLock(this, 0);
  return met;
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  PreLock(this, kReadLock);
  PT_CALL_REAL(void, PT_ABSL "5Mutex14ReaderLockWhenERKNS0_9ConditionE", this,
               &cond);
  PostLock(this, kReadLock);
}

void Mutex::Await(const Condition& cond) {
  ReleaseForWait(this, 0);
  PT_CALL_REAL(void, PT_ABSL "5Mutex5AwaitERKNS0_9ConditionE", this, &cond);
  PostLock(this, 0);
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  ReleaseForWait(this, 0);
  const bool met = PT_CALL_REAL(
      bool, PT_ABSL "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE",
      this, &cond, deadline);
  PostLock(this, 0);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  ReleaseForWait(mu, 0);
  PT_CALL_REAL(void, PT_ABSL "7CondVar4WaitEPNS0_5MutexE", this, mu);
  PostLock(mu, 0);
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  ReleaseForWait(mu, 0);
  const bool timed_out = PT_CALL_REAL(
      bool, PT_ABSL "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE", this,
      mu, deadline);
  PostLock(mu, 0);
  return timed_out;
}

ABSL_NAMESPACE_END
}  // namespace absl
