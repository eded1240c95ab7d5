#include "storage/sqlite.h"

#include <sqlite3.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace depthbench::storage {

absl::Status SqliteStatus(int code, sqlite3* db, const std::string& context) {
  if (code == SQLITE_OK || code == SQLITE_DONE || code == SQLITE_ROW) {
    return absl::OkStatus();
  }
  std::string message = absl::StrCat(
      context, ": sqlite error ", code, " (",
      db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(code), ")");
  switch (code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(message);
    case SQLITE_CONSTRAINT:
      return absl::AlreadyExistsError(message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(message);
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return absl::ResourceExhaustedError(message);
    case SQLITE_PERM:
    case SQLITE_READONLY:
    case SQLITE_AUTH:
      return absl::PermissionDeniedError(message);
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

Query::Query(sqlite3* db, sqlite3_stmt* stmt, Database* owner)
    : db_(db), stmt_(stmt), owner_(owner) {}

Query::Query(Query&& other) noexcept
    : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)),
      owner_(other.owner_), bind_status_(std::move(other.bind_status_)) {}

Query::~Query() {
  if (stmt_ != nullptr) {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
}

namespace {
void Remember(absl::Status* status, int rc, sqlite3* db, int index) {
  if (rc != SQLITE_OK && status->ok()) {
    *status = SqliteStatus(rc, db, absl::StrCat("bind parameter ", index));
  }
}
}  // namespace

Query& Query::Bind(int index, int64_t value) {
  Remember(&bind_status_, sqlite3_bind_int64(stmt_, index, value), db_, index);
  return *this;
}
Query& Query::Bind(int index, double value) {
  Remember(&bind_status_, sqlite3_bind_double(stmt_, index, value), db_, index);
  return *this;
}
Query& Query::Bind(int index, const std::string& value) {
  Remember(&bind_status_,
           sqlite3_bind_text(stmt_, index, value.data(),
                             static_cast<int>(value.size()), SQLITE_TRANSIENT),
           db_, index);
  return *this;
}
Query& Query::BindBlob(int index, const std::string& bytes) {
  Remember(&bind_status_,
           sqlite3_bind_blob(stmt_, index, bytes.data(),
                             static_cast<int>(bytes.size()), SQLITE_TRANSIENT),
           db_, index);
  return *this;
}
Query& Query::BindNull(int index) {
  Remember(&bind_status_, sqlite3_bind_null(stmt_, index), db_, index);
  return *this;
}

absl::StatusOr<bool> Query::Step() {
  RETURN_IF_ERROR(bind_status_);
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  absl::Status status = SqliteStatus(rc, db_, sqlite3_sql(stmt_));
  if (owner_ != nullptr) owner_->NoteFailure(rc, status);
  return status;
}

absl::Status Query::Run() {
  while (true) {
    ASSIGN_OR_RETURN(bool row, Step());
    if (!row) return absl::OkStatus();
  }
}

void Query::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  bind_status_ = absl::OkStatus();
}

int64_t Query::ColumnInt(int col) const { return sqlite3_column_int64(stmt_, col); }
double Query::ColumnDouble(int col) const { return sqlite3_column_double(stmt_, col); }
std::string Query::ColumnText(int col) const {
  const unsigned char* text = sqlite3_column_text(stmt_, col);
  if (text == nullptr) return "";
  return std::string(reinterpret_cast<const char*>(text),
                     sqlite3_column_bytes(stmt_, col));
}
std::string Query::ColumnBlob(int col) const {
  const void* blob = sqlite3_column_blob(stmt_, col);
  if (blob == nullptr) return "";
  return std::string(static_cast<const char*>(blob),
                     sqlite3_column_bytes(stmt_, col));
}
bool Query::ColumnIsNull(int col) const {
  return sqlite3_column_type(stmt_, col) == SQLITE_NULL;
}

absl::StatusOr<Durability> ParseDurability(const std::string& name,
                                           const std::string& field) {
  if (name == "normal") return Durability::kNormal;
  if (name == "full") return Durability::kFull;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": must be \"normal\" or \"full\", got \"", name, "\""));
}

std::string DurabilityName(Durability durability) {
  return durability == Durability::kFull ? "full" : "normal";
}

bool Database::IsInMemory(const std::string& path) {
  return path.empty() || path == ":memory:" ||
         path.find(":memory:") != std::string::npos ||
         path.find("mode=memory") != std::string::npos;
}

