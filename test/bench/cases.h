// The benchmark cases: identical pod topologies (test/common/topology.h's
// node + pod joined by a veth) that differ only in the redirection.
//
//   node netns                               pod netns
//   10.200.0.1 (vethpod) <──── veth ────>    10.200.0.2 (eth0), default via .1
//   fd00:200::1                               fd00:200::2, default via fd00:200::1
//   10.201.0.0/24 via 10.200.0.2              local 10.201.0.0/24 dev lo (any-IP)
//   fd00:201::/64 via fd00:200::2             local fd00:201::/64 dev lo
//                                             sink: [::]:15001 [::]:15006 127.0.0.1:15053
//
//   case             redirection                        client dials             sink reads
//   floor            none                               the proxy ports          getsockname
//   iptables         Istio's rules, iptables-restore    10.96.0.K:80 (out)       SO_ORIGINAL_DST
//                    (nf_tables) + policy route         10.201.0.K:8080 (in)
//   iptables-legacy  same, iptables-legacy-restore      same                     SO_ORIGINAL_DST
//   sluice-tcx       Datapath, tcx links                same                     getsockname
//   sluice-legacy    Datapath, clsact + cls_bpf         same                     getsockname
//   sluice-socket    Datapath, captured at the socket   same                     SO_ORIGINAL_DST, else
//                    (cgroup hooks at the bench's own                            getsockname (ztunnel's
//                    cgroup, sk_lookup in the pod)                               order)
//   tc-minimal       sluice-tcx's enrollment with       same (no DNS)            getsockname
//                    minimal_tc.bpf.c's programs swapped
//                    into its links: the mechanism alone
//   X+xdp            case X (floor, sluice-tcx,         as X                     as X
//                    sluice-socket) with xdp_pass.bpf.c's
//                    XDP_PASS attached in native mode to
//                    both ends of the veth (eth0, vethpod)
//   X+xdp-frags      the same with the frags-aware
//                    program (BPF_F_XDP_HAS_FRAGS)
//
// Outbound clients run in the pod, inbound ones in the node; DNS clients in
// the pod query 10.96.0.10:53 (floor: 127.0.0.1:15053 directly). The IPv6
// workloads (conn_out6, conn_in6) dial [fd00:96::K]:80 and [fd00:201::K]:8080
// (floor: [fd00:201::K]:15001 / :15006).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "enroll/datapath.h"
#include "base/fd.h"
#include "test/bench/iptables.h"
#include "test/bench/load.h"
#include "test/bench/sink.h"
#include "test/common/topology.h"

struct minimal_tc;  // minimal_tc.skel.h (tc-minimal's programs)
struct xdp_pass;    // xdp_pass.skel.h (the +xdp cases' programs)

