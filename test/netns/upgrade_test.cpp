// Upgrades across pinned-map layouts: an older release's agent enrolls a pod
// and carries its traffic; this build's agent then starts on the same pinned
// state, migrates the maps whose layout changed (loader/migrate.h) and
// switches every hook to its own programs, while a client keeps making
// connections through the redirect. Plus the layout checks themselves: a
// layout this build cannot read is refused in one line and left alone, and
// an interrupted migration is resumed.
//
//   test process                               node netns         pod netns
//   +--------------------------------+         +----------+  veth  +------------------+
//   | old sluiced  -> this sluiced   |--enroll---------------------->| eth0, lo (tc)  |
//   |   (build/upgrade/<tag>/)       |         | echo     |<-------| stand-in :15001 |
//   | connection loop (thread)       |         | server   |        |                  |
//   +--------------------------------+         +----------+        +------------------+
#include <bpf/bpf.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <tuple>

#include "loader/bpffs.h"
#include "enroll/datapath.h"
#include "loader/migrate.h"
#include "loader/programs.h"
#include "test/common/agent_process.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

bool pathExists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

// test/upgrade/oldest-supported: "TAG SHA".
std::string oldestTag() {
  std::ifstream f(std::string(SLUICE_SOURCE_DIR) + "/test/upgrade/oldest-supported");
  std::string tag;
  f >> tag;
  return tag;
}

std::string oldBinary(const std::string& name) {
  return std::string(SLUICE_BUILD_DIR) + "/upgrade/" + oldestTag() + "/" + name;
}

class Upgrade : public ::testing::TestWithParam<TcMode> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    if (std::string why = tcModeUnsupported(GetParam()); !why.empty()) GTEST_SKIP() << why;
    ASSERT_FALSE(oldestTag().empty()) << "test/upgrade/oldest-supported is missing";
    // Not a skip: an upgrade test that silently does not run proves nothing.
    ASSERT_TRUE(pathExists(oldBinary("sluiced")))
        << oldBinary("sluiced") << " is missing: scripts/test.sh builds it (scripts/build-upgrade-base.sh)";
    ASSERT_TRUE(topo_.ok()) << topo_.error();
    static std::atomic<int> n{0};
    socket_ = "/tmp/sluice-t-upgrade-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".sock";
  }
  void TearDown() override {
    standIn_.reset();
    if (agent_)
      if (auto c = agent_->client(); c.ok()) (void)c->removePod(topo_.pod().name());
    agent_.reset();
    ::unlink(socket_.c_str());
  }

  std::vector<std::string> modeArgs() const { return {"--tc-mode", GetParam() == TcMode::Legacy ? "legacy" : "tcx"}; }

  void startAgent(const std::string& binary) {
    auto a = AgentProcess::start(bpffs_.root(), modeArgs(), socket_, "", binary);
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
  }

  Status oneConnection(const Endpoint& server) { return connectAndEcho(topo_.pod(), server); }

  TestBpffs bpffs_;
  PodTopology topo_;
  std::string socket_;
  std::unique_ptr<AgentProcess> agent_;
  std::unique_ptr<ProxyStandIn> standIn_;
};

INSTANTIATE_TEST_SUITE_P(Modes, Upgrade, ::testing::Values(TcMode::Tcx, TcMode::Legacy),
                         [](const auto& info) { return std::string(modeName(info.param)); });

