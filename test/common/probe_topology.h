// Node-side topologies of the probe SNAT tests (spec rules 10 and 11): a
// "node" namespace with the pods' host-side veths wired like a routed CNI
// (Calico, Cilium) or a bridged one (the `bridge` CNI), and a "remote node"
// namespace routed through the node (kube-proxy / other-node traffic).
//
// Routed CNI (CniKind::Routed):
//
//   remote netns                node netns (ip_forward / forwarding = 1)            pod netns i
//   +-----------------+  veth   +--------------------------------------------+ veth  +------------------------------+
//   | eth0            |<------->| uplink 192.168.201.1/24 (+ .3)             |       |                              |
//   | 192.168.201.2   |         |        fd00:ff::1/64    (+ ::3 deprecated) |       |                              |
//   | fd00:ff::2      |         | vethr<i> (no address, proxy_arp=1)         |<----->| eth0 10.201.0.<10+i>/32      |
//   | default via     |         | route 10.201.0.<10+i>/32  dev vethr<i>     |       |      fd00:201::<10+i>/128    |
//   |   the uplink    |         | route fd00:201::<10+i>/128 dev vethr<i>    |       | default via 169.254.1.1      |
//   +-----------------+         +--------------------------------------------+       |   dev eth0 onlink            |
//                                                                                    | default via fe80::1 dev eth0 |
//                                                                                    | (both neighbours: vethr<i>'s |
//                                                                                    |  MAC, permanent)             |
//                                                                                    +------------------------------+
// Bridged CNI (CniKind::Bridged):
//
//   remote netns                node netns (ip_forward / forwarding = 1)            pod netns i
//   +-----------------+  veth   +--------------------------------------------+ veth  +----------------------------+
//   | eth0            |<------->| uplink 192.168.201.1/24 (+ .3)             |       |                            |
//   | 192.168.201.2   |         |        fd00:ff::1/64    (+ ::3 deprecated) |       | eth0 10.202.0.<10+i>/24    |
//   | fd00:ff::2      |         | cni0 (bridge) 10.202.0.1/24 fd00:202::1/64 |       |      fd00:202::<10+i>/64   |
//   +-----------------+         |   `-- port vethb<i> (no address) ----------|<----->| default via 10.202.0.1 /   |
//                               +--------------------------------------------+       |             fd00:202::1    |
//                                                                                    +----------------------------+
//
// Every neighbour entry either side needs is permanent (and the bridge has a
// static FDB entry per pod), so nothing depends on ARP / ND timing. The node's
// own address is the uplink's (192.168.201.1 / fd00:ff::1); the second one
// (.3 / ::3) exists for the "two probers, same port" case. Every namespace is a
// TestNetns ("sluice-node-<pid>-<n>" for the node and the remote node,
// "sluice-pod-<pid>-<n>" for pods): unique names, removed by the destructors,
// swept by cleanupStaleTestState() after a crash. Nothing touches the
// machine's own network namespace.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "test/common/topology.h"

namespace sluice::test {

enum class CniKind { Routed, Bridged };

inline const char* cniName(CniKind k) { return k == CniKind::Routed ? "routed" : "bridged"; }

/// One pod of a ProbeTopology.
struct ProbePod {
  std::unique_ptr<TestNetns> ns;
  int index = 0;
  std::string hostIface;  ///< node-side veth ("vethr<i>" / "vethb<i>")
  std::string hostMac;
  std::string podMac;
  std::string v4;  ///< the pod's addresses (eth0)
  std::string v6;

  const std::string& ip(int family) const { return family == AF_INET ? v4 : v6; }
};

class ProbeTopology {
 public:
  static constexpr const char* kNodeV4 = "192.168.201.1";
  static constexpr const char* kNodeV6 = "fd00:ff::1";
  static constexpr const char* kNode2V4 = "192.168.201.3";
  static constexpr const char* kNode2V6 = "fd00:ff::3";
  static constexpr const char* kRemoteV4 = "192.168.201.2";
  static constexpr const char* kRemoteV6 = "fd00:ff::2";
  static constexpr const char* kBridgeV4 = "10.202.0.1";
  static constexpr const char* kBridgeV6 = "fd00:202::1";
  static constexpr const char* kProbeV4 = "169.254.7.127";
  static constexpr const char* kProbeV6 = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff";

  /// Builds the node and the remote node (no pods yet); see ok().
  explicit ProbeTopology(CniKind kind);
  ~ProbeTopology() = default;
  ProbeTopology(const ProbeTopology&) = delete;
  ProbeTopology& operator=(const ProbeTopology&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  CniKind kind() const { return kind_; }

  TestNetns& node() { return node_; }
  TestNetns& remote() { return remote_; }

  /// Adds pod number pods().size() wired as kind() says.
  Result<ProbePod*> addPod();
  std::vector<std::unique_ptr<ProbePod>>& pods() { return pods_; }

  /// Transmit checksum offload off on both ends of @p pod's veth (on by
  /// default): every packet then carries a complete checksum, which the
  /// receiver verifies in software, so a wrong fix-up by the node programs
  /// (for the node's CHECKSUM_PARTIAL skbs or the pod's complete ones)
  /// breaks the connection instead of going unnoticed.
  Status txChecksumOff(const ProbePod& pod);

  static std::string nodeAddr(int family) { return family == AF_INET ? kNodeV4 : kNodeV6; }
  static std::string node2Addr(int family) { return family == AF_INET ? kNode2V4 : kNode2V6; }
  static std::string remoteAddr(int family) { return family == AF_INET ? kRemoteV4 : kRemoteV6; }
  static std::string probeAddr(int family) { return family == AF_INET ? kProbeV4 : kProbeV6; }

 private:
  Status build();

  CniKind kind_;
  TestNetns node_{"node"};
  TestNetns remote_{"node"};  // a node too: the "other node" behind the uplink
  std::vector<std::unique_ptr<ProbePod>> pods_;
  std::string error_;
};

}  // namespace sluice::test
