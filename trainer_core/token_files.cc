#include "trainer_core/token_files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer_core/npy.h"

namespace depthbench {
namespace {

namespace fs = std::filesystem;

constexpr bool kHostLittleEndian =
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

absl::Status ReadExact(std::ifstream& in, const std::string& path,
                       char* dst, int64_t bytes, int64_t at) {
  in.read(dst, bytes);
  if (in.gcount() != bytes) {
    return absl::DataLossError(absl::StrCat("short read from ", path, ": ",
                                            in.gcount(), " of ", bytes,
                                            " bytes at offset ", at));
  }
  return absl::OkStatus();
}

int32_t LoadLe32(const unsigned char* p) {
  const uint32_t v = static_cast<uint32_t>(p[0]) |
                     (static_cast<uint32_t>(p[1]) << 8) |
                     (static_cast<uint32_t>(p[2]) << 16) |
                     (static_cast<uint32_t>(p[3]) << 24);
  return static_cast<int32_t>(v);
}

template <typename T>
void SwapToHost(std::vector<T>& v) {
  if (kHostLittleEndian) return;
  for (T& x : v) {
    T y = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      y = static_cast<T>((y << 8) | ((x >> (8 * i)) & 0xFF));
    }
    x = y;
  }
}

// Reads `count` little-endian ids of type T from `in` (positioned at `at`).
template <typename T>
absl::StatusOr<std::vector<T>> ReadIds(std::ifstream& in,
                                       const std::string& path, int64_t count,
                                       int64_t at) {
  std::vector<T> ids(static_cast<size_t>(count));
  RETURN_IF_ERROR(ReadExact(in, path, reinterpret_cast<char*>(ids.data()),
                            count * static_cast<int64_t>(sizeof(T)), at));
  SwapToHost(ids);
  return ids;
}

// The directory's *.bin shards: the last (by name) is validation, the others
// training; a single shard holds out its tail.
absl::StatusOr<TokenDataset> LoadShardDirectory(const std::string& path,
                                                int64_t vocab) {
  TokenDataset ds;
  ds.source = path;
  ds.vocab = vocab;
  ds.format = DataFormat::kBinDirectory;
  std::error_code ec;
  std::vector<std::string> shards;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".bin") {
      shards.push_back(entry.path().string());
    }
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list ", path, ": ", ec.message()));
  }
  if (shards.empty()) {
    return absl::NotFoundError(
        absl::StrCat("data directory ", path, " holds no .bin shards"));
  }
  std::sort(shards.begin(), shards.end());
  if (shards.size() == 1) {
    ASSIGN_OR_RETURN(TokenSequence all, ReadBinShard(shards[0], ds.vocab));
    RETURN_IF_ERROR(HoldOutTail(shards[0], std::move(all), &ds));
    ds.train_files = shards;
    ds.val_files = shards;
    return ds;
  }
  for (size_t i = 0; i + 1 < shards.size(); ++i) {
    ASSIGN_OR_RETURN(TokenSequence part, ReadBinShard(shards[i], ds.vocab));
    ds.train.Append(part);
    ds.train_files.push_back(shards[i]);
  }
  ASSIGN_OR_RETURN(ds.val, ReadBinShard(shards.back(), ds.vocab));
  ds.val_files.push_back(shards.back());
  ds.split_rule = absl::StrCat(
      "*.bin shards sorted by name; the last (", shards.back(),
      ") is validation, the other ", shards.size() - 1, " training");
  return ds;
}

}  // namespace

