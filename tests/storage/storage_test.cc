#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "storage/job_text.h"
#include "storage/migrations.h"
#include "storage/reader_pool.h"
#include "storage/sqlite.h"
#include "storage/stores.h"
#include "storage/views.h"

namespace depthbench::storage {
namespace {

namespace v1 = ::depthbench::v1;

std::string TempDb(const std::string& name) {
  std::string dir = std::filesystem::temp_directory_path() /
                    ("db_storage_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string path = dir + "/" + name;
  std::filesystem::remove(path);
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  return path;
}

// A fresh in-memory database at the latest schema (nullptr, with the test
// failed, when that does not work).
std::unique_ptr<Database> MigratedMemoryDb() {
  auto db = Database::Open(":memory:");
  if (!db.ok()) {
    ADD_FAILURE() << db.status();
    return nullptr;
  }
  if (absl::Status migrated = Migrate(db->get()); !migrated.ok()) {
    ADD_FAILURE() << migrated;
    return nullptr;
  }
  return std::move(*db);
}

// Inserts the one sweep these tests use ("s"); -1 (with the test failed) on error.
int64_t InsertSweep(Database* db) {
  auto id = SweepStore(db).Insert({0, "s", "spec", 1, false});
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? *id : -1;
}

TEST(DatabaseTest, OpensInWalModeAndMapsErrors) {
  auto db = Database::Open(TempDb("wal.db"));
  ASSERT_TRUE(db.ok()) << db.status();
  auto q = (*db)->Prepare("PRAGMA journal_mode");
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(*q->Step());
  EXPECT_EQ(q->ColumnText(0), "wal");
  auto checkpoint = (*db)->Prepare("PRAGMA wal_autocheckpoint");
  ASSERT_TRUE(checkpoint.ok());
  ASSERT_TRUE(*checkpoint->Step());
  EXPECT_EQ(checkpoint->ColumnInt(0), 4000);

  auto bad = (*db)->Prepare("SELEKT 1");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(bad.status().message().find("SELEKT"), std::string::npos);

  ASSERT_TRUE((*db)->Exec("CREATE TABLE t(x INTEGER PRIMARY KEY)").ok());
  ASSERT_TRUE((*db)->Exec("INSERT INTO t VALUES (1)").ok());
  auto dup = (*db)->Prepare("INSERT INTO t VALUES (?)");
  ASSERT_TRUE(dup.ok());
  EXPECT_EQ(dup->Bind(1, int64_t{1}).Run().code(), absl::StatusCode::kAlreadyExists);
}

TEST(DatabaseTest, TransactionRollsBackUnlessCommitted) {
  auto db = Database::Open(":memory:");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE((*db)->Exec("CREATE TABLE t(x INTEGER)").ok());
  {
    auto txn = Transaction::Begin(db->get());
    ASSERT_TRUE(txn.ok());
    ASSERT_TRUE((*db)->Exec("INSERT INTO t VALUES (1)").ok());
  }  // rolled back
  {
    auto txn = Transaction::Begin(db->get());
    ASSERT_TRUE(txn.ok());
    ASSERT_TRUE((*db)->Exec("INSERT INTO t VALUES (2)").ok());
    ASSERT_TRUE(txn->Commit().ok());
  }
  auto q = (*db)->Prepare("SELECT COUNT(*), SUM(x) FROM t");
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(*q->Step());
  EXPECT_EQ(q->ColumnInt(0), 1);
  EXPECT_EQ(q->ColumnInt(1), 2);
}

TEST(MigrationTest, FreshFileReachesLatest) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  EXPECT_EQ(*SchemaVersion(db.get()), LatestSchemaVersion());
  // Idempotent.
  ASSERT_TRUE(Migrate(db.get()).ok());
  EXPECT_EQ(*SchemaVersion(db.get()), LatestSchemaVersion());
}

TEST(MigrationTest, UpgradesAnOldSchemaKeepingRows) {
  std::string path = TempDb("old.db");
  {
    auto db = Database::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE(Migrate(db->get(), 1).ok());
    EXPECT_EQ(*SchemaVersion(db->get()), 1);
    // Version 1 has no labels column yet.
    EXPECT_FALSE((*db)->Exec("SELECT labels_json FROM workers").ok());
    ASSERT_TRUE((*db)->Exec(
        "INSERT INTO workers(id, devices, memory_mb, slots, registered_ms, last_seen_ms) "
        "VALUES ('w1', 1, 1024, 2, 5, 6);"
        "INSERT INTO sweeps(name, spec, created_ms) VALUES ('s', x'', 1);"
        "INSERT INTO results(sweep_id, arch, layers, d_model, aspect_ratio, params) "
        "VALUES (1, 'pre_ln', 4, 96, 24.0, 1000);").ok());
  }
  auto db = Database::Open(path);
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE(Migrate(db->get()).ok());
  EXPECT_EQ(*SchemaVersion(db->get()), LatestSchemaVersion());
  WorkerStore workers(db->get());
  auto w = workers.Get("w1");
  ASSERT_TRUE(w.ok() && w->has_value());
  EXPECT_EQ((*w)->slots, 2);
  EXPECT_EQ((*w)->labels_json, "{}");
  ResultStore results(db->get());
  auto rows = results.List(1);
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].diagnostics_json, "{}");
  EXPECT_EQ((*rows)[0].params, 1000);
}

