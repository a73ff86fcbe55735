// A real container runtime drives sluice-cni (issue 15, item 8): Debian's
// podman (CNI network backend, runc) runs containers from a plain busybox
// directory (--rootfs) inside a test node netns. Its network's conflist is
// bridge + host-local with sluice-cni chained by `sluice-cni install`;
// sluiced runs in the node netns; the stand-in listens in the container's
// netns (the proxy's place). Nothing here plays the runtime: podman creates
// the netns, runs the chain (ADD on run, DEL on rm) and passes its own
// CNI_ARGS.
//
//   remote netns                node netns "sluice-pmnode-P-N"                 container netns (podman's)
//   +-------------+  veth  +------------------------------------------+ veth +----------------------------+
//   | client      |------->| uplink 192.168.240.1   ip_forward        |      | eth0 10.233.N.2 (host-local)|
//   | .240.2      | routed | sluiced (nsenter --net), echo server     |----->| nc -ll -p 8080 -e cat (app) |
//   +-------------+        | pmbrN 10.233.N.1/24 (bridge, gateway)    |      | stand-in 15001/6/8, 15053   |
//                          | podman, conmon, runc (nsenter --net)     |      |   (in this test process)    |
//                          +------------------------------------------+      +----------------------------+
//
// Podman gets a private everything (CONTAINERS_CONF / CONTAINERS_STORAGE_CONF
// under a TempDir: root, runroot, tmp dir, file locks, events log, network
// config dir), so the machine's podman state is never touched; the sandbox's
// traps (no CAP_SYS_RESOURCE; crun refuses hybrid cgroups) are avoided with
// default_ulimits = [], explicit --ulimit values and runc. Containers are
// removed (`podman rm -af`) by RAII even when an assertion fails.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "loader/bpffs.h"
#include "test/common/agent_process.h"
#include "test/common/cni_conf.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"
#include "userspace/cni/cni.h"

