#include <iostream>

#include "userspace/sluicectl/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return sluice::cli::main(args, std::cout, std::cerr);
}