absl::StatusOr<std::unique_ptr<Database>> Database::Open(const std::string& path,
                                                         const DatabaseOptions& options) {
  if (options.read_only && IsInMemory(path)) {
    return absl::InvalidArgumentError(
        "read_only: an in-memory database cannot be opened a second time");
  }
  int flags = options.read_only ? SQLITE_OPEN_READONLY
                                : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status status = SqliteStatus(rc, raw, absl::StrCat("open ", path));
    sqlite3_close(raw);
    return status;
  }
  std::unique_ptr<Database> db(
      new Database(raw, path, options.read_only, options.exclusive_lock && !options.read_only));
  sqlite3_busy_timeout(raw, 5000);
  if (options.read_only) {
    // query_only on top of SQLITE_OPEN_READONLY: even a statement that
    // would only touch a temp table is refused.
    RETURN_IF_ERROR(db->Exec("PRAGMA query_only=ON; PRAGMA temp_store=MEMORY;"));
    return db;
  }
  // wal_autocheckpoint: a checkpoint (two fsyncs, ~5 ms here, inside
  // whichever commit crosses the threshold, so under the scheduler's mutex)
  // every 4,000 WAL pages rather than SQLite's 1,000: a quarter of the
  // stalls for a WAL of up to 16 MB. 4,000 frames still fit the WAL index's
  // first hash table (4,062), so page lookups cost the same.
  //
  // No locking_mode=EXCLUSIVE unless asked for (DatabaseOptions): it keeps
  // every other process (the sqlite3 CLI included) out of the file;
  // bench/RESULTS.md ("Result tables at scale") has what it saves.
  RETURN_IF_ERROR(db->Exec(absl::StrCat(
      "PRAGMA journal_mode=WAL; PRAGMA synchronous=",
      options.durability == Durability::kFull ? "FULL" : "NORMAL",
      "; PRAGMA foreign_keys=ON; PRAGMA temp_store=MEMORY; "
      "PRAGMA wal_autocheckpoint=4000;",
      options.exclusive_lock ? " PRAGMA locking_mode=EXCLUSIVE;" : "")));
  return db;
}

Database::~Database() {
  for (auto& [sql, stmt] : cache_) sqlite3_finalize(stmt);
  sqlite3_close(db_);
}

absl::StatusOr<Query> Database::Prepare(const std::string& sql) {
  auto it = cache_.find(sql);
  if (it == cache_.end()) {
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v3(db_, sql.c_str(), static_cast<int>(sql.size()),
                                SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) {
      sqlite3_finalize(stmt);
      return SqliteStatus(rc, db_, absl::StrCat("prepare ", sql));
    }
    it = cache_.emplace(sql, stmt).first;
  }
  return Query(db_, it->second, this);
}

void Database::NoteFailure(int code, const absl::Status& status) {
  switch (code & 0xff) {
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_NOMEM:
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
      write_error_ = status;
      break;
    default:  // BUSY, CONSTRAINT, ...: not a storage failure
      break;
  }
}

absl::Status Database::Exec(const std::string& sql) {
  char* error = nullptr;
  int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error);
  if (rc != SQLITE_OK) {
    std::string message = error != nullptr ? error : "";
    sqlite3_free(error);
    absl::Status status = SqliteStatus(rc, db_, absl::StrCat("exec: ", message));
    NoteFailure(rc, status);
    return status;
  }
  return absl::OkStatus();
}

int64_t Database::LastInsertRowId() const { return sqlite3_last_insert_rowid(db_); }
int64_t Database::Changes() const { return sqlite3_changes(db_); }
bool Database::InTransaction() const { return sqlite3_get_autocommit(db_) == 0; }

absl::StatusOr<Transaction> Transaction::Begin(Database* db) {
  ASSIGN_OR_RETURN(Query begin, db->Prepare("BEGIN IMMEDIATE"));
  RETURN_IF_ERROR(begin.Run());
  return Transaction(db);
}

Transaction::Transaction(Transaction&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)) {}

Transaction::~Transaction() {
  if (db_ == nullptr) return;
  absl::StatusOr<Query> rollback = db_->Prepare("ROLLBACK");
  if (rollback.ok()) rollback->Run().IgnoreError();
}

absl::Status Transaction::Commit() {
  if (db_ == nullptr) return absl::FailedPreconditionError("transaction already ended");
  if (!db_->commit_fault().ok()) {
    absl::Status fault = db_->commit_fault();
    db_->NoteFailure(SQLITE_FULL, fault);
    return fault;  // the destructor rolls back
  }
  ASSIGN_OR_RETURN(Query commit, db_->Prepare("COMMIT"));
  absl::Status status = commit.Run();
  if (status.ok()) {
    db_->NoteCommitted();
    db_ = nullptr;
  }
  return status;
}

}  // namespace depthbench::storage