TEST(MigrationTest, RefusesNewerFile) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  ASSERT_TRUE(db->Exec("UPDATE schema_version SET version = 999").ok());
  EXPECT_EQ(Migrate(db.get()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MetricStoreTest, InsertIsIdempotentPerJobAttemptStepName) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  MetricStore metrics(db.get());
  std::vector<MetricRecord> points = {
      {0, 1, 10, 1, "loss", 3.0, 0}, {0, 1, 10, 1, "lr", 1e-3, 0},
      {0, 1, 10, 2, "loss", 2.9, 0}};
  auto first = metrics.Insert(points);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->accepted, 3);
  EXPECT_EQ(first->duplicates, 0);
  points.push_back({0, 1, 10, 3, "loss", 2.8, 0});
  points[0].value = 99.0;  // a re-sent point never overwrites
  auto second = metrics.Insert(points);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->accepted, 1);
  EXPECT_EQ(second->duplicates, 3);
  // Same step under another attempt is a different point.
  auto other = metrics.Insert({{0, 1, 11, 1, "loss", 3.1, 0}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->accepted, 1);
  EXPECT_EQ(*metrics.Count(1, 10), 4);
  auto read = metrics.Read(1, 0, 2, 100);
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read->size(), 2u);  // steps 2 and 3 of attempt 10
  EXPECT_EQ((*read)[0].step, 2);
  auto all = metrics.Read(1, 0, 0, 100);
  ASSERT_TRUE(all.ok());
  EXPECT_DOUBLE_EQ((*all)[0].value, 3.0);
}

// Schema v5 (issue 19): a later attempt's resume moves earlier attempts'
// later points out of the canonical history, which Read (attempt 0) and the
// canonical_metric_points view return; Read(attempt) still has them all.
TEST(MetricStoreTest, SupersedeKeepsEachStepOnceAndPerAttemptPointsReadable) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  MetricStore metrics(db.get());
  std::vector<MetricRecord> first;
  for (int64_t s = 1; s <= 6; ++s) first.push_back({0, 1, 10, s, "loss", 1.0 * s, 0});
  ASSERT_TRUE(metrics.Insert(first).ok());
  // Another job's points are not touched.
  ASSERT_TRUE(metrics.Insert({{0, 2, 5, 9, "loss", 1.0, 0}}).ok());
  // Attempt 11 resumed from step 4: steps 5 and 6 of attempt 10 abandoned.
  auto superseded = metrics.Supersede(1, 11, 4);
  ASSERT_TRUE(superseded.ok());
  EXPECT_EQ(*superseded, 2);
  EXPECT_EQ(*metrics.Supersede(1, 11, 4), 0);  // idempotent
  std::vector<MetricRecord> second;
  for (int64_t s = 5; s <= 8; ++s) second.push_back({0, 1, 11, s, "loss", 10.0 * s, 0});
  // A replayed step (<= 4) is stored only where the history lacks it.
  second.push_back({0, 1, 11, 3, "loss", 99.0, 0});
  auto counts = metrics.Insert(second, /*replay_through=*/4);
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->accepted, 4);
  EXPECT_EQ(counts->duplicates, 1);
  auto canonical = metrics.Read(1, 0, 0, 100);
  ASSERT_TRUE(canonical.ok());
  std::map<int64_t, std::pair<int64_t, double>> by_step;
  for (const MetricRecord& p : *canonical) {
    EXPECT_TRUE(by_step.emplace(p.step, std::make_pair(p.attempt_id, p.value)).second)
        << "step " << p.step << " twice";
    EXPECT_EQ(p.superseded_by, 0);
  }
  ASSERT_EQ(by_step.size(), 8u);
  EXPECT_EQ(by_step[4], std::make_pair(int64_t{10}, 4.0));
  EXPECT_EQ(by_step[5], std::make_pair(int64_t{11}, 50.0));
  auto attempt = metrics.Read(1, 0, 0, 100, /*attempt_id=*/10);
  ASSERT_TRUE(attempt.ok());
  ASSERT_EQ(attempt->size(), 6u);
  EXPECT_EQ(attempt->back().superseded_by, 11);
  auto view = db->Prepare(
      "SELECT COUNT(*), COUNT(DISTINCT step) FROM canonical_metric_points WHERE job_id = 1");
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE(*view->Step());
  EXPECT_EQ(view->ColumnInt(0), 8);
  EXPECT_EQ(view->ColumnInt(1), 8);
}

TEST(JobStoreTest, RecordsWhereAnAttemptResumed) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  ASSERT_EQ(InsertSweep(db.get()), 1);
  JobStore jobs(db.get());
  JobRecord job;
  job.sweep_id = 1;
  job.arch = "pre_ln";
  job.config_json = "{}";
  job.checkpoint_dir = "s/1";
  auto job_id = jobs.Insert(job);
  ASSERT_TRUE(job_id.ok());
  AttemptRecord a;
  a.job_id = *job_id;
  a.number = 1;
  a.worker_id = "w";
  auto attempt_id = jobs.InsertAttempt(a);
  ASSERT_TRUE(attempt_id.ok());
  EXPECT_FALSE((*jobs.GetAttempt(*attempt_id))->resumed_from_step.has_value());
  ASSERT_TRUE(jobs.SetResumedFromStep(*attempt_id, 40).ok());
  EXPECT_EQ((*jobs.GetAttempt(*attempt_id))->resumed_from_step, 40);
  EXPECT_EQ(jobs.SetResumedFromStep(12345, 1).code(), absl::StatusCode::kNotFound);
}

