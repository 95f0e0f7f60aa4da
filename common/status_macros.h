// Status propagation macros used at every boundary of the project.
//
// Debian's abseil (20220623) has no ABSL_RETURN_IF_ERROR, so the project
// defines its own pair here, once.
#ifndef PIPETRAIN_COMMON_STATUS_MACROS_H_
#define PIPETRAIN_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PT_STATUS_CONCAT_INNER_(a, b) a##b
#define PT_STATUS_CONCAT_(a, b) PT_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::absl::Status pt_status_ = (expr);      \
    if (!pt_status_.ok()) return pt_status_; \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status,
// otherwise moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, rexpr)                                        \
  PT_ASSIGN_OR_RETURN_IMPL_(PT_STATUS_CONCAT_(pt_statusor_, __LINE__), lhs, \
                            rexpr)

#define PT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()

#endif  // PIPETRAIN_COMMON_STATUS_MACROS_H_
