// The story of a live node run by Istio's node agent (istio-cni) that
// sluice takes over, with traffic running, and later hands back; with real
// parts: Istio's own netfilter rules (test/bench/istio) in ten pods and on
// the node, its ZDS server (in-process, as istio-cni serves ztunnel), a
// ztunnel stand-in holding every pod's listeners, the test Kubernetes API
// server, and sluiced in the node netns.
//
//   test's netns                     node netns (sluiced --kube-api …)         pod netns × 10
//   TestApiServer 127.0.0.1:P ◀─ TcpRelay ── 127.0.0.1:P                        eth0 10.201.0.1x
//   IstioZdsStandIn ┐                ISTIO_POSTRT, istio-inpod-probes-v4/v6 ──▶  fd00:201::1x
//   NodeProxyStandIn┴─ ZDS (TMP/zds.sock)       vethr<i> ◀──────────────────▶   ISTIO_* chains,
//     listeners 15001/15006/15008/15053 in every pod                            table 100; app
//                                      uplink ◀──▶ remote netns                 :8080, health :8081,
//                                                  192.168.201.2 / fd00:ff::2   a process in a
//                                                  TCP echo, DNS "resolver" :53 kubelet cgroup
//
// Traffic runs through every phase, one loop per kind, round the pods:
// pod → remote (TCP, both families), remote → pod app (both), pod → remote
// :53 (DNS: the proxy must answer; the resolver's echo is a bypass; a query
// with no answer is sent again once, as a resolver does, and counted as
// answered on the retry — in tc mode a datagram in flight while a pod's
// rules switch is sometimes lost; two losses are a failure), and
// kubelet's probes from the node to each pod's health port, which must
// arrive from the probe address. What the servers accepted is compared
// with what the node proxy relayed: a connection that reached a server
// without the proxy is a bypass.
//
// Istio's rules work here unchanged (phase 1): the node's probe is its own
// socket, so ISTIO_POSTRT's --socket-exists SNAT applies, and forwarded
// traffic from the remote netns is never SNATed; queries leave by eth0, so
// the DNS rule's `! -o lo` matches; the proxy's inbound upstream (marked
// 0x539, from the client's address over lo) gets connmark 0x111 and the
// app's replies come back through table 100. Probes use their own port
// (8081), so each probe's peer is known exactly.
//
// Phases: (1) Istio alone; (2) sluiced --istio-takeover enrolls every pod
// Istio enrolled, removes Istio's in-pod rules, serves ZDS once Istio's
// agent exits, then removes Istio's node state; (3) Istio comes back
// (rules, node state, istio-cni, its ZDS server), sluiced stops and is
// started again with --istio-hand-back, which removes only its own
// redirection.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "test/common/agent_process.h"
#include "test/common/apiserver.h"
#include "test/common/cgroup_pod.h"
#include "test/common/istio_node.h"
#include "test/common/istio_rules.h"
#include "test/common/probe_topology.h"
#include "test/common/tcp_relay.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"
#include "test/standin/node_proxy.h"

namespace sluice::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr int kPods = 10;
constexpr uint16_t kAppPort = 8080;     ///< the pods' app: inbound traffic only
constexpr uint16_t kHealthPort = 8081;  ///< the pods' health endpoint: kubelet's probes only
constexpr const char* kRedirection = "ambient.istio.io/redirection";
/// Between two attempts of one loop: ten pods, seven loops, ~280 attempts a
/// second in all, little for the machine (and the 6.1 guest).
constexpr auto kLoopInterval = 25ms;
constexpr auto kAttemptTimeout = 3s;
/// How long traffic runs at the end of each phase.
constexpr auto kSoak = 2s;

int familyIndex(int family) { return family == AF_INET ? 0 : 1; }

/// One pod of the node: its network, a process of it in a kubelet-named
/// cgroup (so sluiced's netns finder finds it by uid), its app and health
/// servers (v4, v6).
struct NodePod {
  ProbePod* net = nullptr;  ///< owned by the ProbeTopology
  std::string name;
  std::string uid;
  std::unique_ptr<TestPodProcess> process;
  std::array<std::unique_ptr<TcpServer>, 2> app;
  std::array<std::unique_ptr<TcpServer>, 2> health;

  const TestNetns& ns() const { return *net->ns; }
  IstioPod istio() const { return {{uid, name, "shop", "web"}, net->ns->path()}; }
};

// ---- Traffic ---------------------------------------------------------------------

enum class Kind { OutboundV4, OutboundV6, InboundV4, InboundV6, Dns, ProbeV4, ProbeV6 };
constexpr std::array kKinds{Kind::OutboundV4, Kind::OutboundV6, Kind::InboundV4, Kind::InboundV6,
                            Kind::Dns,        Kind::ProbeV4,    Kind::ProbeV6};

const char* kindName(Kind k) {
  switch (k) {
    case Kind::OutboundV4: return "outbound-v4";
    case Kind::OutboundV6: return "outbound-v6";
    case Kind::InboundV4: return "inbound-v4";
    case Kind::InboundV6: return "inbound-v6";
    case Kind::Dns: return "dns";
    case Kind::ProbeV4: return "probe-v4";
    case Kind::ProbeV6: return "probe-v6";
  }
  return "?";
}

/// What one loop saw so far (monotonic: zero failures at a phase's end
/// means zero since the start).
struct Tally {
  uint64_t attempts = 0, ok = 0, failed = 0;
  /// DNS answered by the resolver itself: the query went past the proxy.
  uint64_t bypassed = 0;
  /// DNS answered by the proxy on the resolver's retry (a lost datagram).
  uint64_t retried = 0;
  std::vector<std::string> firstFailures;  ///< the first few, with phase, time and pod
};