// Issue 12 (and 15, 31): the oldest supported release enrolls a pod; this
// build's agent takes over on the same pinned state (the registry's layout
// changed: 1 -> 2) while connections flow, and the node's probes (rule 10)
// flow with them: the old release translates them on the host-side veth,
// this one binds them to the probe address at connect(). Zero may fail,
// every connection goes through the proxy, every probe reaches the app from
// the probe address, the pod keeps all it had, and it can be removed.
TEST_P(Upgrade, FromOldestSupportedReleaseUnderConnectionLoop) {
  auto server = TcpServer::start(topo_.node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok()) << server.error().message;
  startAgent(oldBinary("sluiced"));
  PodSpec spec;
  spec.netnsPath = topo_.pod().path();
  spec.nodeNetnsPath = topo_.node().path();
  auto c = agent_->client();
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto enrolled = c->addPod(spec);
  ASSERT_TRUE(enrolled.ok()) << enrolled.error().message << "\n" << agent_->log();
  StandInConfig cfg = testStandInConfig();
  cfg.netnsPath = topo_.pod().path();
  auto s = ProxyStandIn::start(cfg);
  ASSERT_TRUE(s.ok()) << s.error().message;
  standIn_ = std::move(*s);
  ASSERT_FALSE(pathExists(bpffs_.root() + "/" + SLUICE_PIN_LAYOUTS)) << "the old release pinned no layouts";

  // A connection established through the proxy before the upgrade must
  // carry data after it.
  auto established = tcpConnect(topo_.pod(), (*server)->local());
  ASSERT_TRUE(established.ok()) << established.error().message;
  ASSERT_TRUE(echoRoundTrip(established->get(), "before").ok());

  // The pod's app, for the node's probes.
  auto app = TcpServer::start(topo_.pod(), Endpoint::any(AF_INET, 8080));
  ASSERT_TRUE(app.ok()) << app.error().message;
  const Endpoint appEp = Endpoint::of(PodTopology::kPodV4, 8080);

  std::atomic<bool> stop{false};
  std::atomic<size_t> ok{0}, probes{0};
  std::vector<std::string> failures, probeFailures;
  std::thread loop([&] {
    while (!stop) {
      Status st = oneConnection((*server)->local());
      if (st.ok())
        ok++;
      else
        failures.push_back(st.error().message);
      st = connectAndEcho(topo_.node(), appEp);
      if (st.ok())
        probes++;
      else
        probeFailures.push_back(st.error().message);
    }
  });
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(400)); };
  pause();
  EXPECT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  pause();  // no agent: the old release's pinned links and maps carry on
  startAgent(builtBinary("sluiced"));
  pause();
  size_t afterUpgrade = ok.load();
  pause();
  stop = true;
  loop.join();

  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures.front();
  EXPECT_TRUE(probeFailures.empty()) << probeFailures.size() << " probes failed, first: " << probeFailures.front();
  EXPECT_GE(probes.load(), 10u) << "too few probes to mean anything";
  ASSERT_TRUE((*app)->waitForAccepts(probes.load(), kIoTimeout));
  size_t fromProbe = 0;
  for (const auto& p : (*app)->peers())
    if (p.ip() == PodTopology::kProbeV4) fromProbe++;
  EXPECT_EQ(fromProbe, probes.load()) << "a probe reached the app from another source";
  EXPECT_GT(ok.load(), afterUpgrade) << "no connection after the upgrade";
  auto after = echoRoundTrip(established->get(), "after the upgrade");
  ASSERT_TRUE(after.ok()) << "the connection established before the upgrade broke: " << after.error().message;
  EXPECT_EQ(*after, "after the upgrade");
  EXPECT_GE(ok.load(), 10u) << "too few connections to mean anything";
  std::cout << "connections through the redirect across the upgrade from " << oldestTag() << ": " << ok.load()
            << ", failed: " << failures.size() << "; probes: " << probes.load() << ", failed: " << probeFailures.size()
            << "\n";
  EXPECT_TRUE(standIn_->waitForEvents(ok.load() + 1, kIoTimeout));
  size_t relayed = 0;
  for (const auto& e : standIn_->events())
    if (e.listener == "outbound" && e.detail == "upstream ok") relayed++;
  EXPECT_EQ(relayed, ok.load() + 1) << "a connection went around the proxy";

  std::string log = agent_->log();
  EXPECT_NE(log.find("migrated pinned map pods from layout 1 to " + std::to_string(SLUICE_LAYOUT_PODS) + ": 1 entry copied"),
            std::string::npos)
      << log;
  // The pod's own three; the old release's host-side hooks stay with its
  // programs until the pod goes (docs/redirection.md, rule 10).
  EXPECT_NE(log.find("switched 3 hook(s)"), std::string::npos) << log;
  EXPECT_NE(log.find("migrated pinned map pod_addrs from layout 1 to 2: "), std::string::npos) << log;
  EXPECT_NE(log.find("node probe hook: 2 link(s) attached"), std::string::npos) << log;
  // The pod as the old release enrolled it, now in the new registry.
  c = agent_->client();
  ASSERT_TRUE(c.ok());
  auto pods = c->listPods();
  ASSERT_TRUE(pods.ok()) << pods.error().message;
  ASSERT_EQ(pods->size(), 1u);
  const PodInfo& p = pods->front();
  EXPECT_EQ(p.id, enrolled->id);
  EXPECT_EQ(p.netnsPath, enrolled->netnsPath);
  EXPECT_EQ(p.netnsCookie, enrolled->netnsCookie);
  EXPECT_EQ(p.tcMode, enrolled->tcMode);
  EXPECT_EQ(p.interfaces, enrolled->interfaces);
  EXPECT_EQ(p.hostIface, enrolled->hostIface);
  EXPECT_EQ(p.ips, enrolled->ips);
  EXPECT_EQ(p.enrolledAtNs, enrolled->enrolledAtNs);
  EXPECT_TRUE(p.identity.empty());
  EXPECT_EQ(p.handoff, HandoffState::None);
  auto layouts = pinnedLayouts(bpffs_.root());
  ASSERT_TRUE(layouts.ok()) << layouts.error().message;
  for (const auto& l : *layouts)
    for (const auto& want : mapLayouts())
      if (l.name == want.name) {
        EXPECT_EQ(l.version, want.version) << l.name;
      }
  EXPECT_FALSE(pathExists(bpffs_.root() + "/migrate")) << "the old map stayed pinned";
  auto check = c->check(p.id);
  ASSERT_TRUE(check.ok()) << check.error().message;
  EXPECT_TRUE(check->intact) << check->problems.front();
  // And it leaves as any pod does.
  ASSERT_TRUE(c->removePod(p.id).ok());
  auto plain = oneConnection((*server)->local());
  EXPECT_TRUE(plain.ok()) << "plain networking after removal: " << plain.error().message;
}

