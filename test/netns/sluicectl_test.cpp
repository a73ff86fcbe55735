// sluicectl end to end: the built binary (SLUICE_BUILD_DIR/sluicectl) run as
// a separate process against a private bpffs root and test namespaces.
//
//   test process                      node netns           pod netns
//   +---------------------+           +-----------+  veth  +-------------------+
//   | spawns sluicectl    |-- pod add/list/stats/remove ---->| eth0, lo (tc)     |
//   |   --bpffs /sys/fs/  |           | server    |<------>| stand-in (in this |
//   |   bpf/sluice-t-P-N  |           |           |        |  test process)    |
//   +---------------------+           +-----------+        +-------------------+
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "enroll/datapath.h"
#include "loader/features.h"
#include "loader/netns.h"
#include "loader/probe_hook.h"
#include "test/common/istio_rules.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

std::string sluicectl() { return builtBinary("sluicectl"); }

bool pathExists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

size_t lineCount(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

/// sluicectl --bpffs ROOT [--capture tc --tc-mode MODE] ARGS... (an empty
/// MODE: the defaults, --capture auto)
CommandResult ctl(const std::string& root, const std::vector<std::string>& args, const std::string& tcMode = "") {
  std::vector<std::string> argv = {sluicectl(), "--bpffs", root};
  if (!tcMode.empty()) {
    argv.push_back("--capture");
    argv.push_back("tc");
    argv.push_back("--tc-mode");
    argv.push_back(tcMode);
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return runCommand(argv);
}

/// A stderr that is exactly one line.
void expectOneErrorLine(const CommandResult& r) {
  EXPECT_NE(r.exitCode, 0) << r.describe();
  EXPECT_EQ(lineCount(r.err), 1u) << "stderr: '" << r.err << "'";
  EXPECT_TRUE(!r.err.empty() && r.err.back() == '\n') << "stderr: '" << r.err << "'";
}

class Sluicectl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    ASSERT_TRUE(pathExists(sluicectl())) << sluicectl() << " not built";
  }
  TestBpffs bpffs_;
};

class SluicectlMode : public Sluicectl, public ::testing::WithParamInterface<std::string> {};