/// The node's traffic: one thread per kind, each going round the pods, one
/// attempt every kLoopInterval, until stopped.
class NodeTraffic {
 public:
  NodeTraffic(const std::vector<std::unique_ptr<NodePod>>& pods, const TestNetns& node, const TestNetns& remote,
              const std::array<std::unique_ptr<TcpServer>, 2>& targets)
      : pods_(pods), node_(node), remote_(remote), targets_(targets) {}
  ~NodeTraffic() { stop(); }
  NodeTraffic(const NodeTraffic&) = delete;
  NodeTraffic& operator=(const NodeTraffic&) = delete;

  void start() {
    started_ = std::chrono::steady_clock::now();
    for (Kind k : kKinds) threads_.emplace_back([this, k] { loop(k); });
  }
  /// Joins every loop (idempotent).
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  /// Returns once every loop is between two attempts (none in flight).
  void pause() {
    std::unique_lock lock(mu_);
    paused_ = true;
    cv_.wait(lock, [&] { return parked_ == threads_.size(); });
  }
  void resume() {
    {
      std::lock_guard lock(mu_);
      paused_ = false;
    }
    cv_.notify_all();
  }
  /// Failures recorded from now on are labelled @p name.
  void phase(const std::string& name) {
    std::lock_guard lock(mu_);
    phase_ = name;
    std::cout << "[ traffic " << sinceStart() << " ms ] phase: " << name << std::endl;
  }
  /// Logs a step of the story on the failures' clock (to read them against).
  void note(const std::string& what) const {
    std::cout << "[ traffic " << sinceStart() << " ms ] " << what << std::endl;
  }
  std::map<Kind, Tally> tallies() const {
    std::lock_guard lock(mu_);
    return tallies_;
  }
  /// One line per kind: "dns: 80 attempts, 80 ok, 0 failed, 0 bypassed".
  std::string describe() const {
    std::ostringstream out;
    for (const auto& [k, t] : tallies())
      out << "  " << kindName(k) << ": " << t.attempts << " attempts, " << t.ok << " ok, " << t.failed << " failed, "
          << t.bypassed << " bypassed" << (t.retried ? ", " + std::to_string(t.retried) + " answered on the retry" : "")
          << "\n";
    return out.str();
  }

 private:
  struct Outcome {
    enum What { Ok, Failed, Bypassed, Retried } what = Ok;
    std::string detail;
  };
  static Outcome failed(std::string d) { return {Outcome::Failed, std::move(d)}; }

  void loop(Kind k) {
    for (uint64_t n = 0;; n++) {
      {
        std::unique_lock lock(mu_);
        if (paused_) {
          parked_++;
          cv_.notify_all();
          cv_.wait(lock, [&] { return !paused_ || stopping_; });
          parked_--;
        }
        if (stopping_) return;
      }
      const NodePod& pod = *pods_[n % pods_.size()];
      const auto began = std::chrono::steady_clock::now();
      record(k, pod, began, once(k, pod, n));
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, kLoopInterval, [&] { return stopping_; })) return;
    }
  }

  Outcome once(Kind k, const NodePod& pod, uint64_t n) {
    switch (k) {
      case Kind::OutboundV4: return outbound(pod, AF_INET);
      case Kind::OutboundV6: return outbound(pod, AF_INET6);
      case Kind::InboundV4: return inbound(pod, AF_INET);
      case Kind::InboundV6: return inbound(pod, AF_INET6);
      case Kind::Dns: return dns(pod, n);
      case Kind::ProbeV4: return probe(pod, AF_INET);
      case Kind::ProbeV6: return probe(pod, AF_INET6);
    }
    return failed("unknown kind");
  }

  /// The pod's app to a server behind the node, one echo.
  Outcome outbound(const NodePod& pod, int family) {
    Status st = connectAndEcho(pod.ns(), targets_[familyIndex(family)]->local(), kAttemptTimeout);
    return st.ok() ? Outcome{} : failed(st.error().message);
  }

  /// A client behind the node to the pod's app, one echo.
  Outcome inbound(const NodePod& pod, int family) {
    Status st = connectAndEcho(remote_, Endpoint::of(pod.net->ip(family), kAppPort), kAttemptTimeout);
    return st.ok() ? Outcome{} : failed(st.error().message);
  }

  /// A query to the node's resolver (IPv4 and IPv6 on each pod's turns in
  /// turn): answered by the proxy, or it went past it.
  Outcome dns(const NodePod& pod, uint64_t n) {
    const int family = (n / pods_.size()) % 2 ? AF_INET6 : AF_INET;
    const auto id = static_cast<uint16_t>(n);
    const std::string q = dnsQuery(id, "shop.example.com", family == AF_INET ? 1 : 28);
    const std::string fam = familyName(family);
    auto reply = udpExchange(pod.ns(), Endpoint::of(ProbeTopology::remoteAddr(family), 53), q, true, kAttemptTimeout);
    bool retried = false;
    if (!reply.ok()) {
      // A resolver sends a lost query again (glibc: attempts:2): a datagram
      // lost once is not a failed lookup, twice is. Counted apart.
      retried = true;
      reply = udpExchange(pod.ns(), Endpoint::of(ProbeTopology::remoteAddr(family), 53), q, true, kAttemptTimeout);
    }
    if (!reply.ok()) return failed(fam + ": " + reply.error().message + " (twice)");
    if (reply->payload == q) return {Outcome::Bypassed, fam + ": the resolver echoed the query (it went past the proxy)"};
    auto answer = parseDnsAnswer(reply->payload);
    const std::string want = family == AF_INET ? "10.96.0.99" : "fd00::99";
    if (!answer || !answer->response || answer->id != id) return failed(fam + ": not an answer to the query");
    if (std::find(answer->addresses.begin(), answer->addresses.end(), want) == answer->addresses.end())
      return failed(fam + ": an answer without the proxy's " + want);
    if (retried) return {Outcome::Retried, fam + ": the first query got no answer; the retry did"};
    return {};
  }

  /// kubelet's probe: from the node to the pod's health port, one echo; the
  /// app must see it from the probe address. Only this loop connects to
  /// that family's health servers, so their last peer is this connection.
  Outcome probe(const NodePod& pod, int family) {
    auto c = tcpConnect(node_, Endpoint::of(pod.net->ip(family), kHealthPort), ConnectOptions{kAttemptTimeout});
    if (!c.ok()) return failed(c.error().message);
    auto echo = echoRoundTrip(c->get(), "probe", kAttemptTimeout);
    if (!echo.ok()) return failed("echo: " + echo.error().message);
    if (*echo != "probe") return failed("echo returned '" + *echo + "'");
    auto peers = pod.health[familyIndex(family)]->peers();
    const std::string want = ProbeTopology::probeAddr(family);
    if (peers.empty() || peers.back().ip() != want)
      return failed("the app saw the probe from " + (peers.empty() ? std::string("nowhere") : peers.back().ip()) +
                    ", not " + want);
    return {};
  }

  /// @p began: when the attempt started (what a failure is dated by).
  void record(Kind k, const NodePod& pod, std::chrono::steady_clock::time_point began, const Outcome& o) {
    std::lock_guard lock(mu_);
    Tally& t = tallies_[k];
    t.attempts++;
    if (o.what == Outcome::Ok || o.what == Outcome::Retried) {
      t.ok++;
      if (o.what == Outcome::Retried) {
        t.retried++;
        if (t.firstFailures.size() < 5)
          t.firstFailures.push_back(phase_ + " +" + std::to_string(sinceStart(began)) + " ms " + pod.name + ": " + o.detail);
      }
      return;
    }
    (o.what == Outcome::Failed ? t.failed : t.bypassed)++;
    if (t.firstFailures.size() < 5) {
      t.firstFailures.push_back(phase_ + " +" + std::to_string(sinceStart(began)) + " ms " + pod.name + ": " + o.detail);
    }
  }

  long long sinceStart(std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now()) const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t - started_).count();
  }

  const std::vector<std::unique_ptr<NodePod>>& pods_;
  const TestNetns& node_;
  const TestNetns& remote_;
  const std::array<std::unique_ptr<TcpServer>, 2>& targets_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false, paused_ = false;
  size_t parked_ = 0;
  std::string phase_ = "istio alone";
  std::map<Kind, Tally> tallies_;
  std::vector<std::thread> threads_;
  std::chrono::steady_clock::time_point started_;
};

