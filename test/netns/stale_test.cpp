// Stale registry entries (issue 15, item 7). Without an agent nobody sweeps
// pods whose netns is gone, so `sluicectl pod add` reaps such a pod itself
// when it holds what the new pod needs -- its id or one of its addresses --
// and says so; a live pod still blocks both. Netns paths are recorded
// absolute, so the agent's sweep (another working directory) never takes a
// live pod for a gone one.
//
//   node A netns   pod A netns (enrolled, then deleted: stale)
//   vethpod <────> eth0 10.200.0.2 / fd00:200::2
//   node B netns   pod B netns (the new pod: same addresses, maybe same id)
//   vethpod <────> eth0 10.200.0.2 / fd00:200::2
//
// Everything runs through the sluicectl binary (no agent), tcx and legacy.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>

#include "test/common/agent_process.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

using nlohmann::json;

class StalePod : public ::testing::TestWithParam<TcMode> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    if (std::string why = tcModeUnsupported(GetParam()); !why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(a_.ok()) << a_.error();
    ASSERT_TRUE(b_.ok()) << b_.error();
  }
  void TearDown() override {
    for (const auto& id : cleanup_) (void)ctl({"pod", "remove", "--id", id});
  }

  CommandResult ctl(std::vector<std::string> args, const std::string& cwd = "") {
    std::vector<std::string> argv = {builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--tc-mode",
                                     modeName(GetParam())};
    argv.insert(argv.end(), args.begin(), args.end());
    if (cwd.empty()) return runCommand(argv);
    std::string line = "cd '" + cwd + "' &&";
    for (const auto& a : argv) line += " '" + a + "'";
    return sh(line);
  }

  /// sluicectl pod add for a topology's pod, probe SNAT in its node netns.
  CommandResult add(PodTopology& t, const std::string& id) {
    cleanup_.push_back(id);
    return ctl({"pod", "add", "--netns", t.pod().path(), "--node-netns", t.node().path(), "--id", id});
  }

  json list() {
    auto r = ctl({"pod", "list", "--json"});
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    return json::parse(r.out, nullptr, false);
  }

  TestBpffs bpffs_;
  PodTopology a_;
  PodTopology b_;
  std::vector<std::string> cleanup_;
};

std::string paramName(const ::testing::TestParamInfo<TcMode>& info) { return modeName(info.param); }

// stderr without the warning every enrollment prints before Linux 6.6 (no
// SO_REUSEPORT assignment), so the same expectations hold on every kernel.
std::string withoutReuseportWarning(const std::string& err) {
  std::string out, line;
  for (char c : err) {
    line += c;
    if (c != '\n') continue;
    if (line.find("cannot hand packets to SO_REUSEPORT sockets") == std::string::npos) out += line;
    line.clear();
  }
  return out + line;
}

// The id: pod A's netns is deleted; B enrolls under A's id. The old entry
// is reaped (one warning), B is enrolled, and B's netns is what the
// registry names.
TEST_P(StalePod, IdOfAPodWhoseNetnsIsGoneIsReaped) {
  auto r = add(a_, "web");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  std::string goneNetns = a_.pod().path();
  a_.pod().remove();

  r = add(b_, "web");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.out, "pod web enrolled (" + std::string(modeName(GetParam())) + ")\n");
  EXPECT_EQ(withoutReuseportWarning(r.err),
            "sluicectl: warning: reaping pod 'web': its netns " + goneNetns + " is gone, and it still held its id\n");
  json pods = list();
  ASSERT_EQ(pods.size(), 1u) << pods;
  EXPECT_EQ(pods[0]["id"], "web");
  EXPECT_EQ(pods[0]["netns"], b_.pod().path());

  // A live pod still blocks its id, in one line.
  PodTopology c;
  ASSERT_TRUE(c.ok()) << c.error();
  r = ctl({"pod", "add", "--netns", c.pod().path(), "--node-netns", c.node().path(), "--id", "web"});
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_EQ(r.err, "sluicectl: pod id 'web' is already enrolled for another netns (" + b_.pod().path() + ")\n");
}

