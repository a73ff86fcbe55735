// The loaded BPF object: programs and maps of bpf/pod_tc.bpf.c, with the
// maps pinned under the bpffs root (reused when already pinned).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "loader/bpf_map.h"
#include "loader/features.h"
#include "loader/program_pins.h"
#include "loader/result.h"
#include "maps/sluice_maps.h"

struct pod_tc;   // generated skeletons
struct pod_tc_compat;
struct host_tc;

namespace sluice {

/// Owns the skeletons of the pod programs (bpf/pod_tc.bpf.c) and the node
/// programs (bpf/host_tc.bpf.c): programs loaded into the kernel, maps
/// created or reused from pins under the bpffs root, so both objects share
/// them. Typed maps, never names as strings.
class PodPrograms {
 public:
  /// Opens and loads the programs; maps are pinned by name under `root`
  /// (which must exist on bpffs). Call with the StateLock held. The kernel
  /// features are probed first (kernelFeatures()): a kernel below the
  /// minimum gets an error naming what it lacks, and the pod programs are
  /// the variant of the report's pod-cookie method. Pins of older layouts
  /// are migrated (loader/migrate.h); a layout this build cannot read is
  /// an error and leaves the pins as they are.
  /// snatEntries: the capacity of snat_rev (probe SNAT connections); a
  /// pinned map of another capacity is refused (Migration::plan names it).
  /// Shared (the default): programs this build pinned under the root
  /// (loader/program_pins.h) are reused without loading, probing or
  /// opening a skeleton; otherwise the loaded ones are pinned as this
  /// build's. Private: a load of its own, pinned nowhere (a second
  /// instance, as a tcx link moved to the front needs).
  enum class Sharing { Shared, Private };
  static Result<std::unique_ptr<PodPrograms>> load(const std::string& root, uint32_t snatEntries = SLUICE_SNAT_ENTRIES,
                                                   Sharing sharing = Sharing::Shared);
  ~PodPrograms();
  PodPrograms(const PodPrograms&) = delete;
  PodPrograms& operator=(const PodPrograms&) = delete;

  int egressFd() const;
  int ingressFd() const;
  int loEgressFd() const;
  int hostEgressFd() const;
  int hostIngressFd() const;
  /// How the loaded pod programs find the pod of a packet.
  PodCookieMethod cookieMethod() const { return cookieMethod_; }
  /// The build identity of these programs (as pinned; "" for Private).
  const std::string& identity() const { return identity_; }
  /// True when they were taken from the pins rather than loaded.
  bool reused() const { return reused_; }

  BpfMap<__u32, sluice_settings> settings;
  BpfMap<__u64, sluice_pod_config> podConfig;
  BpfMap<__u64, sluice_pod_stats> podStats;
  BpfMap<sluice_dns_nat_key, sluice_dns_nat_value> dnsNat;
  BpfMap<sluice_pod_id, sluice_pod_record> pods;
  BpfMap<sluice_pod_addr, sluice_pod_addr_info> podAddrs;
  BpfMap<sluice_snat_key, sluice_snat_value> snatRev;  ///< probe SNAT: one element per connection
  BpfMap<sluice_snat_key, sluice_snat_value> snatClosed;
  BpfMap<sluice_listener_key, __u64> podListeners;  ///< SOCKHASH: values are sockets
  BpfMap<sluice_layout_key, sluice_layout_value> layouts;
  BpfMap<__u32, sluice_proxy_identity> proxyIdentity;
  BpfMap<__u64, sluice_proxy_cgroup> proxyCgroups;

 private:
  PodPrograms() = default;
  /// Loads the opened pod object (either variant) and binds its maps.
  template <typename Skel>
  Status loadPod(Skel* skel, int (*loadFn)(Skel*), const std::string& root);

  /// Calls bind(member, pin name) for every typed map above.
  template <typename Bind>
  Status bindAll(Bind&& bind);
  /// Binds the maps and programs of this build's pins.
  Status usePins(ProgramPins pins);

  PodCookieMethod cookieMethod_ = PodCookieMethod::None;
  std::string identity_;
  bool reused_ = false;
  int egressFd_ = -1;  // owned by the skeleton or pins_
  int ingressFd_ = -1;
  int loEgressFd_ = -1;
  int hostEgressFd_ = -1;
  int hostIngressFd_ = -1;
  std::optional<ProgramPins> pins_;
  struct pod_tc* skel_ = nullptr;
  struct pod_tc_compat* compat_ = nullptr;
  struct host_tc* host_ = nullptr;
};

/// Routes libbpf's own log into spdlog, one level lower than libbpf's
/// (libbpf warnings become spdlog debug... info, see implementation).
void routeLibbpfLogging();

}  // namespace sluice