TEST(JobStoreTest, RoundTripsAndFilters) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  SweepStore sweeps(db.get());
  auto sweep_id = sweeps.Insert({0, "s", "spec", 1, false});
  ASSERT_TRUE(sweep_id.ok());
  EXPECT_EQ(sweeps.Insert({0, "s", "spec", 1, false}).status().code(),
            absl::StatusCode::kAlreadyExists);
  JobStore jobs(db.get());
  JobRecord job;
  job.sweep_id = *sweep_id;
  job.arch = "pre_ln";
  job.layers = 4;
  job.d_model = 96;
  job.lr = 1e-3;
  job.checkpoint_dir = "s/1";
  job.val_loss = 2.5;
  auto id = jobs.Insert(job);
  ASSERT_TRUE(id.ok());
  job.arch = "hc";
  job.val_loss.reset();
  ASSERT_TRUE(jobs.Insert(job).ok());
  auto got = jobs.Get(*id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->arch, "pre_ln");
  ASSERT_TRUE(got->val_loss.has_value());
  EXPECT_DOUBLE_EQ(*got->val_loss, 2.5);
  JobFilter filter;
  filter.arch = "hc";
  auto listed = jobs.List(filter);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_FALSE((*listed)[0].val_loss.has_value());
  EXPECT_EQ(jobs.Get(999).status().code(), absl::StatusCode::kNotFound);
}

// Successive-halving decisions (schema v7, issue 15): one per (job, rung),
// listed per group, gone with their sweep.
TEST(ResultStoreTest, RungDecisionsArePerJobAndRungAndDeletedWithTheSweep) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  SweepStore sweeps(db.get());
  auto sweep_id = sweeps.Insert({0, "s", "spec", 1, false});
  ASSERT_TRUE(sweep_id.ok());
  JobStore jobs(db.get());
  JobRecord job;
  job.sweep_id = *sweep_id;
  job.arch = "pre_ln";
  job.layers = 4;
  job.d_model = 96;
  job.checkpoint_dir = "s/1";
  auto a = jobs.Insert(job);
  job.layers = 6;  // another group
  auto b = jobs.Insert(job);
  ASSERT_TRUE(a.ok() && b.ok());
  ResultStore results(db.get());
  ASSERT_TRUE(results.InsertRung({*a, 0, 10, 3.5, "promote", 1}).ok());
  ASSERT_TRUE(results.InsertRung({*a, 1, 30, std::nullopt, "diverged", 2}).ok());
  ASSERT_TRUE(results.InsertRung({*b, 0, 10, 4.0, "prune", 3}).ok());
  // A second decision of the same run at the same rung is refused.
  EXPECT_FALSE(results.InsertRung({*a, 0, 10, 3.0, "prune", 4}).ok());
  auto group = results.ListGroupRungs(*sweep_id, "pre_ln", 4, 96);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->size(), 2u);
  EXPECT_EQ((*group)[0].decision, "promote");
  EXPECT_DOUBLE_EQ(*(*group)[0].val_loss, 3.5);
  EXPECT_EQ((*group)[1].rung, 1);
  EXPECT_EQ((*group)[1].step, 30);
  EXPECT_FALSE((*group)[1].val_loss.has_value());
  // A paused run's row gets its final decision in place; a missing row is
  // NotFound and changes nothing.
  ASSERT_TRUE(results.InsertRung({*a, 2, 60, 3.1, "pause", 5}).ok());
  ASSERT_TRUE(results.UpdateRungDecision(*a, 2, "promote", 6).ok());
  EXPECT_EQ(results.UpdateRungDecision(*a, 3, "prune", 7).code(), absl::StatusCode::kNotFound);
  group = results.ListGroupRungs(*sweep_id, "pre_ln", 4, 96);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->size(), 3u);
  EXPECT_EQ((*group)[2].decision, "promote");
  EXPECT_EQ((*group)[2].decided_ms, 6);
  EXPECT_DOUBLE_EQ(*(*group)[2].val_loss, 3.1);
  ASSERT_TRUE(sweeps.Delete(*sweep_id).ok());
  auto left = db->Prepare("SELECT COUNT(*) FROM rung_results");
  ASSERT_TRUE(left.ok());
  ASSERT_TRUE(*left->Step());
  EXPECT_EQ(left->ColumnInt(0), 0);
}

