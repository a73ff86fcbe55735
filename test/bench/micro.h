// Per-packet cost of each sluice program on one packet of each kind, with
// BPF_PROG_TEST_RUN inside an enrolled pod (the kernel times the program
// alone; the median over many single runs shrugs off preemption). This
// complements the bpf_stats figures of real traffic, which on a shared or
// virtual machine also count the time a run was interrupted.
#pragma once

#include <string>
#include <vector>

#include "test/bench/cases.h"

namespace sluice::bench {

struct MicroSample {
  std::string program, packet;
  std::string verdict;  ///< "TC_ACT_OK", "TC_ACT_REDIRECT", ...
  double nsMedian = 0, nsMean = 0;
  int runs = 0;
  std::string error;
};

/// Runs each packet kind @p runs times through its program in @p env's pod.
std::vector<MicroSample> runMicro(CaseEnv& env, int runs);

}  // namespace sluice::bench
