# Helpers that keep every folder's CMakeLists.txt short and uniform
# (in the spirit of abseil's absl_cc_library / absl_cc_test).
include_guard(GLOBAL)

set(PIPETRAIN_WARNINGS -Wall -Wextra -Werror)

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