// The pending-jobs lookup AcquireJob runs: oldest first, only pending jobs
// whose backoff has passed and whose resource needs fit, labels decided by
// the caller, and a bounded scan.
TEST(JobStoreTest, FindRunnablePicksTheOldestFittingPendingJob) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  const int64_t sweep_id = InsertSweep(db.get());
  ASSERT_GT(sweep_id, 0);
  JobStore jobs(db.get());
  auto add = [&](v1::JobState state, int64_t not_before, int64_t devices,
                 int64_t memory, const std::string& labels) {
    JobRecord job;
    job.sweep_id = sweep_id;
    job.arch = "pre_ln";
    job.state = state;
    job.not_before_ms = not_before;
    job.req_devices = devices;
    job.req_memory_mb = memory;
    job.req_labels = labels;
    job.checkpoint_dir = "c";
    auto id = jobs.Insert(job);
    EXPECT_TRUE(id.ok());
    return *id;
  };
  int64_t leased = add(v1::LEASED, 0, 0, 0, "{}");
  int64_t backoff = add(v1::PENDING, 5000, 0, 0, "{}");
  int64_t gpu = add(v1::PENDING, 0, 2, 0, "{}");
  int64_t big = add(v1::PENDING, 0, 0, 4096, "{}");
  int64_t labelled = add(v1::PENDING, 0, 0, 0, R"({"pool":"a"})");
  int64_t plain = add(v1::PENDING, 0, 0, 0, "{}");
  auto any = [](const std::string&) { return true; };
  auto unlabelled = [](const std::string& labels) { return labels == "{}"; };

  auto found = jobs.FindRunnable(1000, 0, 0, any, 100);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, labelled);
  found = jobs.FindRunnable(1000, 0, 0, unlabelled, 100);
  EXPECT_EQ(*found, plain);
  found = jobs.FindRunnable(1000, 2, 4096, any, 100);
  EXPECT_EQ(*found, gpu);
  found = jobs.FindRunnable(1000, 0, 4096, any, 100);
  EXPECT_EQ(*found, big);
  found = jobs.FindRunnable(6000, 0, 0, any, 100);
  EXPECT_EQ(*found, backoff);
  found = jobs.FindRunnable(1000, 0, 0, unlabelled, 1);  // only `labelled` scanned
  EXPECT_EQ(*found, std::nullopt);

  // A job leaves and re-enters the pending set with its state.
  auto job = jobs.Get(plain);
  ASSERT_TRUE(job.ok());
  job->state = v1::LEASED;
  ASSERT_TRUE(jobs.Update(*job).ok());
  EXPECT_EQ(*jobs.FindRunnable(1000, 0, 0, unlabelled, 100), std::nullopt);
  job = jobs.Get(leased);
  job->state = v1::PENDING;
  ASSERT_TRUE(jobs.Update(*job).ok());
  EXPECT_EQ(*jobs.FindRunnable(1000, 0, 0, unlabelled, 100), leased);
}

TEST(JobStoreTest, ListGroupAndSetBest) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  const int64_t sweep_id = InsertSweep(db.get());
  ASSERT_GT(sweep_id, 0);
  JobStore jobs(db.get());
  JobRecord job;
  job.sweep_id = sweep_id;
  job.arch = "hc";
  job.layers = 4;
  job.d_model = 96;
  job.checkpoint_dir = "c";
  job.lr = 1e-3;
  job.state = v1::SUCCEEDED;
  job.val_loss = 2.5;
  auto first = jobs.Insert(job);
  job.lr = 2e-3;
  job.state = v1::RUNNING;
  job.val_loss.reset();
  auto second = jobs.Insert(job);
  job.kind = v1::DIAGNOSE;  // not a member: diagnostics are not train runs
  ASSERT_TRUE(jobs.Insert(job).ok());
  job.kind = v1::TRAIN;
  job.d_model = 128;  // another group
  ASSERT_TRUE(jobs.Insert(job).ok());
  ASSERT_TRUE(first.ok() && second.ok());

  ASSERT_TRUE(jobs.SetBest(*first, true).ok());
  auto group = jobs.ListGroup(sweep_id, "hc", 4, 96);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->size(), 2u);
  EXPECT_EQ((*group)[0].id, *first);
  EXPECT_EQ((*group)[0].state, v1::SUCCEEDED);
  EXPECT_DOUBLE_EQ((*group)[0].lr, 1e-3);
  ASSERT_TRUE((*group)[0].val_loss.has_value());
  EXPECT_DOUBLE_EQ(*(*group)[0].val_loss, 2.5);
  EXPECT_TRUE((*group)[0].is_best);
  EXPECT_EQ((*group)[1].id, *second);
  EXPECT_FALSE((*group)[1].val_loss.has_value());
  EXPECT_FALSE((*group)[1].is_best);
  EXPECT_TRUE(jobs.Get(*first)->is_best);
  EXPECT_EQ(jobs.SetBest(999, true).code(), absl::StatusCode::kNotFound);
}

TEST(ResultStoreTest, UpsertUpdatesInPlaceKeepingSubmissionOrder) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  ResultStore results(db.get());
  ResultRecord row;
  row.sweep_id = 1;
  row.arch = "pre_ln";
  row.layers = 4;
  row.d_model = 96;
  ASSERT_TRUE(results.Upsert(row).ok());
  row.layers = 8;
  ASSERT_TRUE(results.Upsert(row).ok());
  row.layers = 4;  // the first row again
  row.best_lr = 1e-3;
  row.best_val_loss = 2.25;
  row.best_job_id = 7;
  row.complete = true;
  row.diagnostics_json = R"({"deff":1})";
  ASSERT_TRUE(results.Upsert(row).ok());
  auto rows = results.List(1);
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].layers, 4);  // still first: updated, not re-inserted
  EXPECT_EQ((*rows)[1].layers, 8);
  ASSERT_TRUE((*rows)[0].best_lr.has_value());
  EXPECT_DOUBLE_EQ(*(*rows)[0].best_lr, 1e-3);
  EXPECT_EQ((*rows)[0].best_job_id, 7);
  EXPECT_TRUE((*rows)[0].complete);
  EXPECT_EQ((*rows)[0].diagnostics_json, R"({"deff":1})");
  EXPECT_FALSE((*rows)[1].best_lr.has_value());
}

