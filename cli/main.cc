// depthbench: the client CLI. See cli/commands.h.
#include <iostream>

#include "cli/commands.h"

int main(int argc, char** argv) {
  return depthbench::cli::RunCli(argc, argv, std::cout, std::cerr);
}
