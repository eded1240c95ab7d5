// RAII over the sqlite3 C API: a Database connection (WAL, busy timeout,
// synchronous=NORMAL or FULL, foreign keys, a checkpoint every 4,000 WAL
// pages; or a read-only connection), cached prepared statements borrowed as
// Query objects, and Transaction (BEGIN IMMEDIATE, rollback unless
// committed). SQLite result codes become absl::Status here and nowhere else.
//
// The file is opened in SQLite's normal (shared) locking mode, so other
// processes (the sqlite3 CLI, pandas) can read it while the scheduler
// writes; see README.md "The database".
//
// Durability (WAL mode): with Durability::kNormal (synchronous=NORMAL) a
// commit is in the WAL in the OS page cache when Commit() returns: it
// survives the process being killed, but the last commits before a power
// loss or kernel crash can be lost (the file stays consistent). With
// Durability::kFull (synchronous=FULL) the WAL is fsynced on every commit, so
// a returned commit survives power loss too, at one fsync per commit.
//
// Thread safety: none. A Database and everything borrowed from it must be
// used by one thread at a time; the scheduler serialises access with its own
// mutex. Ownership: Database owns the connection and every cached statement;
// a Query borrows one statement and resets it when destroyed, so it must not
// outlive its Database.
#ifndef DEPTHBENCH_STORAGE_SQLITE_H_
#define DEPTHBENCH_STORAGE_SQLITE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct sqlite3;
struct sqlite3_stmt;

namespace depthbench::storage {

// Maps an SQLite result code (plus the connection's message) to a Status:
// BUSY/LOCKED -> Unavailable, CONSTRAINT -> AlreadyExists, CORRUPT/NOTADB ->
// DataLoss, FULL -> ResourceExhausted, CANTOPEN/PERM/READONLY ->
// PermissionDenied-or-Unavailable, others -> Internal.
absl::Status SqliteStatus(int code, sqlite3* db, const std::string& context);

class Database;

// A borrowed prepared statement. Bind* indexes are 1-based (SQLite's);
// Column* indexes are 0-based. A failed bind is remembered and returned by
// the next Step/Run.
class Query {
 public:
  // `owner` (may be null) is told about failed steps (Database::WriteHealth).
  Query(sqlite3* db, sqlite3_stmt* stmt, Database* owner = nullptr);
  Query(Query&& other) noexcept;
  Query& operator=(Query&&) = delete;
  Query(const Query&) = delete;
  ~Query();  // resets the statement and clears its bindings

  Query& Bind(int index, int64_t value);
  Query& Bind(int index, int value) { return Bind(index, static_cast<int64_t>(value)); }
  Query& Bind(int index, double value);
  Query& Bind(int index, const std::string& value);
  Query& Bind(int index, const char* value) { return Bind(index, std::string(value)); }
  Query& BindBlob(int index, const std::string& bytes);
  Query& BindNull(int index);
  Query& Bind(int index, std::optional<double> value) {
    return value ? Bind(index, *value) : BindNull(index);
  }

  // Advances: true when a row is available, false when done.
  absl::StatusOr<bool> Step();
  // Steps to completion (for statements that return no rows).
  absl::Status Run();
  // Rewinds to run again with new bindings.
  void Reset();

  int64_t ColumnInt(int col) const;
  double ColumnDouble(int col) const;
  std::string ColumnText(int col) const;
  std::string ColumnBlob(int col) const;
  bool ColumnIsNull(int col) const;

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_;
  Database* owner_;
  absl::Status bind_status_;
};

enum class Durability { kNormal, kFull };

// "normal" or "full"; InvalidArgument naming `field` otherwise.
absl::StatusOr<Durability> ParseDurability(const std::string& name,
                                           const std::string& field = "durability");
std::string DurabilityName(Durability durability);

struct DatabaseOptions {
  // Opens with SQLITE_OPEN_READONLY and PRAGMA query_only=ON: every write
  // fails with PermissionDenied (SQLITE_READONLY). The file must exist.
  bool read_only = false;
  // For read-write connections: synchronous=NORMAL or FULL (see above).
  Durability durability = Durability::kNormal;
  // locking_mode=EXCLUSIVE: no other connection or process can open the
  // file (the sqlite3 CLI gets "database is locked"), in exchange for no
  // shared-memory WAL index locking per transaction. Off in the scheduler;
  // scheduler_bench --exclusive-lock measures what it saves.
  bool exclusive_lock = false;
};

class Database {
 public:
  // Opens (creating if needed, unless read-only) the file at `path`
  // (":memory:" works for read-write) and applies the settings above.
  static absl::StatusOr<std::unique_ptr<Database>> Open(
      const std::string& path, const DatabaseOptions& options = {});

  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;
  ~Database();

  // Borrows the cached prepared statement for `sql`, compiling it once.
  absl::StatusOr<Query> Prepare(const std::string& sql);
  // Runs one or more statements without results (schema scripts, pragmas).
  absl::Status Exec(const std::string& sql);
  int64_t LastInsertRowId() const;
  int64_t Changes() const;  // rows changed by the last statement
  bool InTransaction() const;  // inside BEGIN .. COMMIT/ROLLBACK
  sqlite3* raw() const { return db_; }
  const std::string& path() const { return path_; }
  bool read_only() const { return read_only_; }
  bool exclusive_lock() const { return exclusive_lock_; }
  // Whether `path` names an in-memory database (":memory:", "" or a
  // "file::memory:" URI), which no second connection can open.
  static bool IsInMemory(const std::string& path);

  // OK, or the error of the last statement or commit that failed because
  // the file could not be written (disk or max_page_count full, I/O error,
  // read-only file): ResourceExhausted / Unavailable / PermissionDenied. It
  // stays until a later commit succeeds (space came back).
  const absl::Status& WriteHealth() const { return write_error_; }
  // Records `status` (of SQLite result `code`) for WriteHealth() when the
  // code is a storage failure (above); called by Query and Transaction.
  void NoteFailure(int code, const absl::Status& status);
  void NoteCommitted() { write_error_ = absl::OkStatus(); }

  // Fault injection for tests: while `status` is not OK, every
  // Transaction::Commit rolls the transaction back and returns `status`
  // (recorded for WriteHealth() as a full disk), as a commit on a full disk
  // does. OK turns it off.
  void InjectCommitFaultForTesting(absl::Status status) {
    commit_fault_ = std::move(status);
  }
  const absl::Status& commit_fault() const { return commit_fault_; }

 private:
  Database(sqlite3* db, std::string path, bool read_only, bool exclusive_lock)
      : db_(db), path_(std::move(path)), read_only_(read_only),
        exclusive_lock_(exclusive_lock) {}
  sqlite3* db_;
  std::string path_;
  bool read_only_;
  bool exclusive_lock_;
  std::unordered_map<std::string, sqlite3_stmt*> cache_;
  absl::Status write_error_;
  absl::Status commit_fault_;
};

// BEGIN IMMEDIATE on construction (via Begin); ROLLBACK on destruction unless
// Commit() succeeded.
class Transaction {
 public:
  static absl::StatusOr<Transaction> Begin(Database* db);
  Transaction(Transaction&& other) noexcept;
  Transaction& operator=(Transaction&&) = delete;
  Transaction(const Transaction&) = delete;
  ~Transaction();
  absl::Status Commit();

 private:
  explicit Transaction(Database* db) : db_(db) {}
  Database* db_;  // null once committed, rolled back or moved from
};

}  // namespace depthbench::storage

#endif  // DEPTHBENCH_STORAGE_SQLITE_H_
