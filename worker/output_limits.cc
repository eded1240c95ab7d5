#include "worker/output_limits.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace depthbench::worker {

namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
constexpr char kEllipsis[] = "...";

bool Cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the well-formed UTF-8 sequence at text[i], 0 if there is none.
size_t SequenceLength(std::string_view text, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const size_t left = text.size() - i;
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return left >= 2 && Cont(b(1)) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (left < 3 || !Cont(b(1)) || !Cont(b(2))) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(1) > 0x9F) return 0;  // surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (left < 4 || !Cont(b(1)) || !Cont(b(2)) || !Cont(b(3))) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(1) > 0x8F) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

// Appends the sanitized form of text[begin, end) to *out while it fits in
// `limit` bytes; returns false if something did not fit.
bool AppendSanitized(std::string_view text, size_t limit, std::string* out) {
  size_t i = 0;
  while (i < text.size()) {
    size_t n = SequenceLength(text, i);
    std::string_view piece = n > 0 ? text.substr(i, n) : std::string_view(kReplacement, 3);
    if (out->size() + piece.size() > limit) return false;
    out->append(piece.data(), piece.size());
    i += n > 0 ? n : 1;
  }
  return true;
}

// Removes whole characters from the end of valid UTF-8 `s` until it is at
// most `size` bytes.
void ShrinkBack(std::string* s, size_t size) {
  while (s->size() > size) {
    size_t last = s->size() - 1;  // the start of the last character
    while (last > 0 && Cont(static_cast<unsigned char>((*s)[last]))) --last;
    s->resize(last);
  }
}

}  // namespace

std::string SanitizeUtf8(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  if (AppendSanitized(text, max_bytes, &out)) return out;
  if (max_bytes < sizeof(kEllipsis) - 1) {
    ShrinkBack(&out, max_bytes);
    return out;
  }
  ShrinkBack(&out, max_bytes - (sizeof(kEllipsis) - 1));
  out += kEllipsis;
  return out;
}

std::string SanitizeUtf8Tail(std::string_view text, size_t max_bytes) {
  const size_t ellipsis = sizeof(kEllipsis) - 1;
  size_t start = text.size() > max_bytes ? text.size() - max_bytes : 0;
  // Do not start inside a character (at most 3 continuation bytes).
  for (int k = 0; k < 3 && start > 0 && start < text.size() &&
                  Cont(static_cast<unsigned char>(text[start]));
       ++k) {
    ++start;
  }
  std::string out;
  AppendSanitized(text.substr(start), 3 * max_bytes + 3, &out);
  if (start == 0 && out.size() <= max_bytes) return out;
  if (max_bytes < ellipsis) return SanitizeUtf8("", 0);
  size_t drop = out.size() + ellipsis > max_bytes ? out.size() + ellipsis - max_bytes : 0;
  while (drop < out.size() && Cont(static_cast<unsigned char>(out[drop]))) ++drop;
  return std::string(kEllipsis) + out.substr(std::min(drop, out.size()));
}

void LineSplitter::Feed(const char* data, size_t n, const Callback& on_line) {
  std::string_view in(data, n);
  while (!in.empty()) {
    const size_t nl = in.find('\n');
    const std::string_view piece = in.substr(0, nl);  // npos: all of it
    if (discarding_) {
      if (nl == std::string_view::npos) return;  // still inside the long line
      discarding_ = false;
      in.remove_prefix(nl + 1);
      continue;
    }
    const size_t room = max_line_ - partial_.size();
    if (piece.size() > room) {
      partial_.append(piece.data(), room);
      ++cut_lines_;
      on_line(partial_, true);
      partial_.clear();
      if (nl == std::string_view::npos) {
        discarding_ = true;
        return;
      }
      in.remove_prefix(nl + 1);
      continue;
    }
    if (nl == std::string_view::npos) {
      partial_.append(piece.data(), piece.size());
      return;
    }
    if (partial_.empty()) {
      on_line(piece, false);
    } else {
      partial_.append(piece.data(), piece.size());
      on_line(partial_, false);
      partial_.clear();
    }
    in.remove_prefix(nl + 1);
  }
}

void LineSplitter::Finish(const Callback& on_line) {
  if (!partial_.empty()) on_line(partial_, false);
  partial_.clear();
  discarding_ = false;
}

bool RateLimiter::Allow(int64_t now_ms) {
  if (last_ms_ >= 0 && now_ms > last_ms_) {
    tokens_ = std::min(burst_, tokens_ + per_s_ * static_cast<double>(now_ms - last_ms_) / 1000.0);
  }
  last_ms_ = std::max(last_ms_, now_ms);
  if (tokens_ >= 1.0) {
    tokens_ -= 1.0;
    return true;
  }
  ++suppressed_;
  return false;
}

int64_t RateLimiter::TakeSuppressed() {
  int64_t n = suppressed_;
  suppressed_ = 0;
  return n;
}

CappedFile::~CappedFile() { Close(); }

bool CappedFile::Open(const std::string& path, int64_t max_bytes) {
  Close();
  fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  max_bytes_ = max_bytes;
  written_ = dropped_ = 0;
  capped_ = false;
  return fd_ >= 0;
}

bool CappedFile::Write(std::string_view data) {
  if (fd_ < 0) return false;
  if (capped_) {
    dropped_ += static_cast<int64_t>(data.size());
    return false;
  }
  if (written_ + static_cast<int64_t>(data.size()) > max_bytes_) {
    capped_ = true;
    dropped_ += static_cast<int64_t>(data.size());
    const std::string note = absl::StrCat(
        "\n[depthbench-worker: this file reached its limit of ", max_bytes_,
        " bytes; the rest is dropped]\n");
    ssize_t w = write(fd_, note.data(), note.size());
    (void)w;
    return false;
  }
  size_t done = 0;
  while (done < data.size()) {
    ssize_t w = write(fd_, data.data() + done, data.size() - done);
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
  written_ += static_cast<int64_t>(data.size());
  return true;
}

void CappedFile::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace depthbench::worker