// The addresses: A and B have the same pod addresses. While A lives, B is
// refused naming A; once A's netns is gone, B's enrollment reaps A (one
// warning) and takes the addresses.
TEST_P(StalePod, AddressOfAPodWhoseNetnsIsGoneIsReaped) {
  auto r = add(a_, "pod-a");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  r = add(b_, "pod-b");
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_EQ(r.err, "sluicectl: address 10.200.0.2 is already registered for another pod ('pod-a')\n");
  EXPECT_EQ(list().size(), 1u);

  std::string goneNetns = a_.pod().path();
  a_.pod().remove();
  r = add(b_, "pod-b");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(withoutReuseportWarning(r.err), "sluicectl: warning: reaping pod 'pod-a': its netns " + goneNetns +
                                                " is gone, and it still held address 10.200.0.2\n");
  json pods = list();
  ASSERT_EQ(pods.size(), 1u) << pods;
  EXPECT_EQ(pods[0]["id"], "pod-b");
  std::vector<std::string> ips = pods[0]["ips"];
  EXPECT_NE(std::find(ips.begin(), ips.end(), "10.200.0.2"), ips.end()) << pods;
  EXPECT_NE(std::find(ips.begin(), ips.end(), "fd00:200::2"), ips.end()) << pods;
  struct stat st {};
  EXPECT_NE(::lstat(bpffs_.linkDir("pod-a").c_str(), &st), 0) << "pod-a's link pins are still there";
}

// A relative --netns (and --node-netns) is recorded absolute: the agent,
// started later from another directory, finds the pod alive in its sweep
// and keeps it; removal by the same relative path works.
TEST_P(StalePod, RelativeNetnsIsRecordedAbsoluteAndSurvivesTheSweep) {
  cleanup_.push_back(a_.pod().name());
  const std::string dir = "/var/run/netns";
  auto r = ctl({"pod", "add", "--netns", a_.pod().name(), "--node-netns", "./" + a_.node().name()}, dir);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  json pods = list();
  ASSERT_EQ(pods.size(), 1u) << pods;
  char real[PATH_MAX];
  ASSERT_TRUE(::realpath(dir.c_str(), real));
  EXPECT_EQ(pods[0]["id"], a_.pod().name());
  EXPECT_EQ(pods[0]["netns"], std::string(real) + "/" + a_.pod().name());
  EXPECT_EQ(pods[0]["node_netns"], std::string(real) + "/" + a_.node().name());

  {
    auto agent = AgentProcess::start(bpffs_.root(), {"--tc-mode", modeName(GetParam())}, "", a_.node().path());
    ASSERT_TRUE(agent.ok()) << agent.error().message;
    auto c = (*agent)->client();
    ASSERT_TRUE(c.ok());
    auto listed = c->listPods();
    ASSERT_TRUE(listed.ok()) << listed.error().message;
    ASSERT_EQ(listed->size(), 1u) << "the start-up sweep removed a live pod: " << (*agent)->log();
    EXPECT_EQ((*agent)->log().find("is gone"), std::string::npos) << (*agent)->log();
  }
  r = ctl({"pod", "remove", "--netns", a_.pod().name()}, dir);
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(list().empty());
}

INSTANTIATE_TEST_SUITE_P(All, StalePod, ::testing::Values(TcMode::Tcx, TcMode::Legacy), paramName);

// Datapath itself refuses relative paths (whatever calls it), in one line.
TEST(StalePodPaths, DatapathRefusesRelativeNetnsPaths) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (BPF)";
  TestBpffs bpffs;
  DatapathOptions o;
  o.bpffsRoot = bpffs.root();
  auto dp = Datapath::open(o);
  ASSERT_TRUE(dp.ok()) << dp.error().message;
  PodSpec spec;
  spec.netnsPath = "netns/pod";
  auto r = (*dp)->addPod(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EINVAL);
  EXPECT_EQ(r.error().message,
            "netns path 'netns/pod' is relative: give an absolute path (every sluice process must find the same file)");
  spec.netnsPath = "/proc/self/ns/net";
  spec.nodeNetnsPath = "node";
  r = (*dp)->addPod(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "node netns path 'node' is relative: give an absolute path (every sluice process must find the same file)");
  EXPECT_TRUE((*dp)->listPods().empty());
}

}  // namespace
}  // namespace sluice::test