// A result row's per-LR summary is parsed once, by the store: it writes the
// same JSON text as before, reads rows from before the run counts, and
// reports an unreadable column instead of an empty list.
TEST(ResultStoreTest, LrSummariesRoundTripThroughLrsJson) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  ResultStore results(db.get());
  ResultRecord row;
  row.sweep_id = 1;
  row.arch = "pre_ln";
  row.layers = 4;
  row.d_model = 96;
  row.lrs = {{1e-3, 2.5, 2, 0, 1}, {2e-3, std::nullopt, 0, 3, 0}};
  ASSERT_TRUE(results.Upsert(row).ok());
  auto q = db->Prepare("SELECT lrs_json FROM results");
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(*q->Step());
  EXPECT_EQ(q->ColumnText(0),
            R"([{"diverged":false,"diverged_runs":0,"failed_runs":1,"lr":0.001,"succeeded":2,)"
            R"("val_loss":2.5},{"diverged":true,"diverged_runs":3,"failed_runs":0,"lr":0.002,)"
            R"("succeeded":0,"val_loss":null}])");
  auto read = results.Get(1, "pre_ln", 4, 96);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->has_value());
  const std::vector<LrSummary>& lrs = (*read)->lrs;
  ASSERT_EQ(lrs.size(), 2u);
  EXPECT_DOUBLE_EQ(lrs[0].lr, 1e-3);
  EXPECT_DOUBLE_EQ(*lrs[0].mean_val_loss, 2.5);
  EXPECT_EQ(lrs[0].succeeded, 2);
  EXPECT_EQ(lrs[0].failed, 1);
  EXPECT_FALSE(lrs[1].mean_val_loss.has_value());
  EXPECT_EQ(lrs[1].diverged, 3);

  ASSERT_TRUE(db->Exec(
      R"(UPDATE results SET lrs_json = '[{"lr":0.004,"val_loss":null,"diverged":true}]')").ok());
  read = results.Get(1, "pre_ln", 4, 96);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ((*read)->lrs.size(), 1u);
  EXPECT_EQ((*read)->lrs[0].diverged, 1);

  ASSERT_TRUE(db->Exec("UPDATE results SET lrs_json = 'oops'").ok());
  auto broken = results.List(1);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("results.lrs_json"), std::string::npos)
      << broken.status();
}

// The one conversion between job enums and stored text: every enum value
// round-trips, the text is the lowercase name old databases hold, and an
// unknown stored value is an error naming the column and the value.
TEST(JobTextTest, StatesAndKindsRoundTripThroughTheStoredText) {
  const std::map<v1::JobState, std::string> states = {
      {v1::PENDING, "pending"},     {v1::LEASED, "leased"},   {v1::RUNNING, "running"},
      {v1::SUCCEEDED, "succeeded"}, {v1::DIVERGED, "diverged"}, {v1::FAILED, "failed"},
      {v1::CANCELLED, "cancelled"}, {v1::PRUNED, "pruned"},   {v1::HELD, "held"},
      {v1::SKIPPED, "skipped"},     {v1::PAUSED, "paused"}};
  for (int i = v1::JobState_MIN; i <= v1::JobState_MAX; ++i) {
    const auto state = static_cast<v1::JobState>(i);
    if (state == v1::JOB_STATE_UNSPECIFIED) continue;
    ASSERT_EQ(states.count(state), 1u) << "no expected text for enum value " << i;
    EXPECT_EQ(JobStateText(state), states.at(state));
    auto parsed = ParseJobState(states.at(state));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, state);
  }
  EXPECT_STREQ(JobStateText(v1::JOB_STATE_UNSPECIFIED), "");
  EXPECT_STREQ(JobKindText(v1::TRAIN), "train");
  EXPECT_STREQ(JobKindText(v1::DIAGNOSE), "diagnose");
  EXPECT_EQ(*ParseJobKind("diagnose"), v1::DIAGNOSE);
  EXPECT_EQ(SqlLiteral(v1::PENDING), "'pending'");
  EXPECT_EQ(SqlLiteral(v1::TRAIN), "'train'");
}

TEST(JobTextTest, UnknownStoredValuesAreNamedErrors) {
  auto bad = ParseJobState("Pending");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("jobs.state"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("\"Pending\""), std::string::npos) << bad.status();
  EXPECT_FALSE(ParseJobState("").ok());
  auto kind = ParseJobKind("eval");
  ASSERT_FALSE(kind.ok());
  EXPECT_NE(kind.status().message().find("jobs.kind"), std::string::npos) << kind.status();
}

// The stores write the same bytes as before the enums, and a row holding an
// unknown state is reported when read, not turned into a default.
TEST(JobTextTest, JobStoreWritesTheTextAndRejectsUnknownRows) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  const int64_t sweep_id = InsertSweep(db.get());
  ASSERT_GT(sweep_id, 0);
  JobStore jobs(db.get());
  JobRecord job;
  job.sweep_id = sweep_id;
  job.arch = "pre_ln";
  job.kind = v1::DIAGNOSE;
  job.state = v1::PAUSED;
  job.checkpoint_dir = "c";
  auto id = jobs.Insert(job);
  ASSERT_TRUE(id.ok()) << id.status();
  auto q = db->Prepare("SELECT kind, state FROM jobs WHERE id = ?");
  ASSERT_TRUE(q.ok());
  q->Bind(1, *id);
  ASSERT_TRUE(*q->Step());
  EXPECT_EQ(q->ColumnText(0), "diagnose");
  EXPECT_EQ(q->ColumnText(1), "paused");
  auto read = jobs.Get(*id);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->kind, v1::DIAGNOSE);
  EXPECT_EQ(read->state, v1::PAUSED);

  ASSERT_TRUE(db->Exec("UPDATE jobs SET state = 'zombie'").ok());
  auto broken = jobs.Get(*id);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("\"zombie\""), std::string::npos) << broken.status();
  EXPECT_FALSE(jobs.ListBySweep(sweep_id).ok());
  EXPECT_FALSE(jobs.CountByState(sweep_id).ok());
}

