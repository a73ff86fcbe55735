// sluice-cni runs on any node (issue 15, item 2): a static executable that
// needs no shared library. Proven by running its ADD, DEL and VERSION inside
// an empty chroot that holds nothing but the binary, the pod's netns file
// (bind-mounted at the path the runtime passes) and the agent's socket.
//
//   host                                        chroot C (nothing else in it)
//   sluiced --socket C/run/sluice/agent.sock    /sluice-cni
//     (nsenter --net=node)          <──JSON──   /run/sluice/agent.sock   (the agent's socket)
//   /run/netns/sluice-pod-P-N  ──bind mount──▶  /run/netns/sluice-pod-P-N
//
//   node netns  vethpod 10.200.0.1 <────> eth0 10.200.0.2  pod netns
#include <dirent.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <set>

#include "test/common/agent_process.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

/// A bind mount, undone (detached) by the destructor.
class BindMount {
 public:
  BindMount(const std::string& from, const std::string& to) : to_(to) {
    if (::mount(from.c_str(), to.c_str(), nullptr, MS_BIND, nullptr) == 0)
      mounted_ = true;
    else
      error_ = "bind " + from + " on " + to + ": " + std::strerror(errno);
  }
  ~BindMount() {
    if (mounted_) ::umount2(to_.c_str(), MNT_DETACH);
  }
  BindMount(const BindMount&) = delete;
  BindMount& operator=(const BindMount&) = delete;
  bool ok() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::string to_, error_;
  bool mounted_ = false;
};

std::string shellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// Every path under @p root, relative to it.
std::set<std::string> treeOf(const std::string& root) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) out.insert(fs::relative(e.path(), root).string());
  return out;
}

class StaticCni : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (chroot, bind mounts, network namespaces, BPF)";
    ASSERT_TRUE(topo_.ok()) << topo_.error();
    ASSERT_FALSE(root_.path().empty());
    netns_ = "/run/netns/" + topo_.pod().name();
    // The chroot: the binary, the netns file at the runtime's path, and the
    // directory of the agent's socket. Nothing else: no /lib, /etc, /proc, /dev.
    fs::copy_file(builtBinary("sluice-cni"), root_.file("sluice-cni"));
    fs::create_directories(root_.file("run/netns"));
    fs::create_directories(root_.file("run/sluice"));
    ASSERT_TRUE(writeTextFile(root_.file(netns_.substr(1)), ""));
    bind_ = std::make_unique<BindMount>(netns_, root_.file(netns_.substr(1)));
    ASSERT_TRUE(bind_->ok()) << bind_->error();
  }
  void TearDown() override {
    if (agent_) {
      if (auto c = agent_->client(); c.ok()) (void)c->removePod(containerId_);
      agent_.reset();
    }
    bind_.reset();  // before the TempDir goes
  }

  void startAgent() {
    auto a = AgentProcess::start(bpffs_.root(), {}, root_.file("run/sluice/agent.sock"), topo_.node().path());
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
  }

  /// The network configuration, as libcni hands it to the plugin.
  std::string conf() const {
    json prev = {{"cniVersion", "1.0.0"},
                 {"interfaces", {{{"name", "eth0"}, {"sandbox", netns_}}}},
                 {"ips", {{{"interface", 0}, {"address", std::string(PodTopology::kPodV4) + "/24"}}}}};
    return json{{"cniVersion", "1.0.0"},
                {"name", "static-test"},
                {"type", "sluice-cni"},
                {"agentSocket", "/run/sluice/agent.sock"},
                {"prevResult", prev}}
        .dump();
  }

  /// One invocation of /sluice-cni inside the chroot, with a clean
  /// environment: the CNI_* variables alone.
  CommandResult invoke(const std::string& command, const std::string& stdinText) {
    std::string in = root_.path() + ".stdin";
    writeTextFile(in, stdinText);
    std::string env = "CNI_COMMAND=" + command + " CNI_CONTAINERID=" + containerId_ + " CNI_NETNS=" +
                      shellQuote(netns_) + " CNI_IFNAME=eth0 CNI_ARGS='IgnoreUnknown=1;K8S_POD_NAME=web' " +
                      "CNI_PATH=/opt/cni/bin";
    auto r = sh("env -i " + env + " /usr/sbin/chroot " + shellQuote(root_.path()) + " /sluice-cni < " + shellQuote(in));
    ::unlink(in.c_str());
    return r;
  }

  TestBpffs bpffs_;
  PodTopology topo_;
  TempDir root_{"cnichroot"};
  std::string netns_;
  std::string containerId_ = "static-" + std::to_string(::getpid());
  std::unique_ptr<BindMount> bind_;
  std::unique_ptr<AgentProcess> agent_;
};

