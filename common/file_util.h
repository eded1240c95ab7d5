// Whole-file reads for the small files the daemons and clients take by path
// (token files, TLS certificates and keys).
#ifndef DEPTHBENCH_COMMON_FILE_UTIL_H_
#define DEPTHBENCH_COMMON_FILE_UTIL_H_

#include <string>

namespace depthbench {

// Reads the file at `path` into *out; false if it cannot be opened or read.
bool ReadWholeFile(const std::string& path, std::string* out);

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_FILE_UTIL_H_
