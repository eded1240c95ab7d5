#include "trainer_core/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer_core/trainer.h"

namespace depthbench {

namespace {

// fsync(2) of a file or directory; the error names the path.
absl::Status SyncPath(const std::string& path, bool directory) {
  int fd = open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("checkpoint: open ", path, ": ", std::strerror(errno)));
  }
  int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("checkpoint: fsync ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointPath(const std::string& out_dir) {
  return (std::filesystem::path(out_dir) / "checkpoint.pt").string();
}

ModelOptions ModelOptionsFor(const TrainConfig& config) {
  ModelOptions m;
  m.arch = config.arch;
  m.design.shape = config.shape;
  m.design.max_seq_len = std::max<int64_t>(config.seq_len, 16);
  m.design.hc_streams = config.hc_streams;
  m.design.hc_code_form = config.hc_code_form;
  m.init = config.trunc_normal_init ? InitKind::kTruncatedNormal : InitKind::kNormal;
  return m;
}

absl::Status SaveTrainingCheckpoint(const std::string& path, const CheckpointMeta& meta,
                                    LanguageModelImpl& model,
                                    torch::optim::Optimizer& optimizer) {
  const std::string tmp = path + ".tmp";
  try {
    torch::serialize::OutputArchive archive;
    torch::serialize::OutputArchive model_archive;
    model.save(model_archive);
    archive.write("model", model_archive);
    torch::serialize::OutputArchive optim_archive;
    optimizer.save(optim_archive);
    archive.write("optimizer", optim_archive);
    archive.write("rng", at::detail::getDefaultCPUGenerator().get_state());
    nlohmann::json j = {{"step", meta.step}, {"sampler", meta.sampler_json}, {"config", meta.config}};
    archive.write("meta", c10::IValue(j.dump()));
    archive.save_to(tmp);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("checkpoint: writing ", tmp, " failed: ", e.what_without_backtrace()));
  }
  // Atomic and durable: the bytes reach the disk before the rename makes
  // them the checkpoint, and the rename itself is synced with its
  // directory. A crash at any point leaves the previous checkpoint whole.
  RETURN_IF_ERROR(SyncPath(tmp, /*directory=*/false));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint: rename to ", path, " failed: ", ec.message()));
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  return SyncPath(dir.empty() ? std::string(".") : dir.string(), /*directory=*/true);
}

namespace {

absl::StatusOr<CheckpointMeta> ReadMeta(torch::serialize::InputArchive& archive,
                                        const std::string& path) {
  c10::IValue meta_value;
  if (!archive.try_read("meta", meta_value) || !meta_value.isString())
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": no metadata"));
  nlohmann::json j = nlohmann::json::parse(meta_value.toStringRef(), nullptr, false);
  if (j.is_discarded() || !j.contains("step") || !j.contains("config"))
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": malformed metadata"));
  CheckpointMeta meta;
  meta.step = j["step"].get<int64_t>();
  meta.sampler_json = j.value("sampler", "");
  meta.config = j["config"];
  return meta;
}

absl::Status OpenArchive(const std::string& path, torch::serialize::InputArchive& archive) {
  if (!std::filesystem::exists(path))
    return absl::NotFoundError(absl::StrCat("checkpoint: ", path, " does not exist"));
  try {
    archive.load_from(path);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": unreadable: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointMeta> LoadTrainingCheckpoint(const std::string& path,
                                                      const TrainConfig& config,
                                                      LanguageModelImpl& model,
                                                      torch::optim::Optimizer& optimizer) {
  torch::serialize::InputArchive archive;
  RETURN_IF_ERROR(OpenArchive(path, archive));
  ASSIGN_OR_RETURN(CheckpointMeta meta, ReadMeta(archive, path));
  const nlohmann::json want = config.ToJson();
  for (const char* key : {"arch", "layers", "d_model", "d_ff", "heads", "kv_heads", "vocab",
                          "hc_streams", "hc_form"}) {
    if (meta.config.value(key, nlohmann::json()) != want[key]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, ": written for ", key, "=", meta.config.value(key, nlohmann::json()).dump(),
          ", this run has ", key, "=", want[key].dump()));
    }
  }
  try {
    torch::serialize::InputArchive model_archive;
    archive.read("model", model_archive);
    model.load(model_archive);
    torch::serialize::InputArchive optim_archive;
    archive.read("optimizer", optim_archive);
    optimizer.load(optim_archive);
    torch::Tensor rng;
    archive.read("rng", rng);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", e.what_without_backtrace()));
  }
  return meta;
}

absl::StatusOr<LoadedModel> LoadModelCheckpoint(const std::string& path_or_dir) {
  const std::string path = std::filesystem::is_directory(path_or_dir)
                               ? CheckpointPath(path_or_dir)
                               : path_or_dir;
  torch::serialize::InputArchive archive;
  RETURN_IF_ERROR(OpenArchive(path, archive));
  LoadedModel loaded;
  ASSIGN_OR_RETURN(loaded.meta, ReadMeta(archive, path));
  ASSIGN_OR_RETURN(loaded.config, TrainConfigFromJson(loaded.meta.config));
  ASSIGN_OR_RETURN(loaded.model, BuildModel(ModelOptionsFor(loaded.config)));
  try {
    torch::serialize::InputArchive model_archive;
    archive.read("model", model_archive);
    loaded.model->load(model_archive);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", e.what_without_backtrace()));
  }
  loaded.model->eval();
  return loaded;
}

}  // namespace depthbench
