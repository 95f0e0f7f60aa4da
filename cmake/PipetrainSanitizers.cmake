# Sanitizer and fuzzing builds (`make asan`, `make tsan`, `make fuzz`).
#
# PIPETRAIN_SANITIZE instruments every target of the build, project code,
# generated protobuf code and tests alike, so a finding anywhere in our code
# fails the test that reached it:
#   address,undefined   ASan + UBSan; UBSan does not recover (a finding
#                       aborts the test instead of printing and going on)
#   thread              TSan
# PIPETRAIN_FUZZ builds the libFuzzer targets in fuzz/; every object gets
# libFuzzer's coverage instrumentation (-fsanitize=fuzzer-no-link) and only
# the fuzz binaries link libFuzzer's main.
#
# Debian's gRPC, protobuf and abseil are not instrumented: what that means
# for each sanitizer is in fuzz/README.md and tsan.supp.
include_guard(GLOBAL)

set(PIPETRAIN_SANITIZE "" CACHE STRING
  "Sanitizers for every target: address,undefined | thread | empty (none)")
option(PIPETRAIN_FUZZ "Build the libFuzzer targets in fuzz/ (needs clang)" OFF)

if(PIPETRAIN_SANITIZE OR PIPETRAIN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "PIPETRAIN_SANITIZE / PIPETRAIN_FUZZ need clang "
      "(-DCMAKE_CXX_COMPILER=clang++ and libclang-rt-14-dev)")
  endif()
endif()

if(PIPETRAIN_SANITIZE)
  set(_pt_san_flags -fsanitize=${PIPETRAIN_SANITIZE} -fno-omit-frame-pointer)
  if(PIPETRAIN_SANITIZE MATCHES "undefined")
    list(APPEND _pt_san_flags -fno-sanitize-recover=all)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_pt_san_flags}>")
  add_link_options(${_pt_san_flags})
  message(STATUS "pipetrain: sanitizers ON (-fsanitize=${PIPETRAIN_SANITIZE})")
endif()

if(PIPETRAIN_FUZZ)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
  message(STATUS "pipetrain: libFuzzer targets ON")
endif()
