// sluice-cni: see userspace/cni/cni.h.
#include <iostream>

#include "userspace/cni/cni.h"

int main(int argc, char** argv) {
  return sluice::cni::main(std::vector<std::string>(argv + 1, argv + argc), std::cin, std::cout, std::cerr);
}