namespace sluice::test {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kPodman = "/usr/bin/podman";
constexpr const char* kRunc = "/usr/bin/runc";
constexpr const char* kBusybox = "/bin/busybox";
constexpr const char* kSystemCniDir = "/usr/lib/cni";

// runc needs a cgroup filesystem (v1 or v2) in its mount table.
bool cgroupsMounted() {
  for (const auto& m : parseMountinfo(readTextFile("/proc/self/mountinfo")))
    if (m.fsType == "cgroup" || m.fsType == "cgroup2") return true;
  return false;
}

bool isFile(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::atomic<int> gCounter{0};

/// A private podman: its configuration, storage and state under one
/// directory, run inside a node netns. Removes its containers when it goes.
class Podman {
 public:
  Podman(const TestNetns& node, const TempDir& work, const std::string& netConfDir, const std::string& binDir)
      : node_(node) {
    for (const char* d : {"root", "runroot", "tmp"}) fs::create_directories(work.file(std::string("podman/") + d));
    conf_ = work.file("podman/containers.conf");
    storage_ = work.file("podman/storage.conf");
    // No CAP_SYS_RESOURCE here: no default ulimits (podman would raise
    // them). cgroupfs + runc: crun refuses this machine's hybrid cgroups.
    // lock_type file: no /dev/shm/libpod_lock shared with the machine.
    writeTextFile(conf_, "[containers]\n"
                         "default_ulimits = []\n"
                         "[network]\n"
                         "network_backend = \"cni\"\n"
                         "cni_plugin_dirs = [\"" + binDir + "\", \"" + kSystemCniDir + "\"]\n"
                         "network_config_dir = \"" + netConfDir + "\"\n"
                         "[engine]\n"
                         "runtime = \"runc\"\n"
                         "cgroup_manager = \"cgroupfs\"\n"
                         "lock_type = \"file\"\n"
                         "events_logger = \"file\"\n"
                         "events_logfile_path = \"" + work.file("podman/events.log") + "\"\n"
                         "tmp_dir = \"" + work.file("podman/tmp") + "\"\n");
    writeTextFile(storage_, "[storage]\n"
                            "driver = \"vfs\"\n"
                            "graphroot = \"" + work.file("podman/root") + "\"\n"
                            "runroot = \"" + work.file("podman/runroot") + "\"\n");
  }
  ~Podman() {
    // Containers first (podman runs the chain's DEL, unmounts their netns).
    (void)run({"rm", "--all", "--force", "--time", "0"});
  }
  Podman(const Podman&) = delete;
  Podman& operator=(const Podman&) = delete;

  /// `podman ARGS` in the node netns with the private configuration.
  CommandResult run(const std::vector<std::string>& args, std::chrono::milliseconds timeout = 90s) const {
    std::vector<std::string> argv = {"/usr/bin/env", "-i",
                                     "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                                     "CONTAINERS_CONF=" + conf_, "CONTAINERS_STORAGE_CONF=" + storage_,
                                     "/usr/bin/nsenter", "--net=" + node_.path(), kPodman};
    argv.insert(argv.end(), args.begin(), args.end());
    return runCommand(argv, timeout);
  }

  /// `podman inspect --format FORMAT NAME`, trimmed.
  std::string inspect(const std::string& name, const std::string& format) const {
    auto r = run({"inspect", "--format", format, name});
    std::string s = r.out;
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return r.exitCode == 0 ? s : "";
  }

 private:
  const TestNetns& node_;
  std::string conf_, storage_;
};

class PodmanRuntime : public ::testing::TestWithParam<TcMode> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF, containers)";
    if (std::string why = tcModeUnsupported(GetParam()); !why.empty()) GTEST_SKIP() << why;
    for (const char* p : {kPodman, kRunc, kBusybox})
      if (!isFile(p)) GTEST_SKIP() << p << " missing: install podman, runc and busybox-static (scripts/install-deps.sh)";
    if (!cgroupsMounted())
      GTEST_SKIP() << "no cgroup filesystem mounted: runc cannot create a container (the 6.1 guest of "
                      "vagrant/run-local.sh mounts none)";
    for (const char* p : {"bridge", "host-local"})
      if (!isFile(std::string(kSystemCniDir) + "/" + p))
        GTEST_SKIP() << kSystemCniDir << "/" << p << " missing: install containernetworking-plugins";
    ASSERT_TRUE(node_.ok()) << node_.error();
    ASSERT_TRUE(remote_.ok()) << remote_.error();
    ASSERT_FALSE(work_.path().empty());
    n_ = gCounter++ % 200;
    subnet_ = "10.233." + std::to_string(n_) + ".";
    network_ = "sluice-pm-" + std::to_string(::getpid()) + "-" + std::to_string(n_);
    buildRootfs();
    buildRemote();
    writeConflist();
    podman_ = std::make_unique<Podman>(node_, work_, work_.file("net.d"), work_.file("bin"));
    auto a = AgentProcess::start(bpffs_.root(), {"--tc-mode", modeName(GetParam())}, work_.file("agent.sock"), node_.path());
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
  }
  void TearDown() override {
    standIn_.reset();
    podman_.reset();  // rm -af: the chain's DEL through the running agent
    if (agent_) {
      if (auto c = agent_->client(); c.ok())
        if (auto pods = c->listPods(); pods.ok())
          for (const auto& p : *pods) (void)c->removePod(p.id);
    }
    agent_.reset();
  }

  /// busybox and the applets the containers use, nothing else.
  void buildRootfs() {
    std::string root = work_.file("rootfs");
    for (const char* d : {"bin", "etc", "proc", "sys", "dev", "tmp"}) ASSERT_TRUE(fs::create_directories(root + "/" + d));
    fs::copy_file(kBusybox, root + "/bin/busybox");
    for (const char* applet : {"sh", "nc", "nslookup", "cat", "echo", "sleep", "ip"})
      fs::create_symlink("busybox", root + "/bin/" + applet);
    ASSERT_TRUE(writeTextFile(root + "/etc/passwd", "root:x:0:0:root:/:/bin/sh\n"));
  }

  /// The remote node: routed through the node netns to the pod subnet.
  void buildRemote() {
    std::string up = "pmup" + std::to_string(::getpid() % 10000) + "-" + std::to_string(n_);
    std::string net = "192.168." + std::to_string(240 + n_ % 10) + ".";
    ASSERT_EQ(sh("ip link add " + up + " netns " + node_.name() + " type veth peer name eth0 netns " + remote_.name()).exitCode, 0);
    for (const auto& c : {node_.ip("addr add " + net + "1/24 dev " + up), node_.ip("link set " + up + " up"),
                          remote_.ip("addr add " + net + "2/24 dev eth0"), remote_.ip("link set eth0 up"),
                          remote_.ip("route add " + subnet_ + "0/24 via " + net + "1")})
      ASSERT_EQ(c.exitCode, 0) << c.describe();
    ASSERT_TRUE(node_.setSysctl("net/ipv4/ip_forward", "1").ok());
    remoteIp_ = net + "2";
  }

  /// bridge + host-local, then `sluice-cni install` appends sluice-cni.
  void writeConflist() {
    for (const char* d : {"net.d", "bin", "ipam"}) ASSERT_TRUE(fs::create_directories(work_.file(d)));
    std::string bridge = "pmbr" + std::to_string(::getpid() % 10000) + "-" + std::to_string(n_);
    auto installed = installBridgeConflist({work_.file("net.d"), work_.file("bin"), "10-" + network_ + ".conflist",
                                            network_, bridge, subnet_, work_.file("ipam"), work_.file("agent.sock")});
    ASSERT_TRUE(installed.ok()) << installed.error().message;
    // Debug level: sluice-cni logs the CNI_ARGS it got. Podman drops the
    // stderr of a plugin that succeeds, so the log goes to a file too.
    (*installed)["plugins"].back()["logLevel"] = "debug";
    (*installed)["plugins"].back()["logFile"] = work_.file("sluice-cni.log");
    ASSERT_TRUE(writeTextFile(work_.file("net.d/10-" + network_ + ".conflist"), installed->dump(2)));
  }

  /// podman run -d: a persistent echo server on :8080 as the app.
  CommandResult runContainer(const std::string& name) {
    return podman_->run({"run", "--detach", "--name", name, "--network", network_, "--ulimit", "nofile=1024:1024",
                         "--ulimit", "nproc=1024:1024", "--rootfs", work_.file("rootfs"), "/bin/nc", "-ll", "-p",
                         "8080", "-e", "/bin/cat"});
  }

  CommandResult exec(const std::string& name, const std::string& script) {
    return podman_->run({"exec", name, "/bin/sh", "-c", script}, 30s);
  }

  std::vector<PodInfo> pods() {
    auto c = agent_->client();
    EXPECT_TRUE(c.ok()) << c.error().message;
    if (!c.ok()) return {};
    auto p = c->listPods();
    EXPECT_TRUE(p.ok()) << p.error().message;
    return p.ok() ? *p : std::vector<PodInfo>{};
  }

  std::vector<ProxyEvent> events(const std::string& listener) {
    std::vector<ProxyEvent> out;
    for (const auto& e : standIn_->events())
      if (e.listener == listener) out.push_back(e);
    return out;
  }

  TestBpffs bpffs_;
  TempDir work_{"podman"};
  TestNetns node_{"pmnode"};
  TestNetns remote_{"pmremote"};
  std::unique_ptr<AgentProcess> agent_;
  std::unique_ptr<Podman> podman_;
  std::unique_ptr<ProxyStandIn> standIn_;
  int n_ = 0;
  std::string subnet_, network_, remoteIp_;
};

