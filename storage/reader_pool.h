// A fixed set of read-only connections to one SQLite file in WAL mode, so
// that readers (result queries, job listings, metric replays) run on their
// own connections and threads while one read-write connection commits.
// In WAL mode a reader never blocks the writer and the writer never blocks
// a reader: each read transaction sees the last commit made before it
// started (a snapshot), whatever commits follow.
//
// Thread safety: Begin() may be called from any thread; a Snapshot (and the
// Database it lends) is used by one thread at a time. Ownership: the pool
// owns its connections; a Snapshot borrows one and must not outlive the pool.
#ifndef DEPTHBENCH_STORAGE_READER_POOL_H_
#define DEPTHBENCH_STORAGE_READER_POOL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/sqlite.h"

namespace depthbench::storage {

class ReaderPool {
 public:
  // Opens `size` (>= 1) read-only connections (DatabaseOptions::read_only)
  // to the existing file at `path`.
  static absl::StatusOr<std::unique_ptr<ReaderPool>> Open(const std::string& path, int size);

  ReaderPool(const ReaderPool&) = delete;
  ReaderPool& operator=(const ReaderPool&) = delete;

  // A borrowed connection inside one read transaction: every read through
  // db() sees the same committed state (from the first read on). Ends the
  // transaction and returns the connection when destroyed; statements
  // borrowed from db() must be gone by then.
  class Snapshot {
   public:
    Snapshot(Snapshot&& other) noexcept;
    Snapshot& operator=(Snapshot&&) = delete;
    Snapshot(const Snapshot&) = delete;
    ~Snapshot();
    Database* db() const { return db_; }

   private:
    friend class ReaderPool;
    Snapshot(ReaderPool* pool, Database* db) : pool_(pool), db_(db) {}
    ReaderPool* pool_;  // null once moved from
    Database* db_;
  };

  // Borrows an idle connection (waiting while all are lent) and begins a
  // read transaction on it.
  absl::StatusOr<Snapshot> Begin();

  int size() const { return static_cast<int>(connections_.size()); }

 private:
  ReaderPool() = default;
  void Return(Database* db);

  std::vector<std::unique_ptr<Database>> connections_;  // fixed after Open
  absl::Mutex mu_;
  std::vector<Database*> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace depthbench::storage

#endif  // DEPTHBENCH_STORAGE_READER_POOL_H_