// ---- Layout checks, on a private root, without an older build ----

class Layouts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (BPF)";
  }
  Result<std::unique_ptr<Datapath>> open() {
    DatapathOptions o;
    o.bpffsRoot = bpffs_.root();
    return Datapath::open(o);
  }
  int pinFd(const std::string& name) { return bpf_obj_get((bpffs_.root() + "/" + name).c_str()); }
  TestBpffs bpffs_;
};

// Every map this build pins has a layout version, and a fresh root records
// them all: a map added without a version would be pinned unversioned.
TEST_F(Layouts, FreshRootRecordsEveryMapsLayout) {
  auto dp = open();
  ASSERT_TRUE(dp.ok()) << dp.error().message;
  auto pinned = pinnedLayouts(bpffs_.root());
  ASSERT_TRUE(pinned.ok()) << pinned.error().message;
  EXPECT_EQ(pinned->size(), mapLayouts().size());
  for (const auto& l : *pinned) EXPECT_NE(l.version, 0u) << l.name << " has no recorded layout";
  // Every pin at the root (but the links and programs directories) is a
  // map with a layout.
  std::vector<std::string> names;
  for (const auto& l : mapLayouts()) names.push_back(l.name);
  auto r = sh("ls " + bpffs_.root());
  std::istringstream ls(r.out);
  for (std::string n; ls >> n;)
    if (n != SLUICE_PIN_LINKS_DIR && n != SLUICE_PIN_PROGRAMS_DIR) {
      EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n << " is pinned without a layout version";
    }
}

