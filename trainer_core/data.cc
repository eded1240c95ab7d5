#include "trainer_core/data.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace depthbench {

absl::StatusOr<TokenDataset> LoadDataset(const DataOptions& options) {
  if (options.data == "brown") {
    return LoadBrown(options.brown_dir,
                     options.vocab == 0 ? kBrownVocab : options.vocab);
  }
  const std::string& path = options.data;
  if (options.vocab <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab is required for data ", path,
        " (only 'brown' has a default); got ", options.vocab));
  }
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat(
        "data ", path, " does not exist (expected 'brown', a .bin shard, a "
        ".npy array or a directory of .bin shards)"));
  }
  return LoadTokenFiles(path, options.vocab);
}

}  // namespace depthbench