// Version 4 swaps the all-states index for a partial one over pending jobs.
TEST(MigrationTest, Version4IndexesPendingJobsOnly) {
  auto db = Database::Open(":memory:");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE(Migrate(db->get(), 3).ok());
  ASSERT_TRUE((*db)->Exec(
      "INSERT INTO sweeps(name, spec, created_ms) VALUES ('s', x'', 1);"
      "INSERT INTO jobs(sweep_id, kind, state, arch, layers, d_model, lr, seed, "
      "config_json, max_attempts, checkpoint_dir, created_ms, updated_ms) VALUES "
      "(1, 'train', 'succeeded', 'hc', 4, 96, 1e-3, 0, '{}', 3, 'c', 1, 1),"
      "(1, 'train', 'pending', 'hc', 4, 96, 2e-3, 0, '{}', 3, 'c', 1, 1);").ok());
  ASSERT_TRUE(Migrate(db->get(), 4).ok());
  auto index = [&](const std::string& name) {
    auto q = (*db)->Prepare("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?");
    EXPECT_TRUE(q.ok());
    q->Bind(1, name);
    auto row = q->Step();
    return row.ok() && *row ? q->ColumnText(0) : std::string();
  };
  EXPECT_EQ(index("jobs_by_state"), "");
  EXPECT_NE(index("jobs_pending").find("WHERE state = 'pending'"), std::string::npos);
  JobStore jobs(db->get());
  auto found = jobs.FindRunnable(0, 0, 0, [](const std::string&) { return true; }, 10);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, 2);
}

std::string PragmaText(Database* db, const std::string& pragma) {
  auto q = db->Prepare("PRAGMA " + pragma);
  if (!q.ok()) return q.status().ToString();
  auto row = q->Step();
  return row.ok() && *row ? q->ColumnText(0) : "";
}

int64_t CountRows(Database* db, const std::string& sql) {
  auto q = db->Prepare(sql);
  EXPECT_TRUE(q.ok()) << q.status();
  if (!q.ok()) return -1;
  auto row = q->Step();
  EXPECT_TRUE(row.ok() && *row);
  return row.ok() && *row ? q->ColumnInt(0) : -1;
}

// The file is shared (no exclusive lock); durability is chosen, read-only
// connections cannot write, and bad names are refused naming the field.
TEST(DatabaseTest, DurabilityAndSharedLockingAreChosen) {
  std::string path = TempDb("durability.db");
  {
    auto normal = Database::Open(path);
    ASSERT_TRUE(normal.ok()) << normal.status();
    EXPECT_EQ(PragmaText(normal->get(), "synchronous"), "1");  // NORMAL
    EXPECT_EQ(PragmaText(normal->get(), "locking_mode"), "normal");
  }
  DatabaseOptions full;
  full.durability = Durability::kFull;
  auto db = Database::Open(path, full);
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_EQ(PragmaText(db->get(), "synchronous"), "2");  // FULL
  EXPECT_EQ(PragmaText(db->get(), "journal_mode"), "wal");

  EXPECT_EQ(*ParseDurability("full"), Durability::kFull);
  EXPECT_EQ(*ParseDurability("normal"), Durability::kNormal);
  auto bad = ParseDurability("fast", "--durability");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--durability"), std::string::npos);
  EXPECT_NE(bad.status().message().find("\"fast\""), std::string::npos);

  DatabaseOptions read_only;
  read_only.read_only = true;
  EXPECT_EQ(Database::Open(":memory:", read_only).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Database::Open(TempDb("missing.db"), read_only).ok());
}

