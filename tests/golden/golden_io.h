// What the golden checks against PyTorch share (tests/trainer_core/
// designs_test.cc, tests/diagnostics/probes_golden_test.cc): the Python
// that runs tests/golden/*.py, a fresh exchange folder, and raw float32
// tensors written for and read back from the script, and a model's
// parameters exported for it.
#ifndef DEPTHBENCH_TESTS_GOLDEN_GOLDEN_IO_H_
#define DEPTHBENCH_TESTS_GOLDEN_GOLDEN_IO_H_

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "trainer_core/arch.h"
#include "trainer_core/model/model.h"

namespace depthbench::golden {

inline constexpr const char* kPython = "/usr/bin/python3";

// Whether kPython imports torch and numpy (Debian python3-torch); the
// golden checks skip, saying so, without them.
inline bool PythonHasTorch() {
  return std::system((std::string(kPython) + " -c 'import torch, numpy' 2>/dev/null").c_str()) ==
         0;
}

// An empty folder <tmp>/<prefix>_<pid> for the files exchanged with Python.
inline std::filesystem::path FreshDir(const std::string& prefix) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void WriteF32(const std::string& path, const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kFloat32).contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * sizeof(float));
}

inline torch::Tensor ReadF32(const std::string& path, c10::IntArrayRef sizes) {
  torch::Tensor t = torch::empty(sizes, torch::kFloat32);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(t.data_ptr<float>()), t.numel() * sizeof(float));
  EXPECT_EQ(f.gcount(), static_cast<std::streamsize>(t.numel() * sizeof(float))) << path;
  return t;
}

// Writes the model's parameters as raw float32 under dir/<name>/ and returns
// its entry in the exchange folder's index.json (arch, shape, parameters), the
// layout tests/golden/*.py build their float64 reference model from.
inline nlohmann::json ExportModel(const std::filesystem::path& dir, const std::string& name,
                                  const ModelOptions& o, LanguageModelImpl& m) {
  std::filesystem::create_directories(dir / name);
  nlohmann::json entry;
  const ModelShape& s = o.design.shape;
  entry["arch"] = std::string(ArchName(o.arch));
  entry["hc_code_form"] = o.design.hc_code_form;
  entry["shape"] = {{"layers", s.layers}, {"d_model", s.d_model}, {"d_ff", s.d_ff},
                    {"heads", s.heads},   {"kv_heads", s.kv_heads}, {"vocab", s.vocab},
                    {"streams", o.design.hc_streams}};
  for (auto& item : m.named_parameters()) {
    WriteF32((dir / name / (item.key() + ".f32")).string(), item.value());
    entry["params"].push_back({{"name", item.key()}, {"shape", item.value().sizes().vec()}});
  }
  return entry;
}

}  // namespace depthbench::golden

#endif  // DEPTHBENCH_TESTS_GOLDEN_GOLDEN_IO_H_