// A layout from a newer build: refused in one line naming the map, the
// versions and what to do; nothing under the root changes.
TEST_F(Layouts, NewerLayoutIsRefusedInOneLineAndLeftAlone) {
  {
    auto dp = open();
    ASSERT_TRUE(dp.ok()) << dp.error().message;
    sluice_layout_key k{};
    std::strncpy(k.name, SLUICE_PIN_PODS, sizeof(k.name) - 1);
    ASSERT_TRUE((*dp)->programs().layouts.update(k, sluice_layout_value{SLUICE_LAYOUT_PODS + 1, 0}).ok());
  }
  auto before = sh("ls -i " + bpffs_.root()).out;
  auto dp = open();
  ASSERT_FALSE(dp.ok());
  EXPECT_EQ(dp.error().message, "pinned map 'pods' has layout " + std::to_string(SLUICE_LAYOUT_PODS + 1) +
                                    ", newer than this build's " + std::to_string(SLUICE_LAYOUT_PODS) +
                                    " (written by a newer sluice); the running data plane is left as it is: run a "
                                    "sluice build that reads it, or remove " +
                                    bpffs_.root() + " to start over (that unenrolls every pod)");
  EXPECT_EQ(dp.error().message.find('\n'), std::string::npos);
  EXPECT_EQ(sh("ls -i " + bpffs_.root()).out, before) << "a refused load changed the pins";
}

// A pinned map that differs from this build's at the same version (a
// layout changed without its version bumped) is refused, not misread.
TEST_F(Layouts, SameVersionOtherDefinitionIsRefused) {
  {
    auto dp = open();
    ASSERT_TRUE(dp.ok()) << dp.error().message;
  }
  std::string pin = bpffs_.root() + "/" + SLUICE_PIN_POD_ADDRS;
  ASSERT_EQ(::unlink(pin.c_str()), 0);
  int fd = bpf_map_create(BPF_MAP_TYPE_HASH, "pod_addrs", sizeof(sluice_pod_addr), 24, 128, nullptr);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(bpf_obj_pin(fd, pin.c_str()), 0) << strerror(errno);
  ::close(fd);
  auto dp = open();
  ASSERT_FALSE(dp.ok());
  EXPECT_NE(dp.error().message.find("pinned map 'pod_addrs' differs from this build's at the same layout 2: value size 24 "
                                    "(this build: 16), max entries 128 (this build: "),
            std::string::npos)
      << dp.error().message;
}

// A migration that stopped after setting the old map aside (a crash, a
// kill) is finished by the next load: nothing is lost.
TEST_F(Layouts, InterruptedMigrationIsResumed) {
  // The state an interrupted 1 -> 2 migration of `pods` leaves: the old map
  // set aside under migrate/, no `pods` pin yet.
  ASSERT_TRUE(ensureBpffsRoot(bpffs_.root()).ok());
  ASSERT_EQ(::mkdir((bpffs_.root() + "/migrate").c_str(), 0700), 0);
  constexpr size_t kV1 = 992;  // sizeof the layout 1 record
  int fd = bpf_map_create(BPF_MAP_TYPE_HASH, "pods", sizeof(sluice_pod_id), kV1, SLUICE_MAX_PODS, nullptr);
  ASSERT_GE(fd, 0) << strerror(errno);
  sluice_pod_id key{};
  std::strcpy(key.id, "resumed-pod");
  std::vector<char> v1(kV1, 0);
  std::strcpy(v1.data(), "/run/netns/resumed");  // netns_path comes first in both layouts
  ASSERT_EQ(bpf_map_update_elem(fd, &key, v1.data(), BPF_ANY), 0);
  ASSERT_EQ(bpf_obj_pin(fd, (bpffs_.root() + "/migrate/pods-v1").c_str()), 0) << strerror(errno);
  ::close(fd);

  auto dp = open();
  ASSERT_TRUE(dp.ok()) << dp.error().message;
  auto rec = (*dp)->programs().pods.lookup(key);
  ASSERT_TRUE(rec.has_value()) << "the set-aside entry was not copied";
  EXPECT_STREQ(rec->netns_path, "/run/netns/resumed");
  EXPECT_EQ(rec->handoff.state, static_cast<__u32>(SLUICE_HANDOFF_NONE));
  EXPECT_FALSE(pathExists(bpffs_.root() + "/migrate")) << "the old map stayed pinned";
  auto pods = (*dp)->listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].id, "resumed-pod");
  // Leave the root removable: the registry entry points at no netns.
  ASSERT_TRUE((*dp)->programs().pods.erase(key).ok());
}