absl::StatusOr<TokenSequence> ReadBinShard(const std::string& path,
                                           int64_t vocab) {
  ASSIGN_OR_RETURN(const int64_t file_size,
                   RegularFileSize(path, "data file"));
  constexpr int64_t kHeaderBytes = kBinHeaderInts * 4;
  if (file_size < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "truncated .bin header in ", path, ": file holds ", file_size,
        " bytes, the header alone needs ", kHeaderBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  unsigned char header[kHeaderBytes];
  RETURN_IF_ERROR(ReadExact(in, path, reinterpret_cast<char*>(header),
                            kHeaderBytes, 0));
  const int32_t magic = LoadLe32(header);
  const int32_t version = LoadLe32(header + 4);
  const int64_t count = LoadLe32(header + 8);
  if (magic != kBinMagic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wrong magic in ", path, ": expected ", kBinMagic, ", got ", magic,
        " (not an llm.c uint16 .bin shard)"));
  }
  if (version != kBinVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported .bin version ", version, " in ", path,
        ": only version ", kBinVersion, " (uint16 tokens) is supported"));
  }
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "negative token count ", count, " in the header of ", path));
  }
  const int64_t payload = file_size - kHeaderBytes;
  const int64_t held = payload / 2;
  if (payload < count * 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "truncated .bin shard ", path, ": header says ", count,
        " tokens, file holds ", held, " (", payload, " bytes after the header)"));
  }
  if (payload > count * 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size mismatch in .bin shard ", path, ": header says ", count,
        " tokens, file holds ", payload, " bytes after the header (",
        payload - count * 2, " trailing bytes)"));
  }
  ASSIGN_OR_RETURN(std::vector<uint16_t> ids,
                   ReadIds<uint16_t>(in, path, count, kHeaderBytes));
  TokenSequence seq(std::move(ids));
  RETURN_IF_ERROR(seq.CheckVocab(vocab, path));
  return seq;
}

absl::Status WriteBinShard(const std::string& path,
                           const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write ", tokens.size(), " tokens to ", path,
        ": the .bin header holds an int32 count"));
  }
  std::vector<unsigned char> bytes(kBinHeaderInts * 4 + tokens.size() * 2, 0);
  auto put32 = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) bytes[at + k] = (v >> (8 * k)) & 0xFF;
  };
  put32(0, static_cast<uint32_t>(kBinMagic));
  put32(4, static_cast<uint32_t>(kBinVersion));
  put32(8, static_cast<uint32_t>(tokens.size()));
  size_t at = kBinHeaderInts * 4;
  for (uint16_t t : tokens) {
    bytes[at++] = t & 0xFF;
    bytes[at++] = t >> 8;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot create ", path));
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<TokenSequence> ReadNpyTokens(const std::string& path,
                                            int64_t vocab) {
  NpyExpectation expect;
  expect.dtypes = {{"<u2", 2}, {"<u4", 4}};
  expect.dtypes_help = "'<u2' uint16, '<u4' uint32";
  expect.ndim = 1;
  expect.ndim_help = "token arrays must be 1-D";
  expect.element_noun = "tokens";
  ASSIGN_OR_RETURN(NpyFileReader reader, NpyFileReader::Open(path, expect));
  const int64_t count = reader.layout().count;
  TokenSequence seq;
  if (reader.layout().dtype.item_size == 2) {
    std::vector<uint16_t> ids(static_cast<size_t>(count));
    RETURN_IF_ERROR(reader.ReadData(ids.data()));
    seq = TokenSequence(std::move(ids));
  } else {
    std::vector<uint32_t> ids(static_cast<size_t>(count));
    RETURN_IF_ERROR(reader.ReadData(ids.data()));
    seq = TokenSequence(std::move(ids));
  }
  RETURN_IF_ERROR(seq.CheckVocab(vocab, path));
  return seq;
}

absl::StatusOr<TokenDataset> LoadTokenFiles(const std::string& path,
                                            int64_t vocab) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return LoadShardDirectory(path, vocab);
  TokenDataset ds;
  ds.source = path;
  ds.vocab = vocab;
  const std::string ext = fs::path(path).extension().string();
  TokenSequence all;
  if (ext == ".bin") {
    ds.format = DataFormat::kBin;
    ASSIGN_OR_RETURN(all, ReadBinShard(path, ds.vocab));
  } else if (ext == ".npy") {
    ds.format = DataFormat::kNpy;
    ASSIGN_OR_RETURN(all, ReadNpyTokens(path, ds.vocab));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "data file ", path, " has extension '", ext,
        "'; expected .bin (llm.c uint16 shard) or .npy"));
  }
  RETURN_IF_ERROR(HoldOutTail(path, std::move(all), &ds));
  ds.train_files = {path};
  ds.val_files = {path};
  return ds;
}

}  // namespace depthbench
