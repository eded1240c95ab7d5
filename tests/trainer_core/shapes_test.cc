#include "trainer_core/shapes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "trainer_core/arch.h"
#include "trainer_core/flops.h"

namespace depthbench {
namespace {

struct Expected {
  int64_t layers, d, d_ff;
  double aspect, diff_pct;
  int64_t total_millions;
};

TEST(ShapesTest, Main400MTableMatchesSpecExactly) {
  auto suite = NamedSuite("main400M");
  ASSERT_TRUE(suite.ok());
  auto rows = SolveSuite(*suite);
  ASSERT_TRUE(rows.ok()) << rows.status();
  const std::vector<Expected> want = {
      {16, 1216, 3248, 76.00, 0.28, 407},  {20, 1120, 2992, 56.00, 2.14, 414},
      {24, 1024, 2736, 42.67, 0.00, 405},  {28, 960, 2560, 34.29, 0.21, 406},
      {32, 896, 2400, 28.00, -1.49, 399},  {42, 800, 2144, 19.05, -0.31, 404},
      {70, 640, 1712, 9.14, 0.94, 409}};
  ASSERT_EQ(rows->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const ShapeRow& r = (*rows)[i];
    EXPECT_EQ(r.shape.layers, want[i].layers);
    EXPECT_EQ(r.shape.d_model, want[i].d);
    EXPECT_EQ(r.shape.d_ff, want[i].d_ff);
    EXPECT_NEAR(r.shape.aspect_ratio(), want[i].aspect, 0.005);
    EXPECT_NEAR(r.diff_pct, want[i].diff_pct, 0.005);
    EXPECT_EQ((r.total_params + 500000) / 1000000, want[i].total_millions);
  }
}

// Spec section 4: the multi-scale ladders fix the depths per budget and solve
// d. The solver must reproduce the paper's Appendix B configurations (the
// authors' released configs llama_{200,300,500}m_L*.json; 400M is Table 3):
// deep (aspect near 28), reference (near 43), shallow (near 76).
TEST(ShapesTest, LadderSuitesGiveThePapersShapes) {
  struct Ladder {
    const char* name;
    std::vector<std::pair<int64_t, int64_t>> shapes;  // (L, d): deep, ref, shallow
    std::vector<int64_t> d_ff;
  };
  const std::vector<Ladder> ladders = {
      {"ladder200M", {{24, 672}, {18, 768}, {12, 896}}, {1792, 2048, 2400}},
      {"ladder300M", {{28, 800}, {21, 896}, {14, 1056}}, {2144, 2400, 2816}},
      {"ladder400M", {{32, 896}, {24, 1024}, {16, 1216}}, {2400, 2736, 3248}},
      {"ladder500M", {{34, 992}, {26, 1120}, {17, 1344}}, {2656, 2992, 3584}},
  };
  for (const Ladder& ladder : ladders) {
    SCOPED_TRACE(ladder.name);
    auto suite = NamedSuite(ladder.name);
    ASSERT_TRUE(suite.ok()) << suite.status();
    auto rows = SolveSuite(*suite);
    ASSERT_TRUE(rows.ok()) << rows.status();
    ASSERT_EQ(rows->size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ((*rows)[i].shape.layers, ladder.shapes[i].first);
      EXPECT_EQ((*rows)[i].shape.d_model, ladder.shapes[i].second);
      EXPECT_EQ((*rows)[i].shape.d_ff, ladder.d_ff[i]);
      EXPECT_LT(std::fabs((*rows)[i].diff_pct), 3.5);  // matched within the budget
    }
    EXPECT_DOUBLE_EQ((*rows)[1].diff_pct, 0.0);  // the reference
    // Aspect ratios near 28, 43 and 76.
    EXPECT_NEAR((*rows)[0].shape.aspect_ratio(), 28, 2.0);
    EXPECT_NEAR((*rows)[1].shape.aspect_ratio(), 43, 2.0);
    EXPECT_NEAR((*rows)[2].shape.aspect_ratio(), 76, 3.5);
  }
}

TEST(ShapesTest, ParseLxDRejectsGarbageNamingField) {
  auto bad = ParseLxD("24by1024");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("ref:"), std::string::npos);
  auto good = ParseLxD("24x1024");
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->first, 24);
  EXPECT_EQ(good->second, 1024);
}

TEST(ArchTest, NamesRoundTripAndUnknownIsPrecise) {
  for (Arch a : AllArchs()) {
    auto parsed = ParseArch(ArchName(a));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, a);
  }
  auto bad = ParseArch("hcc");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("\"hcc\""), std::string::npos);
}

TEST(FlopsTest, AppendixDDesignTermsAtFourStreams) {
  ModelShape s = MakeShape(24, 1024, 50280);
  const double T = 2048, d = 1024, L = 24;
  EXPECT_DOUBLE_EQ(ForwardFlops(Arch::kHc, s, 2048).design, 192 * T * d * L);
  EXPECT_DOUBLE_EQ(ForwardFlops(Arch::kMhc, s, 2048).design, 480 * T * d * L);
  EXPECT_DOUBLE_EQ(ForwardFlops(Arch::kAttnResFull, s, 2048).design,
                   4 * T * d * L * (2 * L + 3));
  EXPECT_DOUBLE_EQ(ForwardFlops(Arch::kPreLn, s, 2048).body,
                   L * (8 * T * d * d + 6 * T * d * 2736 + 2 * T * T * d));
}

}  // namespace
}  // namespace depthbench