// pod_addrs layout 1 held the pod's netns cookie alone; layout 2 adds the
// node's netns, whose sockets the node's probe hook binds. A pod of layout 1
// gets 0 there: its host-side veth still runs the old build's probe SNAT,
// which keeps translating its probes (docs/redirection.md, rule 10).
TEST_F(Layouts, PodAddrsLayout1IsMigratedLeftToTheOldProbeSnat) {
  {
    auto dp = open();
    ASSERT_TRUE(dp.ok()) << dp.error().message;
  }
  std::string pin = bpffs_.root() + "/" + SLUICE_PIN_POD_ADDRS;
  ASSERT_EQ(::unlink(pin.c_str()), 0);
  sluice_pod_addr a{};
  const uint8_t ip[4] = {10, 1, 0, 5};
  std::memcpy(a.addr, ip, 4);
  a.family = AF_INET;
  const uint64_t podCookie = 77;
  int fd = bpf_map_create(BPF_MAP_TYPE_HASH, "pod_addrs", sizeof(sluice_pod_addr), sizeof(uint64_t),
                          SLUICE_POD_ADDR_ENTRIES, nullptr);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(bpf_map_update_elem(fd, &a, &podCookie, BPF_ANY), 0) << strerror(errno);
  ASSERT_EQ(bpf_obj_pin(fd, pin.c_str()), 0) << strerror(errno);
  ::close(fd);
  {
    int lfd = pinFd(SLUICE_PIN_LAYOUTS);
    ASSERT_GE(lfd, 0) << strerror(errno);
    sluice_layout_key k{};
    std::strncpy(k.name, SLUICE_PIN_POD_ADDRS, sizeof(k.name) - 1);
    sluice_layout_value v{1, 0};
    ASSERT_EQ(bpf_map_update_elem(lfd, &k, &v, BPF_ANY), 0) << strerror(errno);
    ::close(lfd);
  }

  auto dp = open();
  ASSERT_TRUE(dp.ok()) << dp.error().message;
  auto got = (*dp)->programs().podAddrs.lookup(a);
  ASSERT_TRUE(got) << "the address was lost";
  EXPECT_EQ(got->netns_cookie, podCookie);
  EXPECT_EQ(got->node_netns_cookie, 0u) << "left to the old build's programs";
  EXPECT_FALSE(pathExists(bpffs_.root() + "/migrate")) << "the old map stayed pinned";
  ASSERT_TRUE((*dp)->programs().podAddrs.erase(a).ok());
}

