// The web view's files (scheduler/web/ and the vendored uPlot), embedded
// into the binary at build time: scheduler/web/embed.cmake writes
// web_assets.cc into the build directory from the list in
// scheduler/CMakeLists.txt.
#ifndef DEPTHBENCH_SCHEDULER_WEB_ASSETS_H_
#define DEPTHBENCH_SCHEDULER_WEB_ASSETS_H_

#include <cstddef>
#include <string_view>

namespace depthbench::scheduler {

struct WebAsset {
  const char* name;          // e.g. "app.js", "uPlot.iife.min.js"
  const char* content_type;  // from the file's extension
  const unsigned char* data;
  size_t size;
};

// The file called `name`, or null.
const WebAsset* FindWebAsset(std::string_view name);

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_WEB_ASSETS_H_
