// The agent refuses a bpffs that would not outlive it (issue 15, item 5).
// A bpf filesystem lives as long as one of its mounts: mounted only inside
// the agent's own mount namespace (as under `ip netns exec`, or a container
// without a Bidirectional /sys/fs/bpf), it goes when the agent exits, and
// every pinned map and tcx link -- every pod's redirection -- with it.
//
//   host mount ns                      unshare -m (private propagation)
//   /sys/fs/bpf  bpffs 0:A  --copy-->  /sys/fs/bpf  bpffs 0:A   accepted: the host mounts 0:A
//   /tmp/sluice-bpffs-X (a dir)        /tmp/sluice-bpffs-X  bpffs 0:B (mounted here only)
//                                                          refused; started with --allow-private-bpffs
//
// Under a PID namespace of its own (no hostPID) the agent cannot read the
// host's mount table; it goes by the mount's propagation:
//
//   unshare -m: /sys/fs/bpf made shared ──▶ unshare -m -p --propagation slave:
//                                            /sys/fs/bpf master:N  accepted
//   unshare -m: private bpffs 0:B       ──▶ unshare -m -p: private  refused
#include <dirent.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>

#include "test/common/agent_process.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

// Runs "$@" (the agent's argv) in a private mount namespace with a fresh
// bpffs mounted at `dir`; with pidNs, in a PID namespace of its own as well
// (the agent is its PID 1, /proc remounted: no view of the host's mounts).
std::vector<std::string> privateBpffsWrapper(const std::string& dir, bool pidNs) {
  std::string then = pidNs ? "exec unshare --pid --fork --kill-child --mount-proc \"$@\"" : "exec \"$@\"";
  return {"/usr/bin/unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t bpf bpf \"$0\" && " + then, dir};
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (auto* e = ::readdir(d)) n += std::string(e->d_name) != "." && std::string(e->d_name) != "..";
    ::closedir(d);
  }
  return n;
}

size_t countLines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  std::string line;
  for (char c : text + "\n") {
    if (c != '\n') {
      line += c;
      continue;
    }
    n += line.find(needle) != std::string::npos;
    line.clear();
  }
  return n;
}

class BpffsScope : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (mount namespaces, bpffs, BPF)";
    ASSERT_FALSE(dir_.path().empty());
    static std::atomic<int> n{0};
    socket_ = "/tmp/sluice-t-scope-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".sock";
  }
  void TearDown() override {
    agent_.reset();  // before dir_ goes: it may still hold its mount there
    ::unlink(socket_.c_str());
  }

  /// Starts the agent under @p wrapper and reads its health.
  void startAgent(const std::string& root, const std::vector<std::string>& extra,
                  const std::vector<std::string>& wrapper, agent::Health& health) {
    auto a = AgentProcess::start(root, extra, socket_, "", "", wrapper);
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
    auto c = agent_->client();
    ASSERT_TRUE(c.ok()) << c.error().message;
    auto h = c->health();
    ASSERT_TRUE(h.ok()) << h.error().message;
    health = *h;
  }

  std::vector<std::string> agentArgs(const std::string& root) const {
    return {"--bpffs", root, "--socket", socket_, "--metrics-address", "off"};
  }

  TempDir dir_{"bpffs"};
  TestBpffs hostBpffs_;
  std::string socket_;
  std::unique_ptr<AgentProcess> agent_;
};

// The refusal: exit 1, one error line naming the bpffs, the consequence and
// the two ways out; nothing is left on the host (the private bpffs went
// with its namespace, the socket was never made).
TEST_F(BpffsScope, PrivateBpffsIsRefusedNamingTheConsequence) {
  std::string root = dir_.path() + "/sluice";
  AgentRun r = runAgentExpectingExit(agentArgs(root), std::chrono::seconds(20), privateBpffsWrapper(dir_.path(), false));
  EXPECT_EQ(r.exitCode, 1) << r.log;
  EXPECT_EQ(countLines(r.log, " error "), 1u) << r.log;
  EXPECT_NE(r.log.find("at " + dir_.path() + " (" + root + ") is private to the agent's mount namespace "
                       "(the host's mount table (PID 1's) has no bpffs "),
            std::string::npos)
      << r.log;
  EXPECT_NE(r.log.find("its pinned maps and tcx links, and every pod's redirection with them, vanish with that "
                       "namespace when the agent exits; mount the host's /sys/fs/bpf here (hostPath, "
                       "mountPropagation: Bidirectional) or pass --allow-private-bpffs"),
            std::string::npos)
      << r.log;
  EXPECT_EQ(r.log.find("programs"), std::string::npos) << "refused before loading anything: " << r.log;
  EXPECT_EQ(::access(socket_.c_str(), F_OK), -1);
  EXPECT_EQ(entries(dir_.path()), 0u) << "the host sees nothing of the private bpffs";
}