// snat_rev layout 1 kept the reverse half of a probe connection and its FIN
// flags in snat_fwd; layout 2 is one element per connection. A live
// connection of layout 1 is carried over with its forward half's flags, and
// snat_fwd leaves the root and `layouts`.
TEST_F(Layouts, SnatRevLayout1IsMergedWithSnatFwdWhichIsRetired) {
  {
    auto dp = open();
    ASSERT_TRUE(dp.ok()) << dp.error().message;
  }
  // The layout 1 state: snat_rev and snat_fwd as the build before pinned them.
  std::string rev = bpffs_.root() + "/" + SLUICE_PIN_SNAT_REV;
  std::string fwd = bpffs_.root() + "/" + SLUICE_PIN_RETIRED_SNAT_FWD;
  ASSERT_EQ(::unlink(rev.c_str()), 0);
  sluice_snat_key rk{}, fk{};
  sluice_snat_value rv{}, fv{};
  const uint8_t pod[4] = {10, 1, 0, 5}, probe[4] = {169, 254, 7, 127}, prober[4] = {10, 1, 0, 1};
  std::memcpy(rk.saddr, pod, 4);
  std::memcpy(rk.daddr, probe, 4);
  rk.sport = htons(8080);
  rk.dport = htons(40001);
  rk.family = AF_INET;
  std::memcpy(rv.addr, prober, 4);
  rv.port = htons(40000);
  rv.netns_cookie = 77;
  std::memcpy(fk.saddr, prober, 4);
  std::memcpy(fk.daddr, pod, 4);
  fk.sport = htons(40000);
  fk.dport = htons(8080);
  fk.family = AF_INET;
  std::memcpy(fv.addr, probe, 4);
  fv.port = htons(40001);
  fv.flags = SLUICE_SNAT_FIN_OUT;
  fv.netns_cookie = 77;
  for (auto [pin, k, v] : {std::tuple{rev, &rk, &rv}, std::tuple{fwd, &fk, &fv}}) {
    int fd = bpf_map_create(BPF_MAP_TYPE_LRU_HASH, pin == rev ? "snat_rev" : "snat_fwd", sizeof(sluice_snat_key),
                            sizeof(sluice_snat_value), SLUICE_SNAT_ENTRIES, nullptr);
    ASSERT_GE(fd, 0) << strerror(errno);
    ASSERT_EQ(bpf_map_update_elem(fd, k, v, BPF_ANY), 0) << strerror(errno);
    ASSERT_EQ(bpf_obj_pin(fd, pin.c_str()), 0) << strerror(errno);
    ::close(fd);
  }
  {
    int fd = pinFd(SLUICE_PIN_LAYOUTS);
    ASSERT_GE(fd, 0) << strerror(errno);
    for (const char* name : {SLUICE_PIN_SNAT_REV, SLUICE_PIN_RETIRED_SNAT_FWD}) {
      sluice_layout_key k{};
      std::strncpy(k.name, name, sizeof(k.name) - 1);
      sluice_layout_value v{1, 0};
      ASSERT_EQ(bpf_map_update_elem(fd, &k, &v, BPF_ANY), 0) << strerror(errno);
    }
    ::close(fd);
  }

  auto dp = open();
  ASSERT_TRUE(dp.ok()) << dp.error().message;
  auto got = (*dp)->programs().snatRev.lookup(rk);
  ASSERT_TRUE(got.has_value()) << "the live connection was not carried over";
  EXPECT_EQ(std::memcmp(got->addr, prober, 4), 0);
  EXPECT_EQ(got->port, htons(40000));
  EXPECT_EQ(got->flags, SLUICE_SNAT_FIN_OUT) << "the FIN flags of its snat_fwd entry";
  EXPECT_EQ(got->netns_cookie, 77u);
  EXPECT_FALSE(pathExists(fwd)) << "snat_fwd stayed pinned";
  EXPECT_FALSE(pathExists(bpffs_.root() + "/migrate")) << "the old map stayed pinned";
  sluice_layout_key k{};
  std::strncpy(k.name, SLUICE_PIN_RETIRED_SNAT_FWD, sizeof(k.name) - 1);
  EXPECT_FALSE((*dp)->programs().layouts.lookup(k).has_value()) << "snat_fwd's layout is still recorded";
  std::strncpy(k.name, SLUICE_PIN_SNAT_REV, sizeof(k.name) - 1);
  auto v = (*dp)->programs().layouts.lookup(k);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->version, uint32_t{SLUICE_LAYOUT_SNAT_REV});
}

// Probe SNAT's capacity is part of snat_rev's layout: a process that asks
// for another capacity than the pinned map's is refused, naming both.
TEST_F(Layouts, OtherSnatCapacityIsRefused) {
  {
    auto dp = open();
    ASSERT_TRUE(dp.ok()) << dp.error().message;
  }
  DatapathOptions o;
  o.bpffsRoot = bpffs_.root();
  o.snatEntries = 256;
  auto dp = Datapath::open(o);
  ASSERT_FALSE(dp.ok());
  EXPECT_NE(dp.error().message.find("pinned map 'snat_rev' differs from this build's at the same layout " +
                                    std::to_string(SLUICE_LAYOUT_SNAT_REV) + ": max entries " +
                                    std::to_string(SLUICE_SNAT_ENTRIES) + " (this build: 256)"),
            std::string::npos)
      << dp.error().message;
}

}  // namespace
}  // namespace sluice::test