// Readers see the last commit made before their snapshot began, never a
// later one, never block the writer, and cannot change the file.
TEST(ReaderPoolTest, SnapshotsAreConsistentAndReadOnly) {
  std::string path = TempDb("readers.db");
  auto writer = Database::Open(path);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(Migrate(writer->get()).ok());
  SweepStore sweeps(writer->get());
  ASSERT_TRUE(sweeps.Insert({0, "a", "spec", 1, false}).ok());

  auto pool = ReaderPool::Open(path, 2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(ReaderPool::Open(path, 0).status().code(), absl::StatusCode::kInvalidArgument);
  {
    auto first = (*pool)->Begin();
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(CountRows(first->db(), "SELECT COUNT(*) FROM sweeps"), 1);
    // The writer commits while the snapshot is open: not blocked, not seen.
    {
      auto txn = Transaction::Begin(writer->get());
      ASSERT_TRUE(txn.ok()) << txn.status();
      ASSERT_TRUE(sweeps.Insert({0, "b", "spec", 2, false}).ok());
      ASSERT_TRUE(txn->Commit().ok());
    }
    EXPECT_EQ(CountRows(first->db(), "SELECT COUNT(*) FROM sweeps"), 1);
    auto second = (*pool)->Begin();
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(CountRows(second->db(), "SELECT COUNT(*) FROM sweeps"), 2);

    // No write gets through a reader, not even to a temp table.
    EXPECT_EQ(second->db()->Exec("INSERT INTO sweeps(name, spec, created_ms) VALUES ('c', x'', 3)").code(),
              absl::StatusCode::kPermissionDenied);
    EXPECT_FALSE(second->db()->Exec("CREATE TEMP TABLE t(x)").ok());
    EXPECT_FALSE(second->db()->Exec("PRAGMA query_only=OFF; DELETE FROM sweeps").ok());
  }
  // Both connections went back; a new snapshot sees everything.
  auto again = (*pool)->Begin();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(CountRows(again->db(), "SELECT COUNT(*) FROM sweeps"), 2);
  EXPECT_EQ(CountRows(writer->get(), "SELECT COUNT(*) FROM sweeps"), 2);
}

// One row in each table the views read: a succeeded train job, its
// diagnose job, a metric point, a results row, an LR tally, a diagnostic.
// Sets *train_id_out to the train job's id.
void FillOneOfEach(Database* db, int64_t* train_id_out) {
  const int64_t sweep_id = InsertSweep(db);
  ASSERT_GT(sweep_id, 0);
  JobStore jobs(db);
  JobRecord job;
  job.sweep_id = sweep_id;
  job.arch = "hc";
  job.layers = 4;
  job.d_model = 96;
  job.lr = 1e-3;
  job.state = v1::SUCCEEDED;
  job.val_loss = 2.5;
  job.checkpoint_dir = "s/1";
  auto train_id = jobs.Insert(job);
  ASSERT_TRUE(train_id.ok());
  job.kind = v1::DIAGNOSE;
  job.parent_job_id = *train_id;
  auto diag_id = jobs.Insert(job);
  ASSERT_TRUE(diag_id.ok());
  MetricStore metrics(db);
  ASSERT_TRUE(metrics.Insert({{0, *train_id, 1, 10, "loss", 2.75, 100}}).ok());
  ResultStore results(db);
  ResultRecord row;
  row.sweep_id = sweep_id;
  row.arch = "hc";
  row.layers = 4;
  row.d_model = 96;
  row.aspect_ratio = 24;
  row.params = 1000;
  row.best_lr = 1e-3;
  row.best_val_loss = 2.5;
  row.best_job_id = *train_id;
  row.complete = true;
  ASSERT_TRUE(results.Upsert(row).ok());
  LrTally tally;
  tally.sweep_id = sweep_id;
  tally.arch = "hc";
  tally.layers = 4;
  tally.d_model = 96;
  tally.lr = 1e-3;
  tally.jobs = 1;
  tally.ended = 1;
  tally.succeeded = 1;
  tally.loss_sum = 2.5;
  tally.best_job_id = *train_id;
  tally.best_val_loss = 2.5;
  ASSERT_TRUE(results.SetLrTally(tally).ok());
  ASSERT_TRUE(results.InsertDiagnostic({*diag_id, "deff", R"({"d_eff":1.5})", 5}).ok());

  *train_id_out = *train_id;
}

// Each public view answers a SELECT of every documented column (README.md
// "The database"); a renamed or missing column fails to prepare.
TEST(ViewsTest, ContractViewsExposeTheDocumentedColumns) {
  auto db = Database::Open(":memory:");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE(Migrate(db->get(), 4).ok());
  EXPECT_EQ(CountRows(db->get(), "SELECT COUNT(*) FROM sqlite_master WHERE type = 'view'"), 0);
  ASSERT_TRUE(Migrate(db->get()).ok());
  // The contract views, plus canonical_metric_points: a schema view of
  // migration 6 (the history without abandoned points) that metrics_v1
  // reads from.
  EXPECT_EQ(CountRows(db->get(), "SELECT COUNT(*) FROM sqlite_master WHERE type = 'view' "
                                 "AND name != 'canonical_metric_points'"),
            static_cast<int64_t>(ViewNames().size()));
  EXPECT_EQ(CountRows(db->get(), "SELECT COUNT(*) FROM sqlite_master WHERE type = 'view' "
                                 "AND name = 'canonical_metric_points'"),
            1);

  int64_t train_id = 0;
  ASSERT_NO_FATAL_FAILURE(FillOneOfEach(db->get(), &train_id));

  struct Case {
    const char* sql;
    int64_t rows;
  };
  for (const Case& c : std::vector<Case>{
           {"SELECT sweep, arch, layers, d_model, aspect_ratio, params, complete, best_lr, "
            "best_val_loss, best_job_id, diagnostics_json FROM results_v1", 1},
           {"SELECT sweep, arch, layers, d_model, lr, runs, ended, succeeded, diverged, "
            "failed, mean_val_loss, best_job_id, best_val_loss FROM lrs_v1", 1},
           {"SELECT sweep, job_id, arch, layers, d_model, lr, seed, state, val_loss, "
            "final_step, is_best, attempts, reason, worker_id, checkpoint_dir, created_ms, "
            "updated_ms FROM runs_v1", 1},
           {"SELECT sweep, job_id, kind, attempt_id, step, name, value, wall_ms FROM metrics_v1", 1},
           {"SELECT sweep, job_id, arch, layers, d_model, lr, kind, data_json, "
            "diagnose_job_id, created_ms FROM diagnostics_v1", 1},
           {"SELECT views_version, schema_version FROM contract", 1},
       }) {
    auto q = (*db)->Prepare(c.sql);
    ASSERT_TRUE(q.ok()) << c.sql << ": " << q.status();
    int64_t n = 0;
    while (*q->Step()) ++n;
    EXPECT_EQ(n, c.rows) << c.sql;
  }
  auto q = (*db)->Prepare(
      "SELECT r.best_job_id, l.mean_val_loss, d.job_id, c.views_version, c.schema_version "
      "FROM results_v1 r JOIN lrs_v1 l USING (sweep, arch, layers, d_model) "
      "JOIN diagnostics_v1 d ON d.job_id = r.best_job_id, contract c");
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_TRUE(*q->Step());
  EXPECT_EQ(q->ColumnInt(0), train_id);
  EXPECT_DOUBLE_EQ(q->ColumnDouble(1), 2.5);
  EXPECT_EQ(q->ColumnInt(2), train_id);
  EXPECT_EQ(q->ColumnInt(3), kViewsVersion);
  EXPECT_EQ(q->ColumnInt(4), LatestSchemaVersion());
  // runs_v1 lists train jobs only.
  EXPECT_EQ(CountRows(db->get(), "SELECT COUNT(*) FROM runs_v1"), 1);
}

// Version 5 tallies the jobs of sweeps submitted before it.
TEST(MigrationTest, Version5TalliesExistingJobs) {
  auto db = Database::Open(":memory:");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE(Migrate(db->get(), 4).ok());
  ASSERT_TRUE((*db)->Exec(
      "INSERT INTO sweeps(name, spec, created_ms) VALUES ('s', x'', 1);"
      "INSERT INTO jobs(id, sweep_id, kind, state, arch, layers, d_model, lr, seed, "
      "config_json, max_attempts, checkpoint_dir, created_ms, updated_ms, val_loss) VALUES "
      "(1, 1, 'train', 'succeeded', 'hc', 4, 96, 1e-3, 0, '{}', 3, 'c', 1, 1, 3.0),"
      "(2, 1, 'train', 'succeeded', 'hc', 4, 96, 1e-3, 1, '{}', 3, 'c', 1, 1, 2.0),"
      "(3, 1, 'train', 'succeeded', 'hc', 4, 96, 1e-3, 2, '{}', 3, 'c', 1, 1, 2.0),"
      "(4, 1, 'train', 'failed', 'hc', 4, 96, 1e-3, 3, '{}', 3, 'c', 1, 1, NULL),"
      "(5, 1, 'train', 'diverged', 'hc', 4, 96, 2e-3, 0, '{}', 3, 'c', 1, 1, NULL),"
      "(6, 1, 'train', 'pending', 'hc', 4, 96, 2e-3, 1, '{}', 3, 'c', 1, 1, NULL),"
      "(7, 1, 'diagnose', 'succeeded', 'hc', 4, 96, 1e-3, 0, '{}', 3, 'c', 1, 1, NULL);")
                  .ok());
  ASSERT_TRUE(Migrate(db->get()).ok());
  ResultStore results(db->get());
  auto lrs = results.ListLrs(1, "hc", 4, 96);
  ASSERT_TRUE(lrs.ok()) << lrs.status();
  ASSERT_EQ(lrs->size(), 2u);
  const LrTally& a = (*lrs)[0];
  EXPECT_DOUBLE_EQ(a.lr, 1e-3);
  EXPECT_EQ(a.jobs, 4);
  EXPECT_EQ(a.ended, 4);
  EXPECT_EQ(a.succeeded, 3);
  EXPECT_EQ(a.failed, 1);
  EXPECT_DOUBLE_EQ(a.loss_sum, 7.0);
  EXPECT_EQ(a.best_job_id, 2);  // 2.0 twice: the lower id
  EXPECT_DOUBLE_EQ(*a.best_val_loss, 2.0);
  const LrTally& b = (*lrs)[1];
  EXPECT_EQ(b.jobs, 2);
  EXPECT_EQ(b.ended, 1);
  EXPECT_EQ(b.diverged, 1);
  EXPECT_EQ(b.best_job_id, 0);
  EXPECT_FALSE(b.best_val_loss.has_value());
}

TEST(ResultStoreTest, LrDeltasAccumulateAndKeepTheBestRun) {
  auto db = MigratedMemoryDb();
  ASSERT_NE(db, nullptr);
  ResultStore results(db.get());
  LrTally key;
  key.sweep_id = 1;
  key.arch = "hc";
  key.layers = 4;
  key.d_model = 96;
  key.lr = 1e-3;
  ASSERT_TRUE(results.AddLrJobs(key, 3).ok());
  ASSERT_TRUE(results.AddLrJobs(key, 1).ok());
  LrTally d = key;
  d.ended = 1;
  d.succeeded = 1;
  d.loss_sum = 2.5;
  d.best_job_id = 9;
  d.best_val_loss = 2.5;
  ASSERT_TRUE(results.ApplyLrDelta(d).ok());
  d.best_job_id = 7;  // same loss, lower id: takes over
  ASSERT_TRUE(results.ApplyLrDelta(d).ok());
  d.best_job_id = 5;
  d.best_val_loss = 2.75;  // higher loss: counted, not best
  d.loss_sum = 2.75;
  ASSERT_TRUE(results.ApplyLrDelta(d).ok());
  LrTally failed = key;
  failed.ended = 1;
  failed.failed = 1;
  ASSERT_TRUE(results.ApplyLrDelta(failed).ok());
  failed.ended = -1;  // retried
  failed.failed = -1;
  ASSERT_TRUE(results.ApplyLrDelta(failed).ok());
  auto lrs = results.ListLrs(1, "hc", 4, 96);
  ASSERT_TRUE(lrs.ok());
  ASSERT_EQ(lrs->size(), 1u);
  EXPECT_EQ((*lrs)[0].jobs, 4);
  EXPECT_EQ((*lrs)[0].ended, 3);
  EXPECT_EQ((*lrs)[0].succeeded, 3);
  EXPECT_EQ((*lrs)[0].failed, 0);
  EXPECT_DOUBLE_EQ((*lrs)[0].loss_sum, 7.75);
  EXPECT_EQ((*lrs)[0].best_job_id, 7);
  EXPECT_DOUBLE_EQ(*(*lrs)[0].best_val_loss, 2.5);
  LrTally missing = key;
  missing.lr = 5e-3;
  EXPECT_EQ(results.ApplyLrDelta(missing).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace depthbench::storage
