// Istio's node agent (istio-cni) on a test node, beyond its netfilter rules
// (istio_rules.h): its side of ZDS, serving ztunnel as it does, and its
// entry in the node's CNI chain; plus reading Istio's state inside a test
// netns. For the stories of a node going from Istio's node agent to sluice
// and back.
//
//   IstioZdsStandIn   a zds::Server at the node's ZDS socket, run in-process
//                     as istio-cni's ztunnel server: at start it removes
//                     whatever file is at the path (os.Remove, whoever serves
//                     it) and listens; each ztunnel that connects gets every
//                     pod it knows (AddWorkload with the pod's netns, then
//                     SnapshotSent); add() is its CNI ADD path.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/fd.h"
#include "base/result.h"
#include "istio/state.h"
#include "test/common/topology.h"
#include "userspace/agent/zds/server.h"

namespace sluice::test {

/// A pod as Istio's node agent holds it: its workload and its netns.
struct IstioPod {
  zds::WorkloadInfo workload;
  std::string netnsPath;  ///< opened at add() and kept, as istio-cni keeps it
};

class IstioZdsStandIn {
 public:
  /// Unlinks @p socketPath (as istio-cni does at start, whoever serves it),
  /// listens there and knows @p pods from the start (the snapshot of every
  /// ztunnel that connects names them).
  static Result<std::unique_ptr<IstioZdsStandIn>> start(const std::string& socketPath, const std::vector<IstioPod>& pods);
  /// stop().
  ~IstioZdsStandIn();
  IstioZdsStandIn(const IstioZdsStandIn&) = delete;
  IstioZdsStandIn& operator=(const IstioZdsStandIn&) = delete;

  /// A pod enrolled (istio-cni's CNI ADD): known from now on, and handed to
  /// the connected ztunnel (AddWorkload, acked). The server's error (EAGAIN:
  /// no ztunnel connected) after the pod was recorded.
  Status add(const IstioPod& pod);
  /// As the agent's pod exits: closes every ztunnel connection, unlinks its
  /// own socket (not one another agent put there since). Idempotent.
  void stop();
  /// The ztunnels connected (after their hello).
  std::vector<zds::Peer> peers() const;

 private:
  IstioZdsStandIn() = default;
  Status remember(const IstioPod& pod);
  std::vector<zds::SnapshotEntry> snapshot() const;

  mutable std::mutex mu_;
  std::vector<std::pair<zds::WorkloadInfo, Fd>> pods_;
  std::unique_ptr<zds::Server> server_;
};

// ---- The CNI chain --------------------------------------------------------------

/// Writes @p dir/@p file: a routed primary CNI's conflist (calico, portmap)
/// with istio-cni chained last, as Istio's install leaves it. Its path.
Result<std::string> writeIstioChainedConflist(const std::string& dir, const std::string& file = "10-calico.conflist");
/// What istio-cni's installer does to the primary conflist at its start:
/// drops its entry if present and appends it again.
Status chainIstioCni(const std::string& conflistPath);
/// The "type" of each plugin of a conflist, in order (empty when unreadable).
std::vector<std::string> pluginTypes(const std::string& conflistPath);

// ---- Reading Istio's state in a test netns --------------------------------------

/// istio::readPodRules() run inside @p ns.
Result<istio::PodRules> readIstioPodRules(const TestNetns& ns);
/// istio::readNodeState(@p cniConfDir) run inside @p node.
istio::NodeState readIstioNodeState(const TestNetns& node, const std::string& cniConfDir);

/// The return path Istio and sluice share, in @p ns: "" when the policy rule
/// `fwmark 0x111/0xfff lookup 100` (priority 32764) and table 100's local
/// default route are there for both families, else what is missing.
std::string sharedReturnPathMissing(const TestNetns& ns);

}  // namespace sluice::test