/// The last @p n lines of @p text (agent logs at debug level are long).
std::string tail(const std::string& text, size_t n) {
  size_t pos = text.size(), lines = 0;
  while (pos > 0 && lines <= n) {
    pos = text.rfind('\n', pos - 1);
    if (pos == std::string::npos) return text;
    lines++;
  }
  return pos == 0 ? text : "…\n" + text.substr(pos + 1);
}

// ---- The node --------------------------------------------------------------------

class IstioTakeover : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (cgroups, network namespaces, netfilter, BPF)";
    if (cgroups_.unavailable()) GTEST_SKIP() << cgroups_.error();
    if (sh("command -v iptables-nft-restore && command -v ip6tables-nft-restore && command -v ipset").exitCode != 0)
      GTEST_SKIP() << "needs iptables-nft and ipset (Istio's node agent's tools)";
    ASSERT_TRUE(cgroups_.ok()) << cgroups_.error();
    ASSERT_FALSE(tmp_.path().empty());
    ASSERT_TRUE(topo_.ok()) << topo_.error();
    ASSERT_NO_FATAL_FAILURE(startApiServer());
    ASSERT_NO_FATAL_FAILURE(addPods());
    ASSERT_NO_FATAL_FAILURE(applyIstio());
    ASSERT_NO_FATAL_FAILURE(startServers());
    ASSERT_NO_FATAL_FAILURE(startIstioAndZtunnel());
    auto relay = TcpRelay::start(topo_.node(), Endpoint::of("127.0.0.1", api_->port()),
                                 Endpoint::of("127.0.0.1", api_->port()));
    ASSERT_TRUE(relay.ok()) << relay.error().message;
    relay_ = std::move(*relay);
    traffic_ = std::make_unique<NodeTraffic>(pods_, topo_.node(), topo_.remote(), targets_);
  }

  void TearDown() override {
    if (traffic_) traffic_->stop();
    if (HasFailure()) {
      std::string logs = earlierAgentLogs_ + (agent_ ? agent_->log() : "");
      if (!logs.empty()) std::cerr << "---- agent log (tail) ----\n" << tail(logs, 300) << "\n";
      if (api_) std::cerr << "---- API server log (tail) ----\n" << tail(api_->log(), 60) << "\n";
    }
    if (agent_)
      if (auto c = agent_->client(); c.ok())
        if (auto pods = c->listPods(); pods.ok())
          for (const auto& p : *pods) (void)c->removePod(p.id);
    agent_.reset();
  }

  std::string zdsPath() const { return tmp_.file("zds.sock"); }

  void startApiServer() {
    auto s = TestApiServer::start();
    ASSERT_TRUE(s.ok()) << s.error().message;
    api_ = std::move(*s);
    ASSERT_TRUE(api_->createNamespace("shop", {{"istio.io/dataplane-mode", "ambient"}}).ok());
    ASSERT_TRUE(api_->createNamespace("istio-system").ok());
    ASSERT_TRUE(api_->createNodeAgentPod().ok());
  }

  /// Ten running pods: network, a process in a kubelet cgroup, the Pod
  /// object (uid, both IPs, node-a) with Istio's annotation "enabled".
  void addPods() {
    for (int i = 0; i < kPods; i++) {
      auto net = topo_.addPod();
      ASSERT_TRUE(net.ok()) << net.error().message;
      auto pod = std::make_unique<NodePod>();
      pod->net = *net;
      pod->name = "web-" + std::to_string(i);
      pod->uid = randomPodUid();
      auto proc = TestPodProcess::start(cgroups_, {.uid = pod->uid,
                                                   .driver = i % 2 ? CgroupDriver::Systemd : CgroupDriver::Cgroupfs,
                                                   .joinNetns = pod->net->ns->path()});
      ASSERT_TRUE(proc.ok()) << proc.error().message;
      pod->process = std::move(*proc);
      TestPod tp;
      tp.namespaceName = "shop";
      tp.name = pod->name;
      tp.uid = pod->uid;
      tp.ips = {pod->net->v4, pod->net->v6};
      tp.annotations = {{kRedirection, "enabled"}};
      tp.serviceAccount = "web";
      auto created = api_->createPod(tp);
      ASSERT_TRUE(created.ok()) << created.error().message;
      pods_.push_back(std::move(pod));
    }
  }

  std::vector<std::string> podIps() const {
    std::vector<std::string> ips;
    for (const auto& p : pods_) ips.insert(ips.end(), {p->net->v4, p->net->v6});
    return ips;
  }

  /// What istio-cni left on the node: its rules in every pod, its probe
  /// ipsets and SNAT on the node, itself in the CNI chain.
  void applyIstio() {
    for (const auto& p : pods_) {
      Status st = applyIstioInpod(p->ns(), IstioBackend::IptablesNft, true);
      ASSERT_TRUE(st.ok()) << st.error().message;
    }
    Status st = applyIstioNode(topo_.node(), podIps());
    ASSERT_TRUE(st.ok()) << st.error().message;
    auto conflist = writeIstioChainedConflist(cniDir_.path());
    ASSERT_TRUE(conflist.ok()) << conflist.error().message;
    conflist_ = *conflist;
  }

  void startServers() {
    for (const auto& p : pods_)
      for (int family : {AF_INET, AF_INET6}) {
        auto app = TcpServer::start(p->ns(), Endpoint::of(p->net->ip(family), kAppPort));
        ASSERT_TRUE(app.ok()) << app.error().message;
        p->app[familyIndex(family)] = std::move(*app);
        auto health = TcpServer::start(p->ns(), Endpoint::of(p->net->ip(family), kHealthPort));
        ASSERT_TRUE(health.ok()) << health.error().message;
        p->health[familyIndex(family)] = std::move(*health);
      }
    for (int family : {AF_INET, AF_INET6}) {
      auto target = TcpServer::start(topo_.remote(), Endpoint::of(ProbeTopology::remoteAddr(family), 0));
      ASSERT_TRUE(target.ok()) << target.error().message;
      targets_[familyIndex(family)] = std::move(*target);
      auto resolver = UdpServer::start(topo_.remote(), Endpoint::of(ProbeTopology::remoteAddr(family), 53));
      ASSERT_TRUE(resolver.ok()) << resolver.error().message;
      resolvers_[familyIndex(family)] = std::move(*resolver);
    }
  }

  /// Istio's node agent serving ZDS, ztunnel connected to it (listening in
  /// every pod before sluice exists on the node), and every pod enrolled
  /// through Istio's CNI ADD path (AddWorkload on the live connection).
  void startIstioAndZtunnel() {
    auto istio = IstioZdsStandIn::start(zdsPath(), {});
    ASSERT_TRUE(istio.ok()) << istio.error().message;
    istio_ = std::move(*istio);
    auto z = NodeProxyStandIn::start(testNodeProxyConfig(zdsPath()));
    ASSERT_TRUE(z.ok()) << z.error().message;
    ztunnel_ = std::move(*z);
    ASSERT_TRUE(ztunnel_->waitForEvent("snapshot", "", scaledBound(5s))) << "ztunnel got no snapshot from Istio's agent";
    for (const auto& p : pods_) {
      Status st = istio_->add(p->istio());
      ASSERT_TRUE(st.ok()) << p->name << ": " << st.error().message;
    }
    ASSERT_TRUE(eventually([&] { return ztunnel_->runningPods() == allUids(); }, 10s)) << "ztunnel's proxies did not start";
  }

  std::vector<IstioPod> istioPods() const {
    std::vector<IstioPod> out;
    for (const auto& p : pods_) out.push_back(p->istio());
    return out;
  }

  std::vector<std::string> allUids() const {
    std::vector<std::string> uids;
    for (const auto& p : pods_) uids.push_back(p->uid);
    std::sort(uids.begin(), uids.end());
    return uids;
  }

  // ---- sluiced ----

  /// sluiced's flags on this node: Kubernetes (through the relay), ZDS at
  /// Istio's socket path, a sweep every second, the CNI chain watched,
  /// @p capture, and @p istioFlag (--istio-takeover / --istio-hand-back).
  std::vector<std::string> agentArgs(const std::string& capture, const std::string& istioFlag) const {
    return {"--kube-api", api_->url(),
            "--kube-token-file", api_->tokenFile(),
            "--kube-ca-file", api_->caFile(),
            "--node-name", "node-a",
            "--ztunnel-socket", zdsPath(),
            "--ztunnel-timeout-ms", "1000",
            "--reconcile-interval", "1",
            "--capture", capture,
            "--cni-conf-dir", cniDir_.path(),
            istioFlag};
  }

  /// sluiced in the node netns (its probe SNAT then covers the host veths).
  void startAgent(const std::vector<std::string>& args) {
    auto a = AgentProcess::start(bpffs_.root(), args, tmp_.file("agent.sock"), topo_.node().path());
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
  }

  void stopAgent() {
    earlierAgentLogs_ += agent_->log();
    EXPECT_EQ(agent_->stop(SIGTERM), 0) << "sluiced did not stop cleanly on SIGTERM";
    agent_.reset();
  }

  /// The agent's health field "istio" (read from the raw answer: older
  /// builds do not have it), or what prevented reading it.
  std::string istioHealth() const {
    auto c = agent_->client();
    if (!c.ok()) return "no agent: " + c.error().message;
    agent::Request r;
    r.op = agent::Op::Health;
    auto j = c->call(r);
    if (!j.ok()) return "health failed: " + j.error().message;
    if (!j->contains("istio") || !(*j)["istio"].is_string()) return "health has no \"istio\"";
    return (*j)["istio"].get<std::string>();
  }

  /// Waits until istioHealth() is @p want; @p last: what it said last.
  bool istioHealthBecomes(const std::string& want, std::chrono::milliseconds bound, std::string& last) const {
    return eventually([&] {
      if ((last = istioHealth()) == want) return true;
      std::this_thread::sleep_for(100ms);  // a connection to the agent each time: not every 5 ms
      return false;
    }, bound);
  }

  std::vector<std::string> registryUids() const {
    std::vector<std::string> uids;
    auto c = agent_->client();
    if (!c.ok()) return uids;
    auto list = c->listPods();
    if (list.ok())
      for (const auto& p : *list) uids.push_back(p.identity.uid);
    std::sort(uids.begin(), uids.end());
    return uids;
  }

  /// The pod's ambient.istio.io/redirection annotation in the API.
  std::optional<std::string> redirection(const NodePod& pod) const {
    auto o = api_->object("pods", "shop", pod.name);
    if (!o.ok() || !o->has_value()) return std::nullopt;
    const json a = (**o)["metadata"].value("annotations", json::object());
    if (!a.contains(kRedirection) || !a[kRedirection].is_string()) return std::nullopt;
    return a[kRedirection].get<std::string>();
  }

  /// Every patch the agent sent that set the redirection annotation to
  /// anything but "enabled" (or removed it): Istio enrolled these pods, and
  /// they stay enrolled through the takeover and the hand-back.
  std::vector<std::string> annotationFlips() const {
    std::vector<std::string> out;
    auto patches = api_->patches();
    if (!patches.ok()) return {"patches unreadable: " + patches.error().message};
    for (const auto& p : *patches) {
      const json& patch = p.value("patch", json::object());
      if (!patch.contains("metadata") || !patch["metadata"].contains("annotations")) continue;
      const json& a = patch["metadata"]["annotations"];
      if (a.contains(kRedirection) && a[kRedirection] != "enabled")
        out.push_back(p.value("name", "?") + ": " + a[kRedirection].dump());
    }
    return out;
  }

  /// Time for traffic to run (the loops go on meanwhile).
  static void soak() { std::this_thread::sleep_for(kSoak); }

  // ---- Checks ----

  /// Connections the node proxy relayed per pod uid: outbound; inbound to
  /// the app port; inbound to the health port (kubelet's probes, which must
  /// never be captured).
  struct Relayed {
    std::map<std::string, size_t> outbound, inbound, probes;
  };
  Relayed relayed() const {
    Relayed r;
    for (const auto& e : ztunnel_->events()) {
      if (e.type != "connection" || e.proxy.detail != "upstream ok") continue;
      if (e.proxy.listener == "outbound") r.outbound[e.uid]++;
      if (e.proxy.listener != "inbound") continue;
      const std::string port = e.proxy.origDst.substr(e.proxy.origDst.rfind(':') + 1);
      (port == std::to_string(kHealthPort) ? r.probes : r.inbound)[e.uid]++;
    }
    return r;
  }

  /// "" when every connection a server accepted came through the node proxy
  /// (and no probe did), else one line per pod that differs. @p bypassed:
  /// connections the servers accepted beyond what the proxy relayed.
  std::string serverVsProxy(uint64_t& bypassed) const {
    bypassed = 0;
    Relayed r = relayed();
    std::map<std::string, size_t> fromPod;  // remote servers' peers by address
    for (const auto& t : targets_)
      for (const auto& peer : t->peers()) fromPod[peer.ip()]++;
    std::ostringstream out;
    auto compare = [&](const NodePod& p, const char* what, size_t accepted, size_t relayedN) {
      if (accepted == relayedN) return;
      if (accepted > relayedN) bypassed += accepted - relayedN;
      out << "    " << p.name << ": " << what << ": servers accepted " << accepted << ", the proxy relayed "
          << relayedN << "\n";
    };
    for (const auto& p : pods_) {
      compare(*p, "outbound", fromPod[p->net->v4] + fromPod[p->net->v6], r.outbound[p->uid]);
      compare(*p, "inbound", p->app[0]->accepted() + p->app[1]->accepted(), r.inbound[p->uid]);
      if (r.probes[p->uid]) out << "    " << p->name << ": the proxy relayed " << r.probes[p->uid] << " kubelet probe(s)\n";
    }
    for (const auto& resolver : resolvers_) {
      bypassed += resolver->received().size();
      if (!resolver->received().empty())
        out << "    the resolver at " << resolver->local().str() << " got " << resolver->received().size() << " queries\n";
    }
    return out.str();
  }

  /// What the traffic saw so far, read with the loops paused (nothing in
  /// flight): each kind's tally, and where servers and proxy disagree.
  struct Findings {
    std::map<Kind, Tally> tallies;
    std::string serversVsProxy;  ///< "" when every connection came through the proxy
    uint64_t bypassed = 0;       ///< connections that reached a server without it
  };
  Findings findings(const std::string& phase) {
    traffic_->pause();
    Findings f;
    // Settled at once unless an attempt failed half way; a short bound.
    eventually([&] {
      f.serversVsProxy = serverVsProxy(f.bypassed);
      if (f.serversVsProxy.empty()) return true;
      std::this_thread::sleep_for(50ms);
      return false;
    }, 2s);
    f.tallies = traffic_->tallies();
    std::cout << "[ " << phase << " ] traffic so far:\n" << traffic_->describe() << "  servers vs proxy:\n"
              << (f.serversVsProxy.empty() ? "    every connection relayed\n" : f.serversVsProxy);
    traffic_->resume();
    return f;
  }

  /// The end of a phase: every kind ran with no failure and no bypass since
  /// the start, and every connection a server accepted came through the proxy.
  void expectClean(const std::string& phase) {
    Findings f = findings(phase);
    for (const auto& [k, t] : f.tallies) {
      std::string first;
      for (const auto& line : t.firstFailures) first += "\n    " + line;
      EXPECT_GT(t.ok, 0u) << phase << ": " << kindName(k) << " never succeeded";
      EXPECT_EQ(t.failed, 0u) << phase << ": " << kindName(k) << " failed; first:" << first;
      EXPECT_EQ(t.bypassed, 0u) << phase << ": " << kindName(k) << " went past the proxy; first:" << first;
    }
    EXPECT_EQ(f.serversVsProxy, "") << phase << ": " << f.bypassed << " connection(s) reached a server without the proxy";
  }

  /// ztunnel never lost a pod: no DelWorkload, no proxy stopped or failed.
  void expectZtunnelUndisturbed() {
    std::vector<std::string> bad;
    for (const auto& e : ztunnel_->events())
      if (e.type == "del" || e.type == "proxy-stopped" || e.type == "proxy-start-failed")
        bad.push_back(e.type + " " + e.ns + "/" + e.name + " (connection " + std::to_string(e.connection) + ") " +
                      e.detail);
    EXPECT_TRUE(bad.empty()) << "ztunnel was disturbed:\n" << ::testing::PrintToString(bad);
    EXPECT_EQ(ztunnel_->runningPods(), allUids());
  }

  /// The newest ZDS connection ztunnel made (0: none).
  uint64_t lastZdsConnection() const {
    uint64_t last = 0;
    for (const auto& e : ztunnel_->events()) last = std::max(last, e.connection);
    return last;
  }
  /// Waits until ztunnel completed a snapshot on a connection newer than @p after.
  bool ztunnelResynced(uint64_t after, std::chrono::milliseconds bound) const {
    return ztunnel_->waitFor([&](const NodeProxyEvent& e) { return e.type == "snapshot" && e.connection > after; },
                             scaledBound(bound));
  }

  void istioAlone() {
    traffic_->start();
    soak();
    expectClean("istio alone");
  }

  TempDir tmp_{"istio-takeover"};
  TempDir cniDir_{"istio-takeover-cni"};
  TestCgroupRoot cgroups_;
  TestBpffs bpffs_;
  std::unique_ptr<TestApiServer> api_;
  ProbeTopology topo_{CniKind::Routed};
  std::vector<std::unique_ptr<NodePod>> pods_;
  std::array<std::unique_ptr<TcpServer>, 2> targets_;    ///< behind the node, v4 / v6
  std::array<std::unique_ptr<UdpServer>, 2> resolvers_;  ///< behind the node, :53, echo
  std::string conflist_;
  std::unique_ptr<IstioZdsStandIn> istio_;
  std::unique_ptr<NodeProxyStandIn> ztunnel_;
  std::unique_ptr<TcpRelay> relay_;
  std::unique_ptr<AgentProcess> agent_;
  std::string earlierAgentLogs_;
  std::unique_ptr<NodeTraffic> traffic_;
};