// With --allow-private-bpffs it starts, warns in its log, and says so in
// health and `sluicectl status`.
TEST_F(BpffsScope, PrivateBpffsWithTheFlagStartsAndWarns) {
  std::string root = dir_.path() + "/sluice";
  std::vector<std::string> extra = {"--allow-private-bpffs"};
  agent::Health h;
  ASSERT_NO_FATAL_FAILURE(startAgent(root, extra, privateBpffsWrapper(dir_.path(), false), h));
  EXPECT_EQ(countLines(agent_->log(), " warning "), 1u) << agent_->log();
  EXPECT_NE(agent_->log().find("warning sluiced: --allow-private-bpffs: bpffs "), std::string::npos) << agent_->log();
  EXPECT_NE(agent_->log().find("is private to the agent's mount namespace"), std::string::npos) << agent_->log();

  EXPECT_EQ(h.bpffsScope, "private");
  EXPECT_NE(h.bpffsScopeWhy.find("the host's mount table (PID 1's) has no bpffs "), std::string::npos) << h.bpffsScopeWhy;

  CommandResult st = runCommand({builtBinary("sluicectl"), "--bpffs", root, "--socket", socket_, "status"});
  EXPECT_EQ(st.exitCode, 0) << st.describe();
  EXPECT_NE(st.out.find("agent              sluiced "), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("serving " + root + ": its bpffs is PRIVATE to its mount namespace (the host's mount table "
                        "(PID 1's) has no bpffs "),
            std::string::npos)
      << st.out;
  EXPECT_NE(st.out.find("every pod's redirection vanishes when the agent exits (it was started with "
                        "--allow-private-bpffs)"),
            std::string::npos)
      << st.out;
  // From the host the root is on no bpffs at all.
  EXPECT_NE(st.out.find("bpffs              " + root + ": no bpffs mounted over " + root), std::string::npos) << st.out;

  EXPECT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  EXPECT_EQ(entries(dir_.path()), 0u) << "the pins went with the namespace";
}

// The host's bpffs seen from a private mount namespace (a copied mount of
// the same instance) outlives it: accepted without the flag, as the
// DaemonSet's container with its hostPath is.
TEST_F(BpffsScope, HostBpffsInAPrivateMountNamespaceIsAccepted) {
  std::vector<std::string> wrapper = {"/usr/bin/unshare", "--mount", "--propagation", "private"};
  agent::Health h;
  ASSERT_NO_FATAL_FAILURE(startAgent(hostBpffs_.root(), {}, wrapper, h));
  EXPECT_EQ(h.bpffsScope, "host");
  EXPECT_NE(h.bpffsScopeWhy.find("the host mounts the same bpffs at "), std::string::npos) << h.bpffsScopeWhy;
  EXPECT_EQ(countLines(agent_->log(), " warning "), 0u) << agent_->log();

  // And what the test process itself sees: the host's namespace.
  CommandResult st = runCommand({builtBinary("sluicectl"), "--bpffs", hostBpffs_.root(), "--socket", socket_, "status", "--json"});
  EXPECT_EQ(st.exitCode, 0) << st.describe();
  EXPECT_NE(st.out.find("\"outlives_namespace\": true"), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("\"bpffs_scope\": \"host\""), std::string::npos) << st.out;
}

// No host PID namespace: a private mount is refused, naming why the
// host's mounts could not be consulted.
TEST_F(BpffsScope, WithoutHostPidAPrivateMountIsRefused) {
  std::string root = dir_.path() + "/sluice";
  AgentRun r = runAgentExpectingExit(agentArgs(root), std::chrono::seconds(20), privateBpffsWrapper(dir_.path(), true));
  EXPECT_EQ(r.exitCode, 1) << r.log;
  EXPECT_NE(r.log.find("is private to the agent's mount namespace (a private mount, and the host's mounts are not "
                       "visible (no host PID namespace))"),
            std::string::npos)
      << r.log;
  EXPECT_EQ(entries(dir_.path()), 0u);
}

// No host PID namespace, but the mount is a slave of a shared one outside:
// the propagation ties it to a namespace that outlives the agent.
TEST_F(BpffsScope, WithoutHostPidASlaveMountIsAccepted) {
  // The outer unshare forks: it stays in the first namespace and keeps it
  // (the master of the agent's mount) alive. --mount-proc would make every
  // mount private, so /proc is mounted by hand.
  std::vector<std::string> wrapper = {"/usr/bin/unshare", "--mount", "--propagation", "private", "--fork", "--kill-child",
                                      "sh", "-c",
                                      "mount --make-shared /sys/fs/bpf && exec unshare --pid --fork --kill-child "
                                      "--mount --propagation slave sh -c 'mount -t proc proc /proc && exec \"$@\"' sh \"$@\"",
                                      "sh"};
  agent::Health h;
  ASSERT_NO_FATAL_FAILURE(startAgent(hostBpffs_.root(), {}, wrapper, h));
  EXPECT_EQ(h.bpffsScope, "host");
  EXPECT_NE(h.bpffsScopeWhy.find("its propagation (master:"), std::string::npos) << h.bpffsScopeWhy;
  EXPECT_NE(h.bpffsScopeWhy.find(") ties it to mounts outside this namespace"), std::string::npos) << h.bpffsScopeWhy;
}

}  // namespace
}  // namespace sluice::test
