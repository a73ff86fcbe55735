#include "test/bench/bpfstats.h"

#include <bpf/bpf.h>
#include <linux/pkt_cls.h>

#include <cstring>
#include <fstream>

namespace sluice::bench {

namespace {
constexpr const char* kSysctl = "/proc/sys/kernel/bpf_stats_enabled";

bool writeSysctl(const std::string& v) {
  std::ofstream f(kSysctl);
  f << v;
  f.close();
  return static_cast<bool>(f);
}
}  // namespace

std::string bpfStatsSysctl() {
  std::ifstream f(kSysctl);
  std::string v;
  f >> v;
  return v;
}

BpfStatsOn::BpfStatsOn() {
  int fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
  if (fd >= 0) {
    fd_ = Fd(fd);
    how_ = "BPF_ENABLE_STATS";
    return;
  }
  int err = errno;
  previous_ = bpfStatsSysctl();
  if (previous_.empty() || !writeSysctl("1")) {
    error_ = std::string("cannot enable BPF run-time statistics: BPF_ENABLE_STATS: ") + std::strerror(err) +
             ", sysctl kernel.bpf_stats_enabled not writable";
    previous_.clear();
    return;
  }
  how_ = "sysctl kernel.bpf_stats_enabled (was " + previous_ + ")";
}

BpfStatsOn::~BpfStatsOn() {
  if (!previous_.empty()) (void)writeSysctl(previous_);
}

Fd loadEmptyTcProgram(const char* name) {
  struct bpf_insn insns[2] = {};
  insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K;  // r0 = TC_ACT_OK
  insns[0].dst_reg = BPF_REG_0;
  insns[0].imm = TC_ACT_OK;
  insns[1].code = BPF_JMP | BPF_EXIT;
  return Fd(bpf_prog_load(BPF_PROG_TYPE_SCHED_CLS, name, "GPL", insns, 2, nullptr));
}

ProgRun progRun(int progFd) {
  bpf_prog_info info{};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(progFd, &info, &len) != 0) return {};
  return {info.run_time_ns, info.run_cnt};
}

}  // namespace sluice::bench