// Phase 1 alone: Istio's own rules, its ZDS server and ztunnel carry every
// kind of traffic on this node with no failure and nothing past the proxy.
// This validates the harness (topology, rules, stand-ins, loops, the
// servers-vs-proxy count) before sluice is in the picture.
TEST_F(IstioTakeover, IstioAloneCarriesTheNode) {
  istioAlone();
  expectZtunnelUndisturbed();
}

// The harness is not blind: with one pod's capture gone and the node's
// probe SNAT gone, its connections reach the servers past the proxy, its
// DNS reaches the resolver, and every probe arrives from the node's own
// address (and, in the pods still captured, goes to the proxy); each is
// seen and named.
TEST_F(IstioTakeover, HarnessSeesWhatGoesPastTheProxy) {
  traffic_->start();
  std::this_thread::sleep_for(300ms);
  traffic_->phase("broken");
  const std::string flushPod =
      "for t in iptables-nft ip6tables-nft; do $t -t nat -F ISTIO_OUTPUT; $t -t nat -F ISTIO_PRERT; done";
  CommandResult r = sh("ip netns exec " + pods_[0]->ns().name() + " sh -c '" + flushPod + "'");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  r = sh("ip netns exec " + topo_.node().name() +
         " sh -c 'iptables-nft -t nat -F ISTIO_POSTRT; ip6tables-nft -t nat -F ISTIO_POSTRT'");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  soak();
  Findings f = findings("broken");
  EXPECT_GT(f.tallies[Kind::Dns].bypassed, 0u);
  for (Kind k : {Kind::ProbeV4, Kind::ProbeV6}) {
    EXPECT_GT(f.tallies[k].failed, 0u) << kindName(k);
    ASSERT_FALSE(f.tallies[k].firstFailures.empty());
    const std::string node = ProbeTopology::nodeAddr(k == Kind::ProbeV4 ? AF_INET : AF_INET6);
    EXPECT_NE(f.tallies[k].firstFailures[0].find("the app saw the probe from " + node), std::string::npos)
        << f.tallies[k].firstFailures[0];
  }
  EXPECT_GT(f.bypassed, 0u);
  for (const char* line : {"web-0: outbound: servers accepted", "web-0: inbound: servers accepted",
                           "web-1: the proxy relayed", "the resolver at 192.168.201.2:53 got",
                           "the resolver at [fd00:ff::2]:53 got"})
    EXPECT_NE(f.serversVsProxy.find(line), std::string::npos) << line << " in:\n" << f.serversVsProxy;
}

