// Bounds on what a trainer child can make the worker hold, log or send.
//
// A child's output is untrusted bytes: it may be invalid UTF-8 (a protobuf
// `string` must be UTF-8, or the scheduler refuses the whole FinishJob), it
// may never end a line (the worker must not buffer 50 MB waiting for '\n'),
// and it may be garbage at disk speed (the worker's own log and the
// per-attempt files must not grow with it).
//
//   LineSplitter lines(kMaxLine);
//   lines.Feed(data, n, [&](std::string_view line, bool cut) { ... });
//   lines.Finish(same callback);  // at EOF: the unterminated last line
//
//   RateLimiter warn(/*burst=*/5, /*per_s=*/0.2);
//   if (warn.Allow(now_ms)) LOG << "..." << warn.TakeSuppressed() << " more";
//
// Thread safety: none; each object belongs to one thread. Pure functions
// are thread-safe.
#ifndef DEPTHBENCH_WORKER_OUTPUT_LIMITS_H_
#define DEPTHBENCH_WORKER_OUTPUT_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace depthbench::worker {

// `text` as valid UTF-8 of at most `max_bytes` bytes: every byte that does
// not start a well-formed sequence (RFC 3629: no overlongs, surrogates or
// code points above U+10FFFF) becomes U+FFFD, and a cut never splits a
// character. When the input is cut, the result ends with "..." (counted in
// `max_bytes`).
std::string SanitizeUtf8(std::string_view text, size_t max_bytes);

// As SanitizeUtf8 but keeps the END of `text` (the interesting part of a
// stderr tail), starting with "..." when cut.
std::string SanitizeUtf8Tail(std::string_view text, size_t max_bytes);

// Splits a byte stream into lines without ever holding more than
// `max_line` bytes: a longer line is delivered once, cut to its first
// `max_line` bytes with cut = true, and the rest of it (up to its '\n') is
// discarded.
class LineSplitter {
 public:
  using Callback = std::function<void(std::string_view line, bool cut)>;
  explicit LineSplitter(size_t max_line) : max_line_(max_line) {}

  void Feed(const char* data, size_t n, const Callback& on_line);
  // Delivers a pending unterminated line (EOF).
  void Finish(const Callback& on_line);

  size_t buffered() const { return partial_.size(); }
  int64_t cut_lines() const { return cut_lines_; }

 private:
  const size_t max_line_;
  std::string partial_;
  bool discarding_ = false;  // inside the tail of a cut line
  int64_t cut_lines_ = 0;
};

// Token bucket: `burst` events at once, then `per_s` per second.
class RateLimiter {
 public:
  RateLimiter(double burst, double per_s) : burst_(burst), per_s_(per_s), tokens_(burst) {}
  // True if an event at `now_ms` (monotonic) may go through; false counts
  // it as suppressed.
  bool Allow(int64_t now_ms);
  // Suppressed events since the last call (and resets the count).
  int64_t TakeSuppressed();

 private:
  const double burst_, per_s_;
  double tokens_;
  int64_t last_ms_ = -1;
  int64_t suppressed_ = 0;
};

// An append-only file that stops growing at `max_bytes`: the write that
// would cross the limit is replaced by one line saying the rest was
// dropped. Owns the fd.
class CappedFile {
 public:
  CappedFile() = default;
  ~CappedFile();
  CappedFile(const CappedFile&) = delete;
  CappedFile& operator=(const CappedFile&) = delete;

  // Opens (truncating) `path`; false if it cannot be opened.
  bool Open(const std::string& path, int64_t max_bytes);
  // Writes unless the cap is reached; returns false once it is.
  bool Write(std::string_view data);
  void Close();
  bool is_open() const { return fd_ >= 0; }
  int64_t written() const { return written_; }
  int64_t dropped() const { return dropped_; }

 private:
  int fd_ = -1;
  int64_t max_bytes_ = 0;
  int64_t written_ = 0;
  int64_t dropped_ = 0;
  bool capped_ = false;
};

}  // namespace depthbench::worker

#endif  // DEPTHBENCH_WORKER_OUTPUT_LIMITS_H_
