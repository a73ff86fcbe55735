// The loaded BPF objects: programs and maps of bpf/pod_tc.bpf.c (TC mode),
// bpf/pod_sock.bpf.c (socket mode) and bpf/host_tc.bpf.c (node side), with
// the maps pinned under the bpffs root (reused when already pinned).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "loader/bpf_map.h"
#include "loader/features.h"
#include "loader/program_pins.h"
#include "base/result.h"
#include "loader/sk_lookup_stubs.h"
#include "maps/sluice_maps.h"

struct pod_tc;   // generated skeletons
struct pod_tc_compat;
struct pod_sock;
struct pod_sock_compat;
struct host_tc;

namespace sluice {

/// The socket mode's programs (bpf/pod_sock.bpf.c), as fds the skeleton owns.
struct SocketPrograms {
  int connect4 = -1, connect6 = -1;
  int sendmsg4 = -1, sendmsg6 = -1;
  int recvmsg4 = -1, recvmsg6 = -1;
  int getpeername4 = -1, getpeername6 = -1;
  int getsockopt = -1;
  int sockops = -1;
  int skbIngress = -1, skbEgress = -1;
  int skLookup = -1;  ///< the shared program the pods' own sk_lookup programs tail-call
  int sockCreate = -1;
};

/// Owns the skeletons of the pod programs (bpf/pod_tc.bpf.c), the socket
/// programs (bpf/pod_sock.bpf.c) and the node programs (bpf/host_tc.bpf.c):
/// programs loaded into the kernel, maps created or reused from pins under
/// the bpffs root, so the objects share them. Typed maps, never names as
/// strings.
class PodPrograms {
 public:
  /// Opens and loads the programs; maps are pinned by name under `root`
  /// (which must exist on bpffs). Call with the StateLock held. The kernel
  /// features are probed first (kernelFeatures()): a kernel below the
  /// minimum gets an error naming what it lacks, and the pod programs are
  /// the variant of the report's pod-cookie method. Pins of older layouts
  /// are migrated (loader/migrate.h); a layout this build cannot read is
  /// an error and leaves the pins as they are. A kernel that refuses the
  /// socket programs is no error: socketLoaded() is false, socketError()
  /// says why, and only the TC mode is available.
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

  /// Whether the socket mode's programs are loaded.
  bool socketLoaded() const { return socketLoaded_; }
  /// Why they are not ("" when they are).
  const std::string& socketError() const { return socketError_; }
  const SocketPrograms& socketPrograms() const { return socketProgs_; }

  /// A pod's own sk_lookup program naming @p netnsCookie
  /// (loader/sk_lookup_stubs.h): one loaded ahead when keepSkLookupStubs
  /// was called and one is ready, else one loaded now.
  Result<Fd> skLookupStub(uint64_t netnsCookie) const;
  /// Keeps @p depth stubs loaded ahead by a background thread, from now on
  /// (a long-running process that enrolls pods; a one-shot one loads the
  /// stub it needs). Needs socketLoaded(); calling it again changes nothing.
  Status keepSkLookupStubs(size_t depth);
  /// The pool of keepSkLookupStubs (nullptr without one).
  const SkLookupStubPool* skLookupStubPool() const { return stubs_.get(); }

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
  // Socket mode (bound when socketLoaded()).
  BpfMap<__u64, sluice_pod_sock> podSock;
  BpfMap<sluice_sock_listener_key, __u64> sockListeners;  ///< SOCKHASH: values are sockets
  BpfMap<sluice_orig_key, sluice_sock_orig> origDst;
  BpfMap<__u32, sluice_lookup_pod> skLookupPod;  ///< per-CPU
  BpfMap<__u32, __u32> skLookupProg;             ///< program array: values are program fds

 private:
  PodPrograms() = default;
  /// Loads the opened pod object (either variant) and binds its maps.
  template <typename Skel>
  Status loadPod(Skel* skel, int (*loadFn)(Skel*));
  /// Loads the opened socket object (either variant) and binds its maps;
  /// an error only records why the socket mode is unavailable.
  template <typename Skel>
  Status loadSocket(Skel* skel, int (*loadFn)(Skel*));

  /// Calls bind(member, pin name) for every typed map above but the
  /// socket mode's.
  template <typename Bind>
  Status bindAll(Bind&& bind);
  /// The same for the socket mode's maps.
  template <typename Bind>
  Status bindSocketMaps(Bind&& bind);
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
  struct pod_sock* sock_ = nullptr;
  struct pod_sock_compat* sockCompat_ = nullptr;
  struct host_tc* host_ = nullptr;
  SocketPrograms socketProgs_;  // owned by a socket skeleton or pins_
  std::unique_ptr<SkLookupStubPool> stubs_;  // its own copies of the two map fds
  bool socketLoaded_ = false;
  std::string socketError_;
};

/// Routes libbpf's own log into spdlog, one level lower than libbpf's
/// (libbpf warnings become spdlog debug... info, see implementation).
void routeLibbpfLogging();

}  // namespace sluice
