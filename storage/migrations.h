// Versioned schema. Each migration is one SQL script applied in its own
// transaction together with the bump of `schema_version`, so a crash leaves
// the file at a whole version. Migrations only ever append: never edit one
// that has shipped.
//
// Thread safety: functions over a Database the caller serialises.
#ifndef DEPTHBENCH_STORAGE_MIGRATIONS_H_
#define DEPTHBENCH_STORAGE_MIGRATIONS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/sqlite.h"

namespace depthbench::storage {

// The version a fully migrated file has.
int64_t LatestSchemaVersion();

// The file's version (0 for a new file).
absl::StatusOr<int64_t> SchemaVersion(Database* db);

// Applies every migration above the file's version up to `target` (default:
// the latest). FailedPrecondition when the file is newer than this binary.
// Drops the public views (storage/views.h) before migrating and, when
// `target` is the latest version, (re)creates them afterwards.
absl::Status Migrate(Database* db, int64_t target = -1);

}  // namespace depthbench::storage

#endif  // DEPTHBENCH_STORAGE_MIGRATIONS_H_
