// The loaded BPF object: programs and maps of bpf/pod_tc.bpf.c, with the
// maps pinned under the bpffs root (reused when already pinned).
#pragma once

#include <memory>
#include <string>

#include "loader/bpf_map.h"
#include "loader/result.h"
#include "maps/sluice_maps.h"

struct pod_tc;  // generated skeleton

namespace sluice {

/// Owns the skeleton: programs loaded into the kernel, maps created or
/// reused from pins under the bpffs root. Typed maps, never names as strings.
class PodPrograms {
 public:
  /// Opens and loads the programs; maps are pinned by name under `root`
  /// (which must exist on bpffs). Call with the StateLock held.
  static Result<std::unique_ptr<PodPrograms>> load(const std::string& root);
  ~PodPrograms();
  PodPrograms(const PodPrograms&) = delete;
  PodPrograms& operator=(const PodPrograms&) = delete;

  int egressFd() const;
  int ingressFd() const;
  int loEgressFd() const;

  BpfMap<__u32, sluice_settings> settings;
  BpfMap<__u64, sluice_pod_config> podConfig;
  BpfMap<__u64, sluice_pod_stats> podStats;
  BpfMap<sluice_dns_nat_key, sluice_dns_nat_value> dnsNat;
  BpfMap<sluice_pod_id, sluice_pod_record> pods;

 private:
  PodPrograms() = default;
  struct pod_tc* skel_ = nullptr;
};

/// Routes libbpf's own log into spdlog, one level lower than libbpf's
/// (libbpf warnings become spdlog debug... info, see implementation).
void routeLibbpfLogging();

}  // namespace sluice
