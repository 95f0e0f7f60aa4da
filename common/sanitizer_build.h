// Whether this build runs under a sanitizer that brings its own allocator
// (AddressSanitizer, ThreadSanitizer): code that keeps freed memory or
// tunes glibc's allocator behaves differently there.
#ifndef PIPETRAIN_COMMON_SANITIZER_BUILD_H_
#define PIPETRAIN_COMMON_SANITIZER_BUILD_H_

namespace pipetrain {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizerBuild = true;
#else
inline constexpr bool kAddressSanitizerBuild = false;
#endif
#else
inline constexpr bool kAddressSanitizerBuild = false;
#endif

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizerBuild = true;
#else
inline constexpr bool kThreadSanitizerBuild = false;
#endif
#else
inline constexpr bool kThreadSanitizerBuild = false;
#endif

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SANITIZER_BUILD_H_
