// The one conversion between the proto job enums that the scheduler and the
// storage records use and the lowercase text stored in SQLite's jobs.state and
// jobs.kind columns ("pending", "leased", ...; "train", "diagnose"). The
// stored text is fixed: old databases hold it, and the migrations' SQL
// (v5's result_lrs backfill, v4's pending index) names it.
//
// Thread safety: pure functions.
#ifndef DEPTHBENCH_STORAGE_JOB_TEXT_H_
#define DEPTHBENCH_STORAGE_JOB_TEXT_H_

#include <string>

#include "absl/status/statusor.h"
#include "depthbench/v1/types.pb.h"

namespace depthbench::storage {

// "pending" for PENDING etc.; "" for JOB_STATE_UNSPECIFIED or a value
// outside the enum.
const char* JobStateText(depthbench::v1::JobState state);
// The state stored as `text`; InvalidArgument naming the text (and the
// column) for anything else, the empty text included.
absl::StatusOr<depthbench::v1::JobState> ParseJobState(const std::string& text);

// "train" / "diagnose"; "" for JOB_KIND_UNSPECIFIED.
const char* JobKindText(depthbench::v1::JobKind kind);
absl::StatusOr<depthbench::v1::JobKind> ParseJobKind(const std::string& text);

// The state as an SQL string literal ('pending'), for SQL text that filters
// on a fixed state.
std::string SqlLiteral(depthbench::v1::JobState state);
std::string SqlLiteral(depthbench::v1::JobKind kind);

}  // namespace depthbench::storage

#endif  // DEPTHBENCH_STORAGE_JOB_TEXT_H_