// pod add, pod list --json, stats --json, pod remove, each exit 0; the
// enrolled pod really redirects in between.
TEST_P(SluicectlMode, AddListStatsRemove) {
  PodTopology topo;
  ASSERT_TRUE(topo.ok()) << topo.error();
  const std::string mode = GetParam() == "auto" ? "" : GetParam();
  const std::string id = topo.pod().name();

  auto add = ctl(bpffs_.root(), {"pod", "add", "--netns", topo.pod().path()}, mode);
  ASSERT_EQ(add.exitCode, 0) << add.describe();
  EXPECT_NE(add.out.find(id), std::string::npos) << add.out;

  auto list = ctl(bpffs_.root(), {"pod", "list", "--json"});
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  auto pods = nlohmann::json::parse(list.out, nullptr, false);
  ASSERT_TRUE(pods.is_array()) << list.out;
  ASSERT_EQ(pods.size(), 1u) << list.out;
  EXPECT_EQ(pods[0]["id"], id);
  EXPECT_EQ(pods[0]["netns"], topo.pod().path());
  EXPECT_EQ(pods[0]["istio_rules"], "none") << "no Istio redirection in the pod beside sluice's";
  // auto resolves to what the kernel has: the socket where it has the
  // hooks; else tcx from 6.6, clsact before.
  const bool socket = GetParam() == "auto" && socketCaptureUnsupported().empty();
  const bool legacy = !socket && (GetParam() == "legacy" || !tcModeUnsupported(TcMode::Tcx).empty());
  EXPECT_EQ(pods[0]["capture"], socket ? "socket" : "tc");
  if (!socket) {
    EXPECT_EQ(pods[0]["tc_mode"], legacy ? "legacy" : "tcx");
  }
  EXPECT_NE(add.out.find(socket ? "(socket)" : legacy ? "(legacy)" : "(tcx)"), std::string::npos) << add.out;
  if (socket) {
    EXPECT_TRUE(pathExists(bpffs_.linkDir(id) + "/sk_lookup"));
  } else if (legacy) {
    auto q = sh("tc -n " + topo.pod().name() + " qdisc show dev eth0");
    EXPECT_NE(q.out.find("clsact"), std::string::npos) << q.out;
  } else {
    EXPECT_TRUE(pathExists(bpffs_.linkDir(id) + "/eth0_egress"));
  }

  // Traffic through the pod enrolled by the CLI goes to the stand-in.
  {
    StandInConfig cfg = testStandInConfig(socket ? CaptureMode::Socket : CaptureMode::Tc);
    cfg.netnsPath = topo.pod().path();
    auto standIn = ProxyStandIn::start(cfg);
    ASSERT_TRUE(standIn.ok()) << standIn.error().message;
    auto server = TcpServer::start(topo.node(), Endpoint::of(PodTopology::kNodeV4, 0));
    ASSERT_TRUE(server.ok());
    auto c = tcpConnect(topo.pod(), (*server)->local());
    ASSERT_TRUE(c.ok()) << c.error().message;
    ASSERT_TRUE(echoRoundTrip(c->get(), "cli").ok());
    ASSERT_TRUE((*standIn)->waitForEvents(1, kIoTimeout));
    EXPECT_EQ((*standIn)->events().front().listener, "outbound");
  }

  auto stats = ctl(bpffs_.root(), {"stats", "--json"});
  ASSERT_EQ(stats.exitCode, 0) << stats.describe();
  auto counters = nlohmann::json::parse(stats.out, nullptr, false);
  ASSERT_TRUE(counters.is_array()) << stats.out;
  ASSERT_EQ(counters.size(), 1u) << stats.out;
  EXPECT_EQ(counters[0]["id"], id);
  EXPECT_GE(counters[0]["outbound_conns"].get<uint64_t>(), 1u) << stats.out;

  auto one = ctl(bpffs_.root(), {"stats", "--id", id, "--json"});
  EXPECT_EQ(one.exitCode, 0) << one.describe();

  auto remove = ctl(bpffs_.root(), {"pod", "remove", "--id", id});
  ASSERT_EQ(remove.exitCode, 0) << remove.describe();
  list = ctl(bpffs_.root(), {"pod", "list", "--json"});
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  pods = nlohmann::json::parse(list.out, nullptr, false);
  ASSERT_TRUE(pods.is_array()) << list.out;
  EXPECT_TRUE(pods.empty()) << list.out;
  EXPECT_FALSE(pathExists(bpffs_.linkDir(id)));
  auto q = sh("tc -n " + topo.pod().name() + " qdisc show dev eth0");
  EXPECT_EQ(q.out.find("clsact"), std::string::npos) << q.out;
  auto rules = topo.pod().ip("rule show");
  EXPECT_EQ(rules.out.find("fwmark 0x111"), std::string::npos) << rules.out;
}

