// Per-program run time (run_time_ns / run_cnt from bpf_prog_get_info_by_fd).
// The kernel only counts while kernel.bpf_stats_enabled is on; BpfStatsOn
// turns it on for its lifetime with BPF_ENABLE_STATS (a file descriptor the
// kernel drops when it is closed, even if this process dies), falling back
// to writing the sysctl and restoring the previous value.
#pragma once

#include <cstdint>
#include <string>

#include "base/fd.h"

namespace sluice::bench {

class BpfStatsOn {
 public:
  BpfStatsOn();
  ~BpfStatsOn();
  BpfStatsOn(const BpfStatsOn&) = delete;
  BpfStatsOn& operator=(const BpfStatsOn&) = delete;
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  /// "BPF_ENABLE_STATS" or "sysctl kernel.bpf_stats_enabled (was N)".
  const std::string& how() const { return how_; }

 private:
  Fd fd_;
  std::string previous_;  // sysctl fallback: the value to restore
  std::string how_, error_;
};

struct ProgRun {
  uint64_t ns = 0, cnt = 0;
  ProgRun operator-(const ProgRun& o) const { return {ns - o.ns, cnt - o.cnt}; }
};
ProgRun progRun(int progFd);

/// An empty TC program (r0 = TC_ACT_OK; exit) named @p name: what one run
/// costs on this machine with nothing in it. Invalid Fd on error (errno).
Fd loadEmptyTcProgram(const char* name);

/// The value of kernel.bpf_stats_enabled ("" when unreadable).
std::string bpfStatsSysctl();

}  // namespace sluice::bench
