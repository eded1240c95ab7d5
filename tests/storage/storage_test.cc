#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "storage/migrations.h"
#include "storage/sqlite.h"
#include "storage/stores.h"

namespace depthbench::storage {
namespace {

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

TEST(DatabaseTest, OpensInWalModeAndMapsErrors) {
  auto db = Database::Open(TempDb("wal.db"));
  ASSERT_TRUE(db.ok()) << db.status();
  auto q = (*db)->Prepare("PRAGMA journal_mode");
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(*q->Step());
  EXPECT_EQ(q->ColumnText(0), "wal");

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
  auto db = Database::Open(":memory:");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE(Migrate(db->get()).ok());
  EXPECT_EQ(*SchemaVersion(db->get()), LatestSchemaVersion());
  // Idempotent.
  ASSERT_TRUE(Migrate(db->get()).ok());
  EXPECT_EQ(*SchemaVersion(db->get()), LatestSchemaVersion());
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
  auto db = Database::Open(":memory:");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE(Migrate(db->get()).ok());
  ASSERT_TRUE((*db)->Exec("UPDATE schema_version SET version = 999").ok());
  EXPECT_EQ(Migrate(db->get()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MetricStoreTest, InsertIsIdempotentPerJobAttemptStepName) {
  auto db = Database::Open(":memory:");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE(Migrate(db->get()).ok());
  MetricStore metrics(db->get());
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

TEST(JobStoreTest, RoundTripsAndFilters) {
  auto db = Database::Open(":memory:");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE(Migrate(db->get()).ok());
  SweepStore sweeps(db->get());
  auto sweep_id = sweeps.Insert({0, "s", "spec", 1, false});
  ASSERT_TRUE(sweep_id.ok());
  EXPECT_EQ(sweeps.Insert({0, "s", "spec", 1, false}).status().code(),
            absl::StatusCode::kAlreadyExists);
  JobStore jobs(db->get());
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

}  // namespace
}  // namespace depthbench::storage