// A pod that still carries Istio's in-pod rules beside sluice's (enrolled
// by both agents: two redirections at once): pod list says what is there.
TEST_F(Sluicectl, PodListShowsIstioRulesLeftInThePod) {
  PodTopology topo;
  ASSERT_TRUE(topo.ok()) << topo.error();
  ASSERT_TRUE(applyIstioInpod(topo.pod(), IstioBackend::IptablesNft, true).ok());
  auto add = ctl(bpffs_.root(), {"pod", "add", "--netns", topo.pod().path()});
  ASSERT_EQ(add.exitCode, 0) << add.describe();
  auto list = ctl(bpffs_.root(), {"pod", "list", "--json"});
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  auto pods = nlohmann::json::parse(list.out, nullptr, false);
  ASSERT_TRUE(pods.is_array() && pods.size() == 1u) << list.out;
  const std::string rules = pods[0]["istio_rules"].get<std::string>();
  EXPECT_NE(rules.find("iptables-nft IPv4: ISTIO_OUTPUT, ISTIO_PRERT"), std::string::npos) << rules;
  auto text = ctl(bpffs_.root(), {"pod", "list"});
  EXPECT_NE(text.out.find("ISTIO_RULES"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("iptables-nft IPv6: ISTIO_OUTPUT, ISTIO_PRERT"), std::string::npos) << text.out;
  EXPECT_EQ(ctl(bpffs_.root(), {"pod", "remove", "--id", topo.pod().name()}).exitCode, 0);
}

// pod check and pod list's CHECK column: a socket-mode pod whose proxy
// listens but whose listeners pod_sk_lookup no longer knows (as a
// re-created sock_listeners leaves it) is named, one line a listener, exit
// 1; checking changes nothing.
TEST_F(Sluicectl, PodCheckNamesProxyListenersTheLookupDoesNotKnow) {
  if (std::string why = socketCaptureUnsupported(); !why.empty()) GTEST_SKIP() << why;
  PodTopology topo;
  ASSERT_TRUE(topo.ok()) << topo.error();
  const std::string id = topo.pod().name();
  StandInConfig cfg = testStandInConfig(CaptureMode::Socket);
  cfg.netnsPath = topo.pod().path();
  auto standIn = ProxyStandIn::start(cfg);  // listening before the pod is enrolled
  ASSERT_TRUE(standIn.ok()) << standIn.error().message;
  auto add = ctl(bpffs_.root(), {"pod", "add", "--netns", topo.pod().path()});
  ASSERT_EQ(add.exitCode, 0) << add.describe();
  auto intact = ctl(bpffs_.root(), {"pod", "check", "--id", id});
  EXPECT_EQ(intact.exitCode, 0) << intact.describe();
  EXPECT_EQ(intact.out, "pod " + id + ": intact\n");

  const std::string pin = bpffs_.root() + "/" + SLUICE_PIN_SOCK_LISTENERS;
  Fd map(::bpf_obj_get(pin.c_str()));
  ASSERT_TRUE(map.valid()) << pin << ": " << std::strerror(errno);
  // Only this pod's: the node's sockops hook keeps every proxy listener of
  // the node, enrolled or not yet (other tests' stand-ins too).
  Fd podNs(::open(topo.pod().path().c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(podNs.valid()) << std::strerror(errno);
  auto cookie = netnsCookie(podNs.get());
  ASSERT_TRUE(cookie.ok()) << cookie.error().message;
  auto podKeys = [&] {
    sluice_sock_listener_key k{}, next{};
    std::vector<sluice_sock_listener_key> keys;
    for (const void* prev = nullptr; ::bpf_map_get_next_key(map.get(), prev, &next) == 0; prev = &k) {
      if (next.netns_cookie == *cookie) keys.push_back(next);
      k = next;
    }
    return keys;
  };
  const auto keys = podKeys();
  ASSERT_FALSE(keys.empty());
  for (const auto& key : keys) ASSERT_EQ(::bpf_map_delete_elem(map.get(), &key), 0);

  auto broken = ctl(bpffs_.root(), {"pod", "check", "--id", id});
  EXPECT_EQ(broken.exitCode, 1) << broken.describe();
  EXPECT_NE(broken.out.find("pod " + id + ": 2 problem(s)"), std::string::npos) << broken.out;
  EXPECT_NE(broken.out.find("the proxy's IPv6 listener on :15006"), std::string::npos) << broken.out;
  EXPECT_NE(broken.out.find("is not in sock_listeners"), std::string::npos) << broken.out;
  auto list = ctl(bpffs_.root(), {"pod", "list", "--json"});
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  auto pods = nlohmann::json::parse(list.out, nullptr, false);
  ASSERT_TRUE(pods.is_array() && pods.size() == 1u) << list.out;
  EXPECT_EQ(pods[0]["problems"].size(), 2u) << list.out;
  auto text = ctl(bpffs_.root(), {"pod", "list"});
  EXPECT_NE(text.out.find("CHECK"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("2: the proxy's"), std::string::npos) << text.out;

  // Check changes nothing (the agent's sweep repairs: SocketRedirect.SweepRegistersListenersTheMapLost).
  EXPECT_TRUE(podKeys().empty()) << "check registered something";
  auto usage = ctl(bpffs_.root(), {"pod", "check"});
  EXPECT_EQ(usage.exitCode, 2) << usage.describe();
  EXPECT_NE(usage.err.find("pod check needs --id NAME"), std::string::npos) << usage.err;
  EXPECT_EQ(ctl(bpffs_.root(), {"pod", "remove", "--id", id}).exitCode, 0);
}

// sluicectl works beside the agent: it enrolls with the node's settings
// the agent pinned (its --host-probe-snat-ip[v6], say), never replacing
// them with its own defaults.
TEST_F(Sluicectl, PodAddKeepsTheSettingsTheAgentPinned) {
  Settings agents;
  agents.probeV4 = "169.254.7.202";
  agents.probeV6 = "fd16:9254:7127:1337::ca";
  {
    DatapathOptions o;
    o.bpffsRoot = bpffs_.root();
    o.settings = agents;
    o.podGuard = false;
    auto dp = Datapath::open(o);  // as the agent's start does, no pod yet
    ASSERT_TRUE(dp.ok()) << dp.error().message;
  }
  PodTopology topo;
  ASSERT_TRUE(topo.ok()) << topo.error();
  auto add = ctl(bpffs_.root(), {"pod", "add", "--netns", topo.pod().path(), "--node-netns", topo.node().path()});
  ASSERT_EQ(add.exitCode, 0) << add.describe();
  const std::string pin = bpffs_.root() + "/" + SLUICE_PIN_SETTINGS;
  Fd fd(::bpf_obj_get(pin.c_str()));
  ASSERT_TRUE(fd.valid()) << pin << ": " << std::strerror(errno);
  const uint32_t zero = 0;
  sluice_settings now{};
  ASSERT_EQ(::bpf_map_lookup_elem(fd.get(), &zero, &now), 0) << std::strerror(errno);
  EXPECT_EQ(decodeSettings(now).probeV4, agents.probeV4);
  EXPECT_EQ(decodeSettings(now).probeV6, agents.probeV6);
  std::vector<std::string> missing;
  Status st = topo.node().run([&]() -> Status {
    missing = checkProbeAddrs(agents.probeV4, agents.probeV6);
    return {};
  });
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_TRUE(missing.empty()) << "the node side added the agent's addresses: " << missing.at(0);
  auto check = ctl(bpffs_.root(), {"pod", "check", "--id", topo.pod().name()});
  EXPECT_EQ(check.exitCode, 0) << check.describe();
  EXPECT_EQ(ctl(bpffs_.root(), {"pod", "remove", "--id", topo.pod().name()}).exitCode, 0);
}

// pod remove --netns finds the pod by its namespace.
TEST_P(SluicectlMode, RemoveByNetns) {
  PodTopology topo;
  ASSERT_TRUE(topo.ok()) << topo.error();
  const std::string mode = GetParam() == "auto" ? "" : GetParam();
  auto add = ctl(bpffs_.root(), {"pod", "add", "--netns", topo.pod().path(), "--id", "by-netns"}, mode);
  ASSERT_EQ(add.exitCode, 0) << add.describe();
  auto remove = ctl(bpffs_.root(), {"pod", "remove", "--netns", topo.pod().path()});
  ASSERT_EQ(remove.exitCode, 0) << remove.describe();
  EXPECT_NE(remove.out.find("by-netns"), std::string::npos) << remove.out;
}

INSTANTIATE_TEST_SUITE_P(All, SluicectlMode, ::testing::Values("auto", "legacy"),
                         [](const auto& info) { return info.param; });

// The SO_REUSEPORT warning is printed where captured connections would
// really be lost: a pod captured at TC on a kernel whose bpf_sk_assign
// cannot pick a reuseport listener (before 6.6) — never for a pod captured
// at the socket (sk_lookup honours reuseport groups on every kernel of
// that mode), never on a kernel that can.
TEST_F(Sluicectl, ReuseportWarningOnlyWhereTheCaptureCannotServeIt) {
  auto features = kernelFeatures();
  ASSERT_TRUE(features.ok()) << features.error().message;
  const std::string warning = "cannot hand packets to SO_REUSEPORT sockets";
  PodTopology tc, socket;
  ASSERT_TRUE(tc.ok()) << tc.error();
  ASSERT_TRUE(socket.ok()) << socket.error();
  auto addTc = ctl(bpffs_.root(), {"--capture", "tc", "pod", "add", "--netns", tc.pod().path()});
  ASSERT_EQ(addTc.exitCode, 0) << addTc.describe();
  if (features->reuseportAssign.present)
    EXPECT_EQ(addTc.err.find(warning), std::string::npos) << "kernel " << features->release << " can: " << addTc.err;
  else
    EXPECT_NE(addTc.err.find(warning), std::string::npos) << "kernel " << features->release << " cannot: " << addTc.err;
  if (std::string why = socketUnavailableReason(*features); !why.empty()) {
    std::cout << "socket capture not checked: " << why << "\n";
  } else {
    auto addSocket = ctl(bpffs_.root(), {"--capture", "socket", "pod", "add", "--netns", socket.pod().path()});
    ASSERT_EQ(addSocket.exitCode, 0) << addSocket.describe();
    EXPECT_EQ(addSocket.err.find(warning), std::string::npos) << addSocket.err;
    EXPECT_EQ(ctl(bpffs_.root(), {"pod", "remove", "--id", socket.pod().name()}).exitCode, 0);
  }
  EXPECT_EQ(ctl(bpffs_.root(), {"pod", "remove", "--id", tc.pod().name()}).exitCode, 0);
}

TEST_F(Sluicectl, NonexistentNetnsFailsWithOneLineNamingIt) {
  std::string missing = "/run/netns/sluice-missing-cli-" + std::to_string(::getpid());
  auto r = ctl(bpffs_.root(), {"pod", "add", "--netns", missing});
  expectOneErrorLine(r);
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(Sluicectl, OtherNamespaceTypeIsNotANetworkNamespace) {
  auto r = ctl(bpffs_.root(), {"pod", "add", "--netns", "/proc/self/ns/mnt", "--id", "mnt"});
  expectOneErrorLine(r);
  EXPECT_NE(r.err.find("not a network namespace"), std::string::npos) << r.err;
}

TEST_F(Sluicectl, RemoveUnknownPodFails) {
  auto r = ctl(bpffs_.root(), {"pod", "remove", "--id", "no-such-pod"});
  expectOneErrorLine(r);
  EXPECT_NE(r.err.find("not enrolled"), std::string::npos) << r.err;
}

// Without root: a clear message, not a libbpf trace.
CommandResult unprivileged(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"setpriv",       "--reuid=65534",  "--regid=65534", "--clear-groups",
                                   "--inh-caps=-all", "--bounding-set=-all", sluicectl()};
  argv.insert(argv.end(), args.begin(), args.end());
  return runCommand(argv);
}

TEST_F(Sluicectl, WithoutPrivilegeFailsWithAClearMessage) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--bpffs", bpffs_.root(), "pod", "list"},
           {"--bpffs", bpffs_.root(), "pod", "add", "--netns", "/proc/self/ns/net", "--id", "nobody"}}) {
    auto r = unprivileged(args);
    EXPECT_NE(r.exitCode, 0) << r.describe();
    EXPECT_TRUE(r.err.find("privilege") != std::string::npos || r.err.find("root") != std::string::npos)
        << r.describe();
    EXPECT_EQ(lineCount(r.err), 1u) << r.describe();
  }
}

// A failed unprivileged run must not leave a directory behind: /sys/fs/bpf
// is world-writable (sticky), and a root directory owned by an unprivileged
// user would later hold root's pinned state.
TEST_F(Sluicectl, WithoutPrivilegeCreatesNoBpffsRoot) {
  auto r = unprivileged({"--bpffs", bpffs_.root(), "pod", "list"});
  EXPECT_NE(r.exitCode, 0) << r.describe();
  struct stat st {};
  bool exists = ::lstat(bpffs_.root().c_str(), &st) == 0;
  EXPECT_FALSE(exists) << bpffs_.root() << " was created by uid " << st.st_uid << " (mode " << std::oct
                       << (st.st_mode & 07777) << ")";
}

// Two `pod add` processes started together on the same (new) bpffs root:
// the state lock serializes them, both pods end up enrolled.
TEST_F(Sluicectl, ConcurrentAddsBothSucceed) {
  PodTopology a, b;
  ASSERT_TRUE(a.ok()) << a.error();
  ASSERT_TRUE(b.ok()) << b.error();
  auto pa = Subprocess::start({sluicectl(), "--bpffs", bpffs_.root(), "pod", "add", "--netns", a.pod().path()});
  auto pb = Subprocess::start({sluicectl(), "--bpffs", bpffs_.root(), "pod", "add", "--netns", b.pod().path()});
  ASSERT_TRUE(pa.ok() && pb.ok());
  auto ra = (*pa)->wait();
  auto rb = (*pb)->wait();
  EXPECT_EQ(ra.exitCode, 0) << ra.describe();
  EXPECT_EQ(rb.exitCode, 0) << rb.describe();

  auto list = ctl(bpffs_.root(), {"pod", "list", "--json"});
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  auto pods = nlohmann::json::parse(list.out, nullptr, false);
  ASSERT_TRUE(pods.is_array()) << list.out;
  std::vector<std::string> ids;
  for (const auto& p : pods) ids.push_back(p["id"].get<std::string>());
  EXPECT_NE(std::find(ids.begin(), ids.end(), a.pod().name()), ids.end()) << list.out;
  EXPECT_NE(std::find(ids.begin(), ids.end(), b.pod().name()), ids.end()) << list.out;

  // And both can be removed concurrently too.
  auto qa = Subprocess::start({sluicectl(), "--bpffs", bpffs_.root(), "pod", "remove", "--id", a.pod().name()});
  auto qb = Subprocess::start({sluicectl(), "--bpffs", bpffs_.root(), "pod", "remove", "--id", b.pod().name()});
  ASSERT_TRUE(qa.ok() && qb.ok());
  auto sa = (*qa)->wait();
  auto sb = (*qb)->wait();
  EXPECT_EQ(sa.exitCode, 0) << sa.describe();
  EXPECT_EQ(sb.exitCode, 0) << sb.describe();
}

}  // namespace
}  // namespace sluice::test