namespace sluice::bench {

enum class CaseKind {
  Floor,
  Iptables,
  IptablesLegacy,
  SluiceTcx,
  SluiceLegacy,
  TcMinimal,
  SluiceSocket,
  // A case above with an XDP program on the pod's veth (issue 16, item 5).
  FloorXdp,
  FloorXdpFrags,
  SluiceTcxXdp,
  SluiceTcxXdpFrags,
  SluiceSocketXdp,
  SluiceSocketXdpFrags,
};
/// The cases a run has by default.
inline constexpr CaseKind kAllCases[] = {CaseKind::Floor,        CaseKind::Iptables,  CaseKind::IptablesLegacy,
                                         CaseKind::SluiceSocket, CaseKind::SluiceTcx, CaseKind::SluiceLegacy,
                                         CaseKind::TcMinimal};
/// The XDP variants, run only when --cases names them.
inline constexpr CaseKind kXdpCases[] = {CaseKind::FloorXdp,          CaseKind::FloorXdpFrags,
                                         CaseKind::SluiceTcxXdp,      CaseKind::SluiceTcxXdpFrags,
                                         CaseKind::SluiceSocketXdp,   CaseKind::SluiceSocketXdpFrags};

/// Which XDP program a case attaches to both ends of the pod's veth.
enum class XdpVariant { None, Pass, PassFrags };
XdpVariant xdpVariant(CaseKind k);
/// The case without its XDP program (itself for the others).
CaseKind baseCase(CaseKind k);

const char* caseName(CaseKind k);
std::optional<CaseKind> parseCase(const std::string& s);
inline bool isSluice(CaseKind k) {
  k = baseCase(k);
  return k == CaseKind::SluiceTcx || k == CaseKind::SluiceLegacy || k == CaseKind::SluiceSocket;
}
/// sluice captured at TC (its programs run per packet).
inline bool isSluiceTc(CaseKind k) {
  k = baseCase(k);
  return k == CaseKind::SluiceTcx || k == CaseKind::SluiceLegacy;
}
inline bool isIptables(CaseKind k) { return k == CaseKind::Iptables || k == CaseKind::IptablesLegacy; }
/// Cases whose sink sees the original destination as its local address.
inline bool isTproxyStyle(CaseKind k) { return isSluiceTc(k) || k == CaseKind::TcMinimal; }

/// Where the socket mode's node hooks attach in this run: the bench's own
/// cgroup (main.cpp's CgroupScope), so they see no other process's sockets.
/// Empty: the cgroup v2 root.
void setSocketHookCgroup(const std::string& path);
const std::string& socketHookCgroup();
/// The workloads whose clients dial IPv6 destinations.
inline bool isIpv6Workload(const std::string& w) { return w == "conn_out6" || w == "conn_in6"; }
/// tc-minimal redirects IPv4 TCP only: it has no DNS or IPv6 figure.
bool caseRuns(CaseKind k, const std::string& workload);

/// tc-minimal's empty program on lo egress, as programs() names it.
inline constexpr const char* kEmptyProgramName = "empty (lo egress)";

/// A BPF program of a case, for its run-time statistics.
struct CaseProgram {
  std::string name;
  int fd = -1;
};

inline constexpr const char* kDnsAnswer = "10.96.0.99";

class CaseEnv {
 public:
  /// Builds the topology, installs the case's redirection and starts the
  /// sink (pinned to @p sinkCpu). @p rules is needed by the iptables cases.
  static Result<std::unique_ptr<CaseEnv>> create(CaseKind kind, const IstioRules* rules, int sinkCpu);
  /// Sink first, then the pod's enrollment, the namespaces, the bpffs root.
  ~CaseEnv();
  CaseEnv(const CaseEnv&) = delete;
  CaseEnv& operator=(const CaseEnv&) = delete;

  CaseKind kind() const { return kind_; }
  const char* name() const { return caseName(kind_); }
  Sink& sink() { return *sink_; }
  int podFd() const { return podFd_.get(); }
  int nodeFd() const { return nodeFd_.get(); }
  sluice::test::PodTopology& topo() { return *topo_; }
  Datapath* datapath() { return dp_.get(); }

  /// Where the clients dial, in @p family (AF_INET / AF_INET6).
  DstFn outboundDst(int family = AF_INET) const;
  DstFn inboundDst(int family = AF_INET) const;
  sockaddr_in resolver() const;

  /// The pod's sluice counters (zero for the other cases).
  sluice_pod_stats podStats();

  /// The BPF programs on the pod's hooks (none for floor and iptables).
  std::vector<CaseProgram> programs();

  /// The +xdp cases: what is attached where, in which mode ("" otherwise).
  const std::string& xdpNote() const { return xdpNote_; }

  /// One outbound and one inbound connection and one DNS query, each checked
  /// in detail (original destination, how the sink got it, who the peer
  /// is, sluice's counters), plus controls for the floor. Returns the
  /// failures; @p notes gets what was seen.
  std::vector<std::string> probe(std::vector<std::string>& notes);

 private:
  explicit CaseEnv(CaseKind k) : kind_(k) {}
  Status swapInMinimal();
  Status attachXdp();

  CaseKind kind_;
  std::unique_ptr<sluice::test::TestBpffs> bpffs_;
  std::unique_ptr<sluice::test::PodTopology> topo_;
  Fd podFd_, nodeFd_;
  std::unique_ptr<Datapath> dp_;
  std::string podId_;
  bool enrolled_ = false;
  std::unique_ptr<Sink> sink_;
  std::shared_ptr<::minimal_tc> minimal_;
  Fd empty_;
  Fd lookup_;  ///< sluice-socket: the pod's sk_lookup program
  std::shared_ptr<::xdp_pass> xdp_;
  std::vector<Fd> xdpLinks_;  ///< +xdp: bpf_links on eth0 and vethpod (closing detaches)
  int xdpProgFd_ = -1;  ///< +xdp: the attached program (owned by xdp_)
  std::string xdpNote_;
};

}  // namespace sluice::bench
