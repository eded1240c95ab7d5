// Placeholders for designs 6-10 until issue 3 lands: they refuse clearly.
#include <stdexcept>

#include "trainer_core/model/design.h"

namespace depthbench {
namespace {
[[noreturn]] void Pending(const char* name) {
  throw std::runtime_error(std::string("architecture ") + name + " is not built yet");
}
}  // namespace
std::shared_ptr<DesignImpl> MakeHc(const DesignOptions&) { Pending("hc"); }
std::shared_ptr<DesignImpl> MakeMhc(const DesignOptions&) { Pending("mhc"); }
std::shared_ptr<DesignImpl> MakeAttnResFull(const DesignOptions&) { Pending("attnres_full"); }
std::shared_ptr<DesignImpl> MakeAttnResBlock(const DesignOptions&) { Pending("attnres_block"); }
std::shared_ptr<DesignImpl> MakeModa(const DesignOptions&) { Pending("moda"); }
}  // namespace depthbench
