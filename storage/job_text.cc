#include "storage/job_text.h"

#include <array>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace depthbench::storage {
namespace {

namespace v1 = ::depthbench::v1;

constexpr std::array<std::pair<v1::JobState, const char*>, 11> kStates = {{
    {v1::PENDING, "pending"},
    {v1::LEASED, "leased"},
    {v1::RUNNING, "running"},
    {v1::SUCCEEDED, "succeeded"},
    {v1::DIVERGED, "diverged"},
    {v1::FAILED, "failed"},
    {v1::CANCELLED, "cancelled"},
    {v1::PRUNED, "pruned"},
    {v1::HELD, "held"},
    {v1::SKIPPED, "skipped"},
    {v1::PAUSED, "paused"},
}};

constexpr std::array<std::pair<v1::JobKind, const char*>, 2> kKinds = {{
    {v1::TRAIN, "train"},
    {v1::DIAGNOSE, "diagnose"},
}};

template <typename Enum, size_t N>
const char* TextOf(const std::array<std::pair<Enum, const char*>, N>& table,
                        Enum value) {
  for (const auto& [e, text] : table) {
    if (e == value) return text;
  }
  return "";
}

template <typename Enum, size_t N>
absl::StatusOr<Enum> Parse(const std::array<std::pair<Enum, const char*>, N>& table,
                           const std::string& text, const char* column) {
  for (const auto& [e, t] : table) {
    if (text == t) return e;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("jobs.", column, ": unknown stored value \"", text, "\""));
}

}  // namespace

const char* JobStateText(v1::JobState state) { return TextOf(kStates, state); }

absl::StatusOr<v1::JobState> ParseJobState(const std::string& text) {
  return Parse(kStates, text, "state");
}

const char* JobKindText(v1::JobKind kind) { return TextOf(kKinds, kind); }

absl::StatusOr<v1::JobKind> ParseJobKind(const std::string& text) {
  return Parse(kKinds, text, "kind");
}

std::string SqlLiteral(v1::JobState state) { return absl::StrCat("'", JobStateText(state), "'"); }

std::string SqlLiteral(v1::JobKind kind) { return absl::StrCat("'", JobKindText(kind), "'"); }

}  // namespace depthbench::storage