TEST_F(StaticCni, BinaryNeedsNoSharedLibrary) {
  auto ldd = runCommand({"/usr/bin/ldd", builtBinary("sluice-cni")});
  EXPECT_NE(ldd.exitCode, 0) << ldd.describe();
  EXPECT_NE((ldd.out + ldd.err).find("not a dynamic executable"), std::string::npos) << ldd.describe();
  // No interpreter (PT_INTERP) either: nothing for the node to provide.
  auto readelf = runCommand({"/usr/bin/readelf", "--program-headers", builtBinary("sluice-cni")});
  ASSERT_EQ(readelf.exitCode, 0) << readelf.describe();
  EXPECT_EQ(readelf.out.find("INTERP"), std::string::npos) << readelf.out;
  EXPECT_EQ(readelf.out.find("DYNAMIC"), std::string::npos) << readelf.out;
  // No name service (static glibc's NSS needs shared libraries at run time):
  // none of its code, and the lookups OpenSSL's archives reference on paths
  // the plugin never takes are sluice-cni's own refusals
  // (userspace/cni/no_names.cpp).
  auto nm = runCommand({"/usr/bin/nm", builtBinary("sluice-cni")});
  ASSERT_EQ(nm.exitCode, 0) << nm.err;
  for (const char* f : {" getpwnam\n", " getpwuid\n", " getgrnam\n", " __nss_database_get\n", " __nss_lookup\n"})
    EXPECT_EQ(nm.out.find(f), std::string::npos) << f;
  auto strings = runCommand({"/usr/bin/grep", "-c", "sluice-cni resolves no names", builtBinary("sluice-cni")});
  EXPECT_EQ(strings.exitCode, 0) << "getaddrinfo and gethostbyname are not sluice-cni's refusals";
  struct stat st {};
  ASSERT_EQ(::stat(builtBinary("sluice-cni").c_str(), &st), 0);
  auto stripped = runCommand({"/usr/bin/strip", "-o", root_.path() + ".stripped", builtBinary("sluice-cni")});
  struct stat sst {};
  if (stripped.exitCode == 0 && ::stat((root_.path() + ".stripped").c_str(), &sst) == 0)
    std::cout << "[ measure ] sluice-cni: " << st.st_size << " bytes as built (with debug info), " << sst.st_size
              << " bytes stripped\n";
  ::unlink((root_.path() + ".stripped").c_str());
}

// ADD, DEL and VERSION from inside the empty chroot, against a real agent.
TEST_F(StaticCni, AddAndDelRunInAnEmptyChroot) {
  startAgent();
  EXPECT_EQ(treeOf(root_.path()), (std::set<std::string>{"sluice-cni", "run", "run/netns", netns_.substr(1), "run/sluice",
                                                         "run/sluice/agent.sock"}));

  auto version = invoke("VERSION", R"({"cniVersion":"1.0.0"})");
  ASSERT_EQ(version.exitCode, 0) << version.describe();
  EXPECT_EQ(json::parse(version.out)["supportedVersions"], json({"0.3.0", "0.3.1", "0.4.0", "1.0.0"})) << version.out;

  auto add = invoke("ADD", conf());
  ASSERT_EQ(add.exitCode, 0) << add.describe() << "\n" << agent_->log();
  EXPECT_EQ(json::parse(add.out), json::parse(conf())["prevResult"]) << add.out;
  // The agent captures where the kernel lets it (auto): at the socket, or
  // at TC on the pod's eth0.
  const std::string captured = socketCaptureUnsupported().empty() ? "captured at the socket" : "interfaces eth0";
  EXPECT_NE(add.err.find("info sluice-cni: enrolled pod " + containerId_ + " (web) (netns " + netns_ + ", " + captured +
                         ", addresses " + PodTopology::kPodV4 + ")"),
            std::string::npos)
      << add.err;
  auto c = agent_->client();
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto pods = c->listPods();
  ASSERT_TRUE(pods.ok()) << pods.error().message;
  ASSERT_EQ(pods->size(), 1u);
  EXPECT_EQ((*pods)[0].id, containerId_);
  EXPECT_EQ((*pods)[0].netnsPath, netns_);
  EXPECT_EQ((*pods)[0].ips, std::vector<std::string>{PodTopology::kPodV4});
  auto check = c->check(containerId_);
  ASSERT_TRUE(check.ok()) << check.error().message;
  EXPECT_TRUE(check->intact);

  auto del = invoke("DEL", conf());
  ASSERT_EQ(del.exitCode, 0) << del.describe();
  EXPECT_EQ(del.out, "");
  pods = c->listPods();
  ASSERT_TRUE(pods.ok());
  EXPECT_TRUE(pods->empty());

  // With the agent gone, ADD fails closed, and the error (with strerror's
  // text, from the static libc) reaches the runtime as CNI error JSON.
  ASSERT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  agent_.reset();
  add = invoke("ADD", conf());
  EXPECT_EQ(add.exitCode, 1) << add.describe();
  auto err = json::parse(add.out, nullptr, false);
  ASSERT_TRUE(err.is_object()) << add.describe();
  EXPECT_EQ(err["code"], 11);
  EXPECT_EQ(err["msg"], "the sluice agent is not running (connect to the agent at /run/sluice/agent.sock: No such file "
                        "or directory); pod " + containerId_ + " (web) not started (fail closed)");
}

}  // namespace
}  // namespace sluice::test