// ---- The whole story, per capture mode -------------------------------------------

struct CaptureCase {
  const char* name;     ///< the test name's suffix
  const char* capture;  ///< --capture
};
void PrintTo(const CaptureCase& c, std::ostream* os) { *os << c.name; }

class IstioTakeoverModes : public IstioTakeover, public ::testing::WithParamInterface<CaptureCase> {
 protected:
  void SetUp() override {
    if (::geteuid() == 0 && std::string(GetParam().capture) == "socket")
      if (std::string why = socketCaptureUnsupported(); !why.empty()) GTEST_SKIP() << why;
    IstioTakeover::SetUp();
  }

  std::vector<std::string> args(const std::string& istioFlag) const {
    return agentArgs(GetParam().capture, istioFlag);
  }

  /// Phase 2's first half: every pod in sluice's registry with its uid and
  /// Istio's in-pod rules gone from it; false at the bound, with @p last
  /// saying what was still missing.
  bool podsTakenOver(std::string& last) {
    return eventually([&] {
      auto uids = registryUids();
      if (uids != allUids()) {
        last = std::to_string(uids.size()) + " of " + std::to_string(kPods) +
               " pods in the registry; istio: " + istioHealth();
        std::this_thread::sleep_for(100ms);
        return false;
      }
      for (const auto& p : pods_) {
        auto rules = readIstioPodRules(p->ns());
        if (!rules.ok() || rules->any()) {
          last = p->name + ": Istio's rules: " + (rules.ok() ? rules->describe() : rules.error().message) +
                 "; istio: " + istioHealth();
          std::this_thread::sleep_for(100ms);
          return false;
        }
      }
      return true;
    }, 60s);
  }

