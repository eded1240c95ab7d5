#include "trainer_core/token_dataset.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace depthbench {

std::string DataFormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kBrown:
      return "brown";
    case DataFormat::kBin:
      return "bin";
    case DataFormat::kNpy:
      return "npy";
    case DataFormat::kBinDirectory:
      return "bin_dir";
  }
  return "unknown";
}

absl::Status HoldOutTail(const std::string& source, TokenSequence all,
                         TokenDataset* ds) {
  const int64_t n = all.size();
  const int64_t n_val = n / kValEvery;
  if (n_val < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " holds ", n, " tokens: too few to hold out the last 1/",
        kValEvery, " as validation (need at least ", kValEvery, ")"));
  }
  ds->train = all.Slice(0, n - n_val);
  ds->val = all.Slice(n - n_val, n_val);
  ds->split_rule = absl::StrCat("last floor(N/", kValEvery, ") = ", n_val,
                                " of N = ", n, " tokens are validation");
  return absl::OkStatus();
}

std::string DataInfoJson(const TokenDataset& dataset) {
  nlohmann::json j;
  j["source"] = dataset.source;
  j["format"] = DataFormatName(dataset.format);
  j["vocab"] = dataset.vocab;
  j["byte_level"] = dataset.byte_level;
  j["split_rule"] = dataset.split_rule;
  auto split = [](const TokenSequence& seq,
                  const std::vector<std::string>& files) {
    nlohmann::json s;
    s["tokens"] = seq.size();
    s["files"] = files.size();
    s["max_id"] = seq.MaxId();
    s["token_bytes"] = seq.width_bytes();
    return s;
  };
  j["train"] = split(dataset.train, dataset.train_files);
  j["val"] = split(dataset.val, dataset.val_files);
  const int64_t total = dataset.train.size() + dataset.val.size();
  j["val_fraction"] =
      total == 0 ? 0.0
                 : static_cast<double>(dataset.val.size()) /
                       static_cast<double>(total);
  if (dataset.byte_level) {
    j["sample"] = DecodeBytes(dataset.train, 200);
  } else {
    std::vector<uint32_t> ids;
    for (int64_t i = 0; i < std::min<int64_t>(64, dataset.train.size()); ++i) {
      ids.push_back(dataset.train[i]);
    }
    j["sample_ids"] = ids;
  }
  // Replace invalid UTF-8 (byte-level data need not be text) instead of
  // throwing.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace depthbench
