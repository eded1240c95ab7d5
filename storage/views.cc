#include "storage/views.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace depthbench::storage {
namespace {

// Each view's SELECT; README.md "The database" documents the columns.
struct View {
  const char* name;
  const char* select;
};

const std::vector<View>& Views() {
  static const auto* views = new std::vector<View>{
      {"results_v1", R"sql(
SELECT s.name AS sweep, r.arch, r.layers, r.d_model, r.aspect_ratio, r.params,
       r.complete, r.best_lr, r.best_val_loss,
       NULLIF(r.best_job_id, 0) AS best_job_id, r.diagnostics_json
FROM results r JOIN sweeps s ON s.id = r.sweep_id)sql"},
      {"lrs_v1", R"sql(
SELECT s.name AS sweep, l.arch, l.layers, l.d_model, l.lr, l.jobs AS runs,
       l.ended, l.succeeded, l.diverged, l.failed,
       CASE WHEN l.succeeded > 0 THEN l.loss_sum / l.succeeded END AS mean_val_loss,
       NULLIF(l.best_job_id, 0) AS best_job_id, l.best_val_loss
FROM result_lrs l JOIN sweeps s ON s.id = l.sweep_id)sql"},
      {"runs_v1", R"sql(
SELECT s.name AS sweep, j.id AS job_id, j.arch, j.layers, j.d_model, j.lr,
       j.seed, j.state, j.val_loss, j.final_step, j.is_best,
       j.attempts_used AS attempts, j.reason, j.worker_id, j.checkpoint_dir,
       j.created_ms, j.updated_ms
FROM jobs j JOIN sweeps s ON s.id = j.sweep_id WHERE j.kind = 'train')sql"},
      {"metrics_v1", R"sql(
SELECT s.name AS sweep, m.job_id, j.kind, m.attempt_id, m.step, m.name,
       m.value, m.wall_ms
FROM canonical_metric_points m JOIN jobs j ON j.id = m.job_id
JOIN sweeps s ON s.id = j.sweep_id)sql"},
      {"diagnostics_v1", R"sql(
SELECT s.name AS sweep, j.parent_job_id AS job_id, j.arch, j.layers,
       j.d_model, j.lr, d.kind, d.data_json, d.job_id AS diagnose_job_id,
       d.created_ms
FROM diagnostics d JOIN jobs j ON j.id = d.job_id
JOIN sweeps s ON s.id = j.sweep_id)sql"},
      {"contract", R"sql(
SELECT 1 AS views_version,
       (SELECT MAX(version) FROM schema_version) AS schema_version)sql"},
  };
  return *views;
}

}  // namespace

const std::vector<std::string>& ViewNames() {
  static const auto* names = [] {
    auto* out = new std::vector<std::string>();
    for (const View& v : Views()) out->push_back(v.name);
    return out;
  }();
  return *names;
}

absl::Status DropViews(Database* db) {
  std::string sql;
  for (const View& v : Views()) absl::StrAppend(&sql, "DROP VIEW IF EXISTS ", v.name, ";");
  return db->Exec(sql);
}

absl::Status InstallViews(Database* db) {
  static_assert(kViewsVersion == 1, "the contract view states the version");
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db));
  RETURN_IF_ERROR(DropViews(db));
  for (const View& v : Views()) {
    absl::Status status = db->Exec(absl::StrCat("CREATE VIEW ", v.name, " AS", v.select));
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("view ", v.name, ": ", status.message()));
    }
  }
  return txn.Commit();
}

}  // namespace depthbench::storage