  /// After the takeover: sluice has every pod, Istio nothing on the node.
  void expectTakenOver() {
    EXPECT_EQ(registryUids(), allUids());
    for (const auto& p : pods_) {
      EXPECT_EQ(redirection(*p), "enabled") << p->name;
      auto rules = readIstioPodRules(p->ns());
      ASSERT_TRUE(rules.ok()) << rules.error().message;
      EXPECT_FALSE(rules->any()) << p->name << ": " << rules->describe();
      EXPECT_EQ(sharedReturnPathMissing(p->ns()), "") << p->name << ": sluice's return path";
    }
    istio::NodeState node = readIstioNodeState(topo_.node(), cniDir_.path());
    EXPECT_FALSE(node.any()) << "Istio's node state is still there: " << node.describe();
    EXPECT_TRUE(node.unreadable.empty()) << node.describe();
    EXPECT_EQ(pluginTypes(conflist_), (std::vector<std::string>{"calico", "portmap", "sluice-cni"}));
    EXPECT_EQ(annotationFlips(), std::vector<std::string>{});
  }

  /// Istio comes back first, as its DaemonSet would be rolled back: its ZDS
  /// server (which unlinks the socket sluiced serves and binds it), then its
  /// in-pod rules (istio-cni's way: the policy rule sluice shares is kept,
  /// never re-made), its node state and istio-cni in the chain.
  void istioReturns() {
    // Its ZDS server first, as Istio's agent takes ztunnel's socket at start
    // and then reconciles the pods (a takeover agent seeing it stands down).
    istio_.reset();
    auto istio = IstioZdsStandIn::start(zdsPath(), istioPods());
    ASSERT_TRUE(istio.ok()) << istio.error().message;
    istio_ = std::move(*istio);
    for (const auto& p : pods_) {
      Status st = applyIstioInpod(p->ns(), IstioBackend::IptablesNft, true, IstioRule::AddIfMissing);
      ASSERT_TRUE(st.ok()) << p->name << ": " << st.error().message;
    }
    Status st = applyIstioNode(topo_.node(), podIps());
    ASSERT_TRUE(st.ok()) << st.error().message;
    st = chainIstioCni(conflist_);
    ASSERT_TRUE(st.ok()) << st.error().message;
  }

