// Kubernetes at node scale: how long sluiced takes to enroll every running
// pod of a namespace labelled ambient at once, and its memory.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "test/bench/enroll.h"

namespace sluice::bench {

/// N running pods (each a process in a cgroup named as kubelet names it,
/// living in a PodFarm pod netns with eth0 and its address) in one
/// namespace of the test API server; sluiced --kube-api --ztunnel-socket in
/// the machine's netns with the node proxy stand-in connected. The
/// namespace is labelled istio.io/dataplane-mode=ambient in one write; timed
/// from that write to the last pod in the agent's registry with its
/// hand-off acked (the registry polled every 10 ms), and to the last
/// ambient.istio.io/redirection status patch the API server received.
struct KubeScaleResult : Failures {
  int pods = 0;
  double enrolledMs = NAN;   ///< label -> every pod enrolled and acked
  double annotatedMs = NAN;  ///< label -> every pod's "enabled" patch received
  double removedMs = NAN;    ///< label removed -> every pod out of the registry
  long agentRssIdleKb = 0;   ///< the agent synced, nothing enrolled
  long agentRssKb = 0;       ///< all pods enrolled
  long agentHwmKb = 0;       ///< its peak (VmHWM) over the run
  std::string skipped;  ///< why the phase did not run (no cgroup v2 mounted)
  std::vector<std::string> checks;
  bool verified = false;
};
KubeScaleResult runKubeScaleBench(int pods);

}  // namespace sluice::bench
