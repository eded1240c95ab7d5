// The database's public face: SQL views that tools outside the scheduler
// (the sqlite3 CLI, pandas, notebooks) may read while it runs. Their names
// and columns are a contract, version 1 (kViewsVersion), documented in
// README.md "The database": a column is never renamed, retyped or removed
// under a `_v1` name; an incompatible change adds `_v2` views beside them.
// The tables underneath are private and may change with any migration.
//
//   results_v1      one row per (sweep, arch, layers, d_model) group
//   lrs_v1          one row per group and learning rate (seed tallies)
//   runs_v1         one row per training run (train job)
//   metrics_v1      one row per stored metric point
//   diagnostics_v1  one row per diagnostic result of a best run
//   contract        one row: the contract version and the schema version
//
// Views are not migrations: Migrate() drops them before changing tables and
// recreates them from this binary's definitions once the schema is current.
//
// Thread safety: functions over a Database the caller serialises.
#ifndef DEPTHBENCH_STORAGE_VIEWS_H_
#define DEPTHBENCH_STORAGE_VIEWS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "storage/sqlite.h"

namespace depthbench::storage {

inline constexpr int kViewsVersion = 1;

// The names of the public views, in the order above.
const std::vector<std::string>& ViewNames();

// Drops and recreates every public view in one transaction.
absl::Status InstallViews(Database* db);
// Drops every public view (missing ones are fine).
absl::Status DropViews(Database* db);

}  // namespace depthbench::storage

#endif  // DEPTHBENCH_STORAGE_VIEWS_H_
