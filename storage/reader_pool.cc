#include "storage/reader_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace depthbench::storage {

absl::StatusOr<std::unique_ptr<ReaderPool>> ReaderPool::Open(const std::string& path,
                                                             int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("size: must be >= 1, got ", size));
  }
  std::unique_ptr<ReaderPool> pool(new ReaderPool());
  DatabaseOptions options;
  options.read_only = true;
  for (int i = 0; i < size; ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<Database> db, Database::Open(path, options));
    pool->connections_.push_back(std::move(db));
  }
  absl::MutexLock lock(&pool->mu_);
  for (auto& db : pool->connections_) pool->idle_.push_back(db.get());
  return pool;
}

absl::StatusOr<ReaderPool::Snapshot> ReaderPool::Begin() {
  Database* db = nullptr;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::vector<Database*>* idle) { return !idle->empty(); }, &idle_));
    db = idle_.back();
    idle_.pop_back();
  }
  Snapshot snapshot(this, db);
  // Deferred: the snapshot is taken by the first read.
  ASSIGN_OR_RETURN(Query begin, db->Prepare("BEGIN"));
  RETURN_IF_ERROR(begin.Run());
  return snapshot;
}

void ReaderPool::Return(Database* db) {
  if (db->InTransaction()) {
    absl::StatusOr<Query> end = db->Prepare("ROLLBACK");
    if (end.ok()) end->Run().IgnoreError();
  }
  absl::MutexLock lock(&mu_);
  idle_.push_back(db);
}

ReaderPool::Snapshot::Snapshot(Snapshot&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), db_(other.db_) {}

ReaderPool::Snapshot::~Snapshot() {
  if (pool_ != nullptr) pool_->Return(db_);
}

}  // namespace depthbench::storage
