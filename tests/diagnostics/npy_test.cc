#include "trainer_core/diagnostics/npy.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace depthbench {
namespace diagnostics {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/npy_test_" + name;
}

// A raw .npy byte string with the given header dict and payload.
std::string RawNpy(int major, const std::string& dict,
                   const std::string& payload) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  const size_t n = header.size();
  out.push_back(static_cast<char>(n & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  if (major != 1) {
    out.push_back(0);
    out.push_back(0);
  }
  return out + header + payload;
}

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

TEST(NpyTest, RoundTrip3d) {
  std::vector<float> data(2 * 3 * 4);
  for (size_t i = 0; i < data.size(); ++i) data[i] = 0.5f * i - 3.0f;
  const std::string path = TempPath("rt.npy");
  ASSERT_TRUE(WriteNpyFloat32(path, {2, 3, 4}, data).ok());
  auto arr = ReadNpyFloat32(path);
  ASSERT_TRUE(arr.ok()) << arr.status();
  EXPECT_EQ(arr->shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(arr->data, data);
  // NumPy pads the preamble + header to a multiple of 64 bytes.
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EXPECT_EQ((static_cast<size_t>(in.tellg()) - data.size() * 4) % 64, 0u);
}

TEST(NpyTest, RoundTrip1dAnd0d) {
  const std::string path = TempPath("rt1.npy");
  ASSERT_TRUE(WriteNpyFloat32(path, {3}, {1.f, 2.f, 3.f}).ok());
  auto arr = ReadNpyFloat32(path);
  ASSERT_TRUE(arr.ok()) << arr.status();
  EXPECT_EQ(arr->shape, (std::vector<int64_t>{3}));
  ASSERT_TRUE(WriteNpyFloat32(path, {}, {7.f}).ok());
  arr = ReadNpyFloat32(path);
  ASSERT_TRUE(arr.ok()) << arr.status();
  EXPECT_TRUE(arr->shape.empty());
  EXPECT_EQ(arr->data, std::vector<float>{7.f});
  EXPECT_FALSE(WriteNpyFloat32(path, {2, 2}, {1.f}).ok());
}

TEST(NpyTest, ParsesVersion2AndDoubleQuotes) {
  auto arr = ParseNpyFloat32(RawNpy(
      2, "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (1, 2), }",
      Floats({4.f, 5.f})));
  ASSERT_TRUE(arr.ok()) << arr.status();
  EXPECT_EQ(arr->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(arr->data, (std::vector<float>{4.f, 5.f}));
}

TEST(NpyTest, RejectsBadFiles) {
  const std::string ok_dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const std::string two = Floats({1.f, 2.f});
  ASSERT_TRUE(ParseNpyFloat32(RawNpy(1, ok_dict, two)).ok());
  struct Case {
    std::string bytes;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"not an npy file at all", "magic"},
      {RawNpy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }",
              Floats({1.f, 2.f})),
       "<f8"},
      {RawNpy(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }",
              two),
       "float32"},
      {RawNpy(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }",
              two),
       "Fortran"},
      {RawNpy(1, ok_dict, Floats({1.f})), "truncated"},
      {RawNpy(1, ok_dict, Floats({1.f, 2.f, 3.f})), "trailing"},
      {RawNpy(1, "{'descr': '<f4', 'fortran_order': False}", two), "shape"},
      {RawNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (a,), }",
              two),
       "shape"},
      {RawNpy(7, ok_dict, two), "version"},
      {RawNpy(1, ok_dict, two).substr(0, 30), "truncated header"},
  };
  for (const Case& c : cases) {
    auto arr = ParseNpyFloat32(c.bytes);
    ASSERT_FALSE(arr.ok()) << c.want;
    EXPECT_EQ(arr.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(arr.status().message().find(c.want), std::string::npos)
        << arr.status() << " (wanted '" << c.want << "')";
  }
  auto missing = ReadNpyFloat32(TempPath("does_not_exist.npy"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(NpyTest, RefusesPathsThatAreNotRegularFiles) {
  for (const std::string path : {"/dev/zero", "/tmp"}) {
    auto arr = ReadNpyFloat32(path);
    ASSERT_FALSE(arr.ok()) << path;
    EXPECT_EQ(arr.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(arr.status().message().find(path + " is not a regular file"),
              std::string::npos)
        << arr.status();
  }
}

TEST(NpyTest, ShapeCheckRunsBeforeTheDataIsRead) {
  const std::string path = TempPath("checked.npy");
  ASSERT_TRUE(WriteNpyFloat32(path, {2, 3}, {1, 2, 3, 4, 5, 6}).ok());
  std::vector<int64_t> seen;
  auto refused = ReadNpyFloat32(path, [&](const std::vector<int64_t>& shape) {
    seen = shape;
    return absl::InvalidArgumentError("too big for me");
  });
  EXPECT_EQ(seen, (std::vector<int64_t>{2, 3}));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "too big for me");
  auto accepted = ReadNpyFloat32(
      path, [](const std::vector<int64_t>&) { return absl::OkStatus(); });
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(accepted->data, (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

}  // namespace
}  // namespace diagnostics
}  // namespace depthbench