// The whole life of a container under podman: run (ADD enrolls it, with
// podman's CNI_ARGS), its outbound TCP, inbound TCP and DNS reach the
// stand-in, a node-local connection is a probe (not captured), rm (DEL)
// removes it from sluice.
TEST_P(PodmanRuntime, ContainerTrafficGoesThroughTheStandInAndRmRemovesThePod) {
  const std::string name = "web-" + std::to_string(n_);
  auto run = runContainer(name);
  ASSERT_EQ(run.exitCode, 0) << run.describe() << "\n" << agent_->log();
  std::string id = run.out.substr(0, run.out.find('\n'));
  ASSERT_EQ(id.size(), 64u) << run.out;
  const std::string sandbox = podman_->inspect(name, "{{.NetworkSettings.SandboxKey}}");
  const std::string ip = podman_->inspect(name, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}");
  ASSERT_FALSE(sandbox.empty());
  ASSERT_EQ(ip, subnet_ + "2");

  // What podman passed, as sluice-cni saw it: only the container's name
  // (no K8S_POD_NAMESPACE / K8S_POD_UID), which names the pod in its log.
  std::string cniLog = readTextFile(work_.file("sluice-cni.log"));
  EXPECT_NE(cniLog.find("debug sluice-cni: ADD " + id + ": CNI_ARGS: IgnoreUnknown=1;K8S_POD_NAME=" + name + "\n"),
            std::string::npos)
      << cniLog;
  EXPECT_NE(cniLog.find("info sluice-cni: enrolled pod " + cni::podIdForContainer(id) + " (" + name + ") (netns " +
                        sandbox),
            std::string::npos)
      << cniLog;

  // Enrolled by the agent under the container's id, with podman's netns.
  auto enrolled = pods();
  ASSERT_EQ(enrolled.size(), 1u) << agent_->log();
  EXPECT_EQ(enrolled[0].id, cni::podIdForContainer(id));
  EXPECT_EQ(enrolled[0].netnsPath, sandbox);
  EXPECT_EQ(enrolled[0].ips, std::vector<std::string>{ip});
  EXPECT_EQ(enrolled[0].tcMode, modeName(GetParam()));
  EXPECT_FALSE(enrolled[0].hostIface.empty()) << "probe SNAT on the bridge port";
  // Podman's K8S_POD_NAME is the pod's name; it passes no uid or namespace.
  EXPECT_EQ(enrolled[0].identity, (PodIdentity{"", name, "", ""}));

  // The proxy's place: the stand-in in the container's netns.
  StandInConfig cfg = testStandInConfig();
  cfg.netnsPath = sandbox;
  auto s = ProxyStandIn::start(cfg);
  ASSERT_TRUE(s.ok()) << s.error().message;
  standIn_ = std::move(*s);

  // Outbound: the container's nc to a server on the node.
  auto server = TcpServer::start(node_, Endpoint::any(AF_INET));
  ASSERT_TRUE(server.ok()) << server.error().message;
  uint16_t port = (*server)->port();
  auto out = exec(name, "echo out-hello | nc -w 5 " + subnet_ + "1 " + std::to_string(port));
  EXPECT_EQ(out.exitCode, 0) << out.describe();
  EXPECT_EQ(out.out, "out-hello\n") << out.describe();
  ASSERT_TRUE(standIn_->waitForEvents(1, kIoTimeout));
  auto ev = events("outbound");
  ASSERT_EQ(ev.size(), 1u) << describe(standIn_->events());
  EXPECT_EQ(ev[0].origDst, subnet_ + "1:" + std::to_string(port));
  EXPECT_EQ(ev[0].detail, "upstream ok");
  ASSERT_TRUE((*server)->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ((*server)->peers()[0].ip(), ip);

  // Inbound: a remote client routed through the node to the app.
  {
    auto c = tcpConnect(remote_, Endpoint::of(ip, 8080));
    ASSERT_TRUE(c.ok()) << c.error().message << describe(standIn_->events());
    auto echoed = echoRoundTrip(c->get(), "in-hello");
    ASSERT_TRUE(echoed.ok()) << echoed.error().message << describe(standIn_->events());
    EXPECT_EQ(*echoed, "in-hello");
  }
  ev = events("inbound");
  ASSERT_EQ(ev.size(), 1u) << describe(standIn_->events());
  EXPECT_EQ(ev[0].origDst, ip + ":8080");
  EXPECT_EQ(ev[0].peer.substr(0, ev[0].peer.rfind(':')), remoteIp_);
  EXPECT_EQ(ev[0].detail, "upstream ok");

  // DNS: busybox nslookup asks the gateway, where nothing listens on :53;
  // only the stand-in can answer.
  auto dns = exec(name, "nslookup -type=a sluice.example.com " + subnet_ + "1");
  EXPECT_EQ(dns.exitCode, 0) << dns.describe();
  EXPECT_NE(dns.out.find("Address: " + cfg.dnsAnswerV4), std::string::npos) << dns.describe();
  ev = events("dns-udp");
  ASSERT_FALSE(ev.empty()) << describe(standIn_->events());
  EXPECT_EQ(ev[0].detail, "sluice.example.com A");

  // A connection from the node itself is a kubelet probe: translated to
  // 169.254.7.127 on the node and delivered to the app, not the stand-in.
  size_t before = standIn_->events().size();
  {
    auto c = tcpConnect(node_, Endpoint::of(ip, 8080));
    ASSERT_TRUE(c.ok()) << c.error().message;
    auto echoed = echoRoundTrip(c->get(), "probe");
    ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  }
  EXPECT_EQ(standIn_->events().size(), before) << describe(standIn_->events());

  // podman rm: the chain's DEL takes the pod out of sluice.
  standIn_.reset();
  auto rm = podman_->run({"rm", "--force", "--time", "0", name});
  ASSERT_EQ(rm.exitCode, 0) << rm.describe();
  cniLog = readTextFile(work_.file("sluice-cni.log"));
  EXPECT_NE(cniLog.find("debug sluice-cni: DEL " + id + ": CNI_ARGS: IgnoreUnknown=1;K8S_POD_NAME=" + name + "\n"),
            std::string::npos)
      << cniLog;
  EXPECT_NE(cniLog.find("info sluice-cni: removed pod " + cni::podIdForContainer(id) + " (" + name + ")\n"),
            std::string::npos)
      << cniLog;
  EXPECT_TRUE(pods().empty()) << agent_->log();
  struct stat st {};
  EXPECT_NE(::stat(sandbox.c_str(), &st), 0) << sandbox << " still exists";
  EXPECT_EQ(podman_->run({"ps", "--all", "--quiet"}).out, "");
}

INSTANTIATE_TEST_SUITE_P(All, PodmanRuntime, ::testing::Values(TcMode::Tcx, TcMode::Legacy),
                         [](const auto& info) { return std::string(modeName(info.param)); });

}  // namespace
}  // namespace sluice::test