  /// After the hand-back: Istio has every pod, sluice none.
  void expectHandedBack() {
    EXPECT_EQ(registryUids(), std::vector<std::string>{});
    for (const auto& p : pods_) {
      EXPECT_EQ(redirection(*p), "enabled") << p->name;
      auto rules = readIstioPodRules(p->ns());
      ASSERT_TRUE(rules.ok()) << rules.error().message;
      EXPECT_TRUE(rules->any()) << p->name << ": Istio's rules are gone";
      EXPECT_EQ(sharedReturnPathMissing(p->ns()), "") << p->name << ": the return path Istio and sluice share";
    }
    istio::NodeState node = readIstioNodeState(topo_.node(), cniDir_.path());
    const std::string d = node.describe();
    EXPECT_NE(d.find("iptables-nft IPv4: ISTIO_POSTRT"), std::string::npos) << d;
    EXPECT_NE(d.find("iptables-nft IPv6: ISTIO_POSTRT"), std::string::npos) << d;
    EXPECT_NE(d.find("istio-inpod-probes-v4: " + std::to_string(kPods) + " address(es)"), std::string::npos) << d;
    EXPECT_NE(d.find("istio-inpod-probes-v6: " + std::to_string(kPods) + " address(es)"), std::string::npos) << d;
    auto types = pluginTypes(conflist_);
    EXPECT_NE(std::find(types.begin(), types.end(), "istio-cni"), types.end()) << ::testing::PrintToString(types);
    EXPECT_EQ(std::find(types.begin(), types.end(), "sluice-cni"), types.end()) << ::testing::PrintToString(types);
    EXPECT_EQ(annotationFlips(), std::vector<std::string>{});
  }
};

