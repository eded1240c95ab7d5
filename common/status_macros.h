// Status plumbing shared by every module: errors are values at module
// boundaries (absl::Status / absl::StatusOr), and these two macros keep the
// happy path readable.
//
//   RETURN_IF_ERROR(expr);            // returns expr's status if not ok
//   ASSIGN_OR_RETURN(auto x, expr);   // unwraps a StatusOr or returns its error
//
// Thread safety: macros only; no state.
#ifndef DEPTHBENCH_COMMON_STATUS_MACROS_H_
#define DEPTHBENCH_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DB_STATUS_CONCAT_INNER_(a, b) a##b
#define DB_STATUS_CONCAT_(a, b) DB_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status db_status_tmp_ = (expr);          \
    if (!db_status_tmp_.ok()) return db_status_tmp_; \
  } while (0)

#define DB_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  DB_ASSIGN_OR_RETURN_IMPL_(DB_STATUS_CONCAT_(db_statusor_, __LINE__), lhs, expr)

#endif  // DEPTHBENCH_COMMON_STATUS_MACROS_H_
