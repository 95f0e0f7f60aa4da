# Helpers that keep every folder's CMakeLists.txt short and uniform
# (in the spirit of abseil's absl_cc_library / absl_cc_test).
include_guard(GLOBAL)

set(PIPETRAIN_WARNINGS -Wall -Wextra -Werror)

# Lock annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...) are
# checked by the compiler, not by eye: clang's -Wthread-safety, an error
# like every other warning of a project target. GCC has no such analysis, so
# asking for it there is a configuration error rather than a silent no-op.
if(PIPETRAIN_THREAD_SAFETY)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "PIPETRAIN_THREAD_SAFETY=ON needs clang "
      "(-DCMAKE_CXX_COMPILER=clang++); ${CMAKE_CXX_COMPILER_ID} has no "
      "-Wthread-safety")
  endif()
  list(APPEND PIPETRAIN_WARNINGS -Wthread-safety)
  message(STATUS "pipetrain: thread-safety analysis ON (-Wthread-safety)")
endif()

# pipetrain_cc_library(NAME name SRCS ... HDRS ... DEPS ...)
function(pipetrain_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;HDRS;DEPS" ${ARGN})
  if(ARG_SRCS)
    add_library(${ARG_NAME} STATIC ${ARG_SRCS} ${ARG_HDRS})
    target_include_directories(${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR})
    target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS})
    target_compile_options(${ARG_NAME} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:${PIPETRAIN_WARNINGS}>)
  else()
    add_library(${ARG_NAME} INTERFACE ${ARG_HDRS})
    target_include_directories(${ARG_NAME} INTERFACE ${PROJECT_SOURCE_DIR})
    target_link_libraries(${ARG_NAME} INTERFACE ${ARG_DEPS})
  endif()
endfunction()

# pipetrain_cc_test(NAME name SRCS ... DEPS ... [LABELS ...] [TIMEOUT s])
# Declares a GoogleTest binary and registers it with ctest.
function(pipetrain_cc_test)
  if(NOT PIPETRAIN_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  target_compile_options(${ARG_NAME} PRIVATE ${PIPETRAIN_WARNINGS})
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
  set(labels unit ${ARG_LABELS})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${labels}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "PIPETRAIN_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()