// The node goes from Istio's node agent to sluice and back with traffic
// running the whole time: no attempt of any kind fails, nothing reaches a
// server past the proxy, ztunnel never loses a pod.
TEST_P(IstioTakeoverModes, TakenOverWithTrafficThenHandedBack) {
  // 1. Istio alone.
  istioAlone();

  // 2. sluiced takes over while Istio's agent still serves ZDS: it enrolls
  // every pod Istio enrolled and removes Istio's rules from it; Istio's
  // agent exits; ztunnel reconnects to sluiced and keeps every pod; sluiced
  // then removes Istio's node state.
  traffic_->phase("takeover");
  const uint64_t istioConnection = lastZdsConnection();
  ASSERT_NO_FATAL_FAILURE(startAgent(args("--istio-takeover")));
  traffic_->note("sluiced --istio-takeover answers");
  std::string last;
  ASSERT_TRUE(podsTakenOver(last)) << "the pods were not taken over: " << last;
  traffic_->note("every pod in sluice's registry, Istio's in-pod rules gone");
  // Not done while Istio's agent still serves ZDS.
  last = istioHealth();
  EXPECT_EQ(last.rfind("takeover: ", 0), 0u) << last;
  EXPECT_NE(last, "takeover: done");
  istio_->stop();  // Istio's DaemonSet pod exits
  traffic_->note("Istio's agent stopped serving ZDS");
  ASSERT_TRUE(ztunnelResynced(istioConnection, 15s)) << "ztunnel did not reconnect to sluiced";
  traffic_->note("ztunnel resynced with sluiced");
  ASSERT_TRUE(istioHealthBecomes("takeover: done", 30s, last)) << "health's istio says: " << last;
  traffic_->note("takeover: done");
  soak();
  expectClean("takeover");
  expectTakenOver();
  expectZtunnelUndisturbed();

  // 3. Hand back: Istio first, then sluiced stops (its data plane stays),
  // ztunnel goes back to Istio's agent, and sluiced started with
  // --istio-hand-back removes only its own redirection. Until then every
  // pod has both Istio's rules and sluice's redirection, and traffic must
  // not notice.
  traffic_->phase("istio returns");
  ASSERT_NO_FATAL_FAILURE(istioReturns());
  traffic_->note("Istio's rules, node state, istio-cni and ZDS server are back");
  const uint64_t sluiceConnection = lastZdsConnection();
  stopAgent();
  traffic_->note("sluiced stopped");
  ASSERT_TRUE(ztunnelResynced(sluiceConnection, 15s)) << "ztunnel did not reconnect to Istio's agent";
  traffic_->note("ztunnel resynced with Istio's agent");
  EXPECT_FALSE(istio_->peers().empty());
  traffic_->phase("hand-back");
  ASSERT_NO_FATAL_FAILURE(startAgent(args("--istio-hand-back")));
  traffic_->note("sluiced --istio-hand-back answers");
  ASSERT_TRUE(istioHealthBecomes("hand-back: done", 30s, last)) << "health's istio says: " << last;
  traffic_->note("hand-back: done");
  soak();
  expectClean("hand-back");
  expectHandedBack();
  expectZtunnelUndisturbed();
}

// Killed (SIGKILL) while it takes the pods over and started again, the
// agent completes the takeover with no gap. Connections opened under
// Istio's rules — an inbound one the proxy relays to the app, an outbound
// one to a server behind the node — stay open through all of it and work
// afterwards in socket mode (Istio's redirect rules and connmark restore
// stay, no longer reached, until they close, and the pod is not "done"
// before); in tc mode they work until the pod's rules go.
TEST_P(IstioTakeoverModes, KilledMidwayItCompletesOnRestartAndOpenConnectionsLive) {
  istioAlone();
  const NodePod& first = *pods_.front();
  auto inbound = tcpConnect(topo_.remote(), Endpoint::of(first.net->ip(AF_INET), kAppPort), ConnectOptions{kAttemptTimeout});
  ASSERT_TRUE(inbound.ok()) << inbound.error().message;
  auto outbound = tcpConnect(first.ns(), targets_[0]->local(), ConnectOptions{kAttemptTimeout});
  ASSERT_TRUE(outbound.ok()) << outbound.error().message;
  // tc mode cannot keep them: the kernel loses its DNS capture's answers
  // while a REDIRECT rule is in the pod, and deleting the rule ends the
  // connections it translated (deploy/README.md says so).
  const bool keepsConnections = GetParam().capture == std::string("socket");
  auto echoBoth = [&](const std::string& when) {
    if (!keepsConnections && when != "istio") return;
    for (int fd : {inbound->get(), outbound->get()}) {
      auto e = echoRoundTrip(fd, when, kAttemptTimeout);
      EXPECT_TRUE(e.ok() && *e == when) << when << ": " << (e.ok() ? *e : e.error().message);
    }
  };
  echoBoth("istio");

  traffic_->phase("takeover, killed");
  ASSERT_NO_FATAL_FAILURE(startAgent(args("--istio-takeover")));
  ASSERT_TRUE(eventually([&] { return !registryUids().empty(); }, 30s)) << "no pod was ever enrolled";
  earlierAgentLogs_ += agent_->log();
  EXPECT_EQ(agent_->stop(SIGKILL), 128 + SIGKILL);
  agent_.reset();
  traffic_->note("sluiced killed");
  soak();
  echoBoth("killed");

  traffic_->phase("takeover, restarted");
  ASSERT_NO_FATAL_FAILURE(startAgent(args("--istio-takeover")));
  ASSERT_TRUE(eventually([&] { return registryUids() == allUids(); }, 60s)) << "istio: " << istioHealth();
  const uint64_t istioConnection = lastZdsConnection();
  istio_->stop();
  ASSERT_TRUE(ztunnelResynced(istioConnection, 15s)) << "ztunnel did not reconnect to sluiced";
  std::string last;
  if (GetParam().capture == std::string("socket")) {
    // What the open connections need stays, and health says so.
    ASSERT_TRUE(eventually([&] {
      last = istioHealth();
      return last.find("connmark restore kept") != std::string::npos &&
             last.find("Istio's redirect rules kept, no longer reached") != std::string::npos;
    }, 30s)) << "health's istio says: " << last;
  }
  echoBoth("taken over");
  inbound->reset();
  outbound->reset();
  ASSERT_TRUE(istioHealthBecomes("takeover: done", 60s, last)) << "health's istio says: " << last;
  soak();
  expectClean("takeover, restarted");
  expectTakenOver();
  expectZtunnelUndisturbed();
}

INSTANTIATE_TEST_SUITE_P(Capture, IstioTakeoverModes,
                         ::testing::Values(CaptureCase{"socket", "socket"}, CaptureCase{"tc", "tc"}),
                         [](const ::testing::TestParamInfo<CaptureCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace sluice::test
