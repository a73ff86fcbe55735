#include "test/bench/kube.h"

#include <signal.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <set>
#include <thread>

#include "test/bench/enroll.h"
#include "test/bench/util.h"
#include "test/common/agent_process.h"
#include "test/common/apiserver.h"
#include "test/common/cgroup_pod.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"
#include "test/standin/node_proxy.h"

namespace sluice::bench {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

/// VmRSS / VmHWM of @p pid, KiB.
long procStatusKb(pid_t pid, const std::string& key) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) return std::strtol(line.c_str() + key.size() + 1, nullptr, 10);
  return 0;
}

double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

KubeScaleResult runKubeScaleBench(int pods) {
  using nlohmann::json;
  KubeScaleResult res;
  res.pods = pods;
  auto fail = [&](const std::string& e) {
    res.fail(e);
    return res;
  };
  sluice::test::TestCgroupRoot cgroups;
  if (cgroups.unavailable()) {
    res.skipped = cgroups.error();
    return res;
  }
  if (!cgroups.ok()) return fail("cgroups: " + cgroups.error());
  auto farm = PodFarm::create(pods);
  if (!farm.ok()) return fail(farm.error().message);
  auto server = sluice::test::TestApiServer::start();
  if (!server.ok()) return fail(server.error().message);
  auto& api = **server;
  if (!api.createNamespace("bench").ok()) return fail("create the namespace");
  if (Status st = api.createNodeAgentPod(); !st.ok()) return fail(st.error().message);

  // The running pods: a process each in pod<uid>'s cgroup, in its netns.
  std::vector<std::unique_ptr<sluice::test::TestPodProcess>> procs;
  json ops = json::array();
  for (int i = 0; i < pods; i++) {
    std::string uid = sluice::test::randomPodUid();
    auto p = sluice::test::TestPodProcess::start(
        cgroups, {.uid = uid,
                  .driver = i % 2 ? sluice::test::CgroupDriver::Systemd : sluice::test::CgroupDriver::Cgroupfs,
                  .joinNetns = (*farm)->path(i)});
    if (!p.ok()) return fail(p.error().message);
    procs.push_back(std::move(*p));
    sluice::test::TestPod tp;
    tp.namespaceName = "bench";
    tp.name = "pod-" + std::to_string(i);
    tp.uid = uid;
    tp.node = "node-a";
    tp.ips = {PodFarm::address(i)};
    ops.push_back({{"op", "create"}, {"kind", "pods"}, {"object", sluice::test::podObject(tp)}});
  }
  if (auto r = api.apply(ops); !r.ok()) return fail("create the pods: " + r.error().message);

  sluice::test::TestBpffs bpffs;
  TempDir tmp;
  std::string zds = tmp.path() + "/zds.sock";
  // In the machine's netns (the API server listens on its loopback): the
  // pods' host-side veths are in the farm's node netns, so no probe SNAT.
  auto agent = sluice::test::AgentProcess::start(
      bpffs.root(),
      {"--kube-api", api.url(), "--kube-token-file", api.tokenFile(), "--kube-ca-file", api.caFile(), "--node-name",
       "node-a", "--ztunnel-socket", zds, "--log-level", "error"},
      tmp.path() + "/agent.sock");
  if (!agent.ok()) return fail(agent.error().message);
  auto proxy = NodeProxyStandIn::start(sluice::test::testNodeProxyConfig(zds));
  if (!proxy.ok() || !(*proxy)->waitForEvent("snapshot", "", 10s))
    return fail(proxy.ok() ? "the node proxy stand-in got no snapshot" : proxy.error().message);
  auto client = (*agent)->client();
  if (!client.ok()) return fail(client.error().message);
  bool synced = false;
  for (auto t = Clock::now(); !synced && Clock::now() - t < 30s; std::this_thread::sleep_for(20ms))
    if (auto h = client->health(); h.ok()) synced = h->kubeSynced;
  if (!synced) return fail("the agent did not sync with the API server");
  std::this_thread::sleep_for(500ms);
  res.agentRssIdleKb = procStatusKb((*agent)->pid(), "VmRSS");

  auto acked = [&]() -> size_t {
    auto l = client->listPods();
    if (!l.ok()) return 0;
    size_t n = 0;
    for (const auto& p : *l) n += p.handoff == HandoffState::Acked;
    return n;
  };
  const double labelledAt = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto t0 = Clock::now();
  if (!api.setNamespaceLabels("bench", {{"istio.io/dataplane-mode", "ambient"}}).ok()) return fail("label the namespace");
  size_t n = 0;
  while ((n = acked()) < static_cast<size_t>(pods) && Clock::now() - t0 < 120s) std::this_thread::sleep_for(10ms);
  if (n == static_cast<size_t>(pods)) res.enrolledMs = msSince(t0);
  res.checks.push_back(std::to_string(n) + " pods enrolled with the hand-off acked, " +
                       std::to_string((*proxy)->runningPods().size()) + " proxied by the stand-in");
  res.agentRssKb = procStatusKb((*agent)->pid(), "VmRSS");

  std::set<std::string> annotated;
  double lastPatch = 0;
  for (auto t = Clock::now(); Clock::now() - t < 60s; std::this_thread::sleep_for(50ms)) {
    auto p = api.patches();
    if (!p.ok()) continue;
    annotated.clear();
    for (const auto& e : *p) {
      std::string v = e["patch"].dump();
      if (e.value("namespace", "") == "bench" && v.find("\"enabled\"") != std::string::npos) {
        annotated.insert(e.value("name", ""));
        lastPatch = std::max(lastPatch, e.value("time", 0.0));
      }
    }
    if (annotated.size() == static_cast<size_t>(pods)) break;
  }
  if (annotated.size() == static_cast<size_t>(pods)) res.annotatedMs = (lastPatch - labelledAt) * 1000;
  res.checks.push_back(std::to_string(annotated.size()) + " pods annotated ambient.istio.io/redirection=enabled");

  auto t1 = Clock::now();
  if (!api.setNamespaceLabels("bench", {}).ok()) return fail("unlabel the namespace");
  size_t left = 0;
  for (;;) {
    auto l = client->listPods();
    left = l.ok() ? l->size() : static_cast<size_t>(pods);
    if (left == 0 || Clock::now() - t1 > 120s) break;
    std::this_thread::sleep_for(10ms);
  }
  if (left == 0) res.removedMs = msSince(t1);
  res.checks.push_back("after the label was removed: " + std::to_string(left) + " pods enrolled");
  res.agentHwmKb = procStatusKb((*agent)->pid(), "VmHWM");
  res.verified = n == static_cast<size_t>(pods) && annotated.size() == static_cast<size_t>(pods) && left == 0;
  (*proxy)->stop();
  (*agent)->stop(SIGTERM);
  return res;
}

}  // namespace sluice::bench
