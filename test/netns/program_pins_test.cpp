// Programs loaded once per bpffs root and pinned with their build identity
// (loader/program_pins.h): later sluicectl processes and the agent reuse
// them, another identity replaces them without touching enrolled pods, and
// pins that claim this build's identity but are not what it pinned are an
// error of one line. Program identity is asserted by kernel program ids
// (bpf_obj_get + BPF_OBJ_GET_INFO_BY_FD), never by timing.
//
//   test process                        pod netns A / B
//   +-----------------------------+     +----------------------+
//   | sluicectl (processes)       |---->| eth0, lo (tc)        |
//   | Datapath::open (the agent's |     | stand-in :15001      |
//   |   path, in process)         |     +----------------------+
//   | ROOT/programs/current -> ID |
//   +-----------------------------+
#include <bpf/bpf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "loader/bpffs.h"
#include "enroll/datapath.h"
#include "loader/features.h"
#include "loader/program_pins.h"
#include "loader/tc.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

bool pathExists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

size_t lineCount(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

/// [env VAR=VALUE] sluicectl --bpffs ROOT ARGS... (global options first in ARGS)
CommandResult ctl(const std::string& root, const std::vector<std::string>& args, const std::string& env = "") {
  std::vector<std::string> argv;
  if (!env.empty()) argv = {"/usr/bin/env", env};
  argv.insert(argv.end(), {builtBinary("sluicectl"), "--bpffs", root});
  argv.insert(argv.end(), args.begin(), args.end());
  return runCommand(argv);
}

std::string currentIdentity(const std::string& root) {
  char buf[64] = {};
  ssize_t n = ::readlink((programsDir(root) + "/current").c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

/// Kernel id of the program pinned as ROOT/programs/current/NAME (0: none).
uint32_t pinnedProgramId(const std::string& root, const std::string& name) {
  int fd = bpf_obj_get((programsDir(root) + "/current/" + name).c_str());
  if (fd < 0) return 0;
  uint32_t id = programId(fd);
  ::close(fd);
  return id;
}

/// The kernel id of the program behind @p fd of a Datapath.
uint32_t idOf(int fd) { return programId(fd); }

bool tcx() { return tcModeUnsupported(TcMode::Tcx).empty(); }

/// Outbound TCP from the pod reaches the stand-in's outbound listener.
void expectRedirected(PodTopology& topo) {
  StandInConfig cfg = testStandInConfig();
  cfg.netnsPath = topo.pod().path();
  auto standIn = ProxyStandIn::start(cfg);
  ASSERT_TRUE(standIn.ok()) << standIn.error().message;
  auto server = TcpServer::start(topo.node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok()) << server.error().message;
  auto c = tcpConnect(topo.pod(), (*server)->local());
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_TRUE(echoRoundTrip(c->get(), "pinned").ok());
  ASSERT_TRUE((*standIn)->waitForEvents(1, kIoTimeout));
  EXPECT_EQ((*standIn)->events().front().listener, "outbound") << topo.pod().name();
}

class SluicectlPins : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    ASSERT_TRUE(pathExists(builtBinary("sluicectl"))) << builtBinary("sluicectl") << " not built";
  }
  TestBpffs bpffs_;
};

// The first sluicectl loads and pins; the second (another process) and the
// agent's in-process Datapath take the same kernel programs from the pins,
// and the pods both processes enrolled run them.
TEST_F(SluicectlPins, LaterProcessesReuseThePinnedPrograms) {
  PodTopology a, b;
  ASSERT_TRUE(a.ok()) << a.error();
  ASSERT_TRUE(b.ok()) << b.error();
  // Captured at TC (the hooks show which program runs); the socket mode's
  // reuse comes after.
  auto addA = ctl(bpffs_.root(), {"--capture", "tc", "pod", "add", "--netns", a.pod().path()});
  ASSERT_EQ(addA.exitCode, 0) << addA.describe();
  const std::string id = currentIdentity(bpffs_.root());
  ASSERT_EQ(id.size(), 16u) << "no identity pinned under " << programsDir(bpffs_.root());
  std::vector<uint32_t> ids;
  for (int i = 0; i < static_cast<int>(PinnedProg::Count); i++) {
    ids.push_back(pinnedProgramId(bpffs_.root(), pinnedProgName(static_cast<PinnedProg>(i))));
    EXPECT_NE(ids.back(), 0u) << pinnedProgName(static_cast<PinnedProg>(i)) << " not pinned";
  }

  auto addB = ctl(bpffs_.root(), {"--log-level", "debug", "--capture", "tc", "pod", "add", "--netns", b.pod().path()});
  ASSERT_EQ(addB.exitCode, 0) << addB.describe();
  EXPECT_NE(addB.err.find("reusing programs " + id), std::string::npos) << addB.err;
  EXPECT_EQ(currentIdentity(bpffs_.root()), id);
  for (int i = 0; i < static_cast<int>(PinnedProg::Count); i++)
    EXPECT_EQ(pinnedProgramId(bpffs_.root(), pinnedProgName(static_cast<PinnedProg>(i))), ids[static_cast<size_t>(i)])
        << "the second process pinned other programs: " << pinnedProgName(static_cast<PinnedProg>(i));
  if (tcx()) {
    for (auto* t : {&a, &b}) {
      EXPECT_EQ(tcxProgramId(bpffs_.linkDir(t->pod().name()) + "/eth0_egress"), ids[0]) << t->pod().name();
      EXPECT_EQ(tcxProgramId(bpffs_.linkDir(t->pod().name()) + "/eth0_ingress"), ids[1]) << t->pod().name();
    }
  }

  // The agent's path: Datapath::open in this process reuses them too.
  DatapathOptions o;
  o.bpffsRoot = bpffs_.root();
  auto dp = Datapath::open(o);
  ASSERT_TRUE(dp.ok()) << dp.error().message;
  EXPECT_TRUE((*dp)->programs().reused());
  EXPECT_EQ((*dp)->programs().identity(), id);
  EXPECT_EQ(idOf((*dp)->programs().egressFd()), ids[0]);
  EXPECT_EQ(idOf((*dp)->programs().hostIngressFd()), ids[4]);
  EXPECT_EQ((*dp)->listPods().size(), 2u);
  auto rep = (*dp)->reconcile();
  EXPECT_EQ(rep.programsReplaced, 0) << "the pods already run the pinned programs";
  EXPECT_TRUE(rep.errors.empty()) << rep.errors.front();
  expectRedirected(b);

  // A third process captures a pod at the socket with the pinned socket
  // programs: the node's cgroup hooks run exactly those.
  PodTopology c;
  ASSERT_TRUE(c.ok()) << c.error();
  auto addC = ctl(bpffs_.root(), {"--log-level", "debug", "--capture", "socket", "pod", "add", "--netns", c.pod().path()});
  ASSERT_EQ(addC.exitCode, 0) << addC.describe();
  EXPECT_NE(addC.err.find("reusing programs " + id), std::string::npos) << addC.err;
  for (auto [hook, prog] : {std::pair{"connect4", PinnedProg::SockConnect4}, {"getsockopt", PinnedProg::SockGetsockopt},
                            {"sockops", PinnedProg::SockSockops}, {"sock_create", PinnedProg::SockCreate}}) {
    Fd link(bpf_obj_get((bpffs_.root() + "/" + SLUICE_PIN_NODE_LINKS_DIR + "/" + hook).c_str()));
    ASSERT_TRUE(link.valid()) << "no node link " << hook;
    bpf_link_info info{};
    __u32 len = sizeof(info);
    ASSERT_EQ(bpf_obj_get_info_by_fd(link.get(), &info, &len), 0);
    EXPECT_EQ(info.prog_id, ids[static_cast<size_t>(prog)]) << hook << " runs another program than the pinned one";
  }
  expectRedirected(c);

  // status names the pinned identity as this build's.
  auto status = ctl(bpffs_.root(), {"status", "--json"});
  auto j = nlohmann::json::parse(status.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << status.describe();
  EXPECT_EQ(j["programs"]["identity"], id) << status.out;
  EXPECT_EQ(j["programs"]["this_build"], true) << status.out;
  EXPECT_EQ(j["programs"]["program_ids"], nlohmann::json(ids)) << status.out;
  auto text = ctl(bpffs_.root(), {"status"});
  EXPECT_NE(text.out.find("programs           build " + id), std::string::npos) << text.out;

  for (auto* t : {&a, &b, &c}) {
    auto rm = ctl(bpffs_.root(), {"pod", "remove", "--id", t->pod().name()});
    EXPECT_EQ(rm.exitCode, 0) << rm.describe();
  }
}

// Programs of another identity (here: the other pod-cookie variant, as a
// build whose probes chose it would pin) replace the pins; the pod enrolled
// before keeps its programs and its redirection, and the old identity's
// pins are gone. A process of the first identity then takes the pins back.
TEST_F(SluicectlPins, AnotherIdentityReplacesThePinsAndEnrolledPodsKeepTheirRedirection) {
  auto features = kernelFeatures();
  ASSERT_TRUE(features.ok()) << features.error().message;
  const bool kfunc = features->cookieMethod == PodCookieMethod::KernCtx;
  if (!kfunc || !features->probeReadKernel.present)
    GTEST_SKIP() << "needs both pod-cookie variants (kfunc, Linux 6.2+, and probe-read) for two identities of one build";
  PodTopology a, b;
  ASSERT_TRUE(a.ok()) << a.error();
  ASSERT_TRUE(b.ok()) << b.error();
  auto addA = ctl(bpffs_.root(), {"--capture", "tc", "pod", "add", "--netns", a.pod().path()});
  ASSERT_EQ(addA.exitCode, 0) << addA.describe();
  const std::string first = currentIdentity(bpffs_.root());
  const uint32_t firstEgress = pinnedProgramId(bpffs_.root(), "pod_egress");
  ASSERT_NE(firstEgress, 0u);
  EXPECT_EQ(first, buildIdentity(PodCookieMethod::KernCtx));

  auto addB = ctl(bpffs_.root(), {"--capture", "tc", "pod", "add", "--netns", b.pod().path()},
                  "SLUICE_POD_COOKIE=probe-read");
  ASSERT_EQ(addB.exitCode, 0) << addB.describe();
  const std::string second = currentIdentity(bpffs_.root());
  EXPECT_EQ(second, buildIdentity(PodCookieMethod::ProbeRead));
  ASSERT_NE(second, first);
  const uint32_t secondEgress = pinnedProgramId(bpffs_.root(), "pod_egress");
  EXPECT_NE(secondEgress, firstEgress);
  EXPECT_FALSE(pathExists(programsDir(bpffs_.root()) + "/" + first)) << "the replaced identity's pins stayed";
  if (tcx()) {
    EXPECT_EQ(tcxProgramId(bpffs_.linkDir(a.pod().name()) + "/eth0_egress"), firstEgress)
        << "pod A's hook changed program";
    EXPECT_EQ(tcxProgramId(bpffs_.linkDir(b.pod().name()) + "/eth0_egress"), secondEgress);
  }
  expectRedirected(a);
  expectRedirected(b);

  // The forced variant's pins are not the probed one's: a plain process
  // loads its own again and they replace the forced ones.
  auto list = ctl(bpffs_.root(), {"pod", "list"});
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  EXPECT_EQ(currentIdentity(bpffs_.root()), first);
  EXPECT_FALSE(pathExists(programsDir(bpffs_.root()) + "/" + second));
  expectRedirected(a);

  for (auto* t : {&a, &b}) {
    auto rm = ctl(bpffs_.root(), {"pod", "remove", "--id", t->pod().name()});
    EXPECT_EQ(rm.exitCode, 0) << rm.describe();
  }
}

// A pin under this build's identity that is not what sluice pinned there:
// one line naming it and the way out, nothing changed; following the way
// out works and the enrolled pod is still there.
TEST_F(SluicectlPins, ForeignPinIsOneClearErrorLine) {
  PodTopology a;
  ASSERT_TRUE(a.ok()) << a.error();
  auto add = ctl(bpffs_.root(), {"pod", "add", "--netns", a.pod().path()});
  ASSERT_EQ(add.exitCode, 0) << add.describe();
  const std::string dir = programsDir(bpffs_.root()) + "/" + currentIdentity(bpffs_.root());
  const std::string egress = dir + "/pod_egress";

  // A map where the program was.
  ASSERT_EQ(::unlink(egress.c_str()), 0);
  int map = bpf_map_create(BPF_MAP_TYPE_ARRAY, "foreign", 4, 8, 1, nullptr);
  ASSERT_GE(map, 0);
  ASSERT_EQ(bpf_obj_pin(map, egress.c_str()), 0);
  ::close(map);
  auto r = ctl(bpffs_.root(), {"pod", "list"});
  EXPECT_NE(r.exitCode, 0) << r.describe();
  EXPECT_EQ(lineCount(r.err), 1u) << r.err;
  EXPECT_EQ(r.err, "sluicectl: " + egress + " is a bpf-map, not what sluice pinned there: remove " +
                       programsDir(bpffs_.root()) + " and run again to load the programs anew (enrolled pods keep running)\n");
  EXPECT_TRUE(pathExists(egress)) << "the foreign pin was touched";

  // Another program of this build's name but not the recorded one.
  ASSERT_EQ(::unlink(egress.c_str()), 0);
  const struct bpf_insn ret0[] = {
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .src_reg = 0, .off = 0, .imm = 0},
      {.code = BPF_JMP | BPF_EXIT, .dst_reg = 0, .src_reg = 0, .off = 0, .imm = 0},
  };
  int prog = bpf_prog_load(BPF_PROG_TYPE_SCHED_CLS, "pod_egress", "GPL", ret0, 2, nullptr);
  ASSERT_GE(prog, 0);
  ASSERT_EQ(bpf_obj_pin(prog, egress.c_str()), 0);
  uint32_t foreignId = programId(prog);
  ::close(prog);
  r = ctl(bpffs_.root(), {"pod", "list"});
  EXPECT_NE(r.exitCode, 0) << r.describe();
  EXPECT_EQ(lineCount(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find(egress + " is program " + std::to_string(foreignId) + " 'pod_egress' (recorded: "),
            std::string::npos)
      << r.err;

  // `current` that is not a symlink.
  ASSERT_TRUE(removeTree(programsDir(bpffs_.root())).ok());
  ASSERT_EQ(::mkdir(programsDir(bpffs_.root()).c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((programsDir(bpffs_.root()) + "/current").c_str(), 0700), 0);
  r = ctl(bpffs_.root(), {"pod", "add", "--netns", a.pod().path()});
  EXPECT_NE(r.exitCode, 0) << r.describe();
  EXPECT_EQ(lineCount(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find(programsDir(bpffs_.root()) + "/current is not a symlink to the pinned identity"),
            std::string::npos)
      << r.err;

  // The way out the message names.
  ASSERT_TRUE(removeTree(programsDir(bpffs_.root())).ok());
  r = ctl(bpffs_.root(), {"pod", "list", "--json"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  auto pods = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(pods.is_array() && pods.size() == 1u) << r.out;
  expectRedirected(a);
  auto rm = ctl(bpffs_.root(), {"pod", "remove", "--id", a.pod().name()});
  EXPECT_EQ(rm.exitCode, 0) << rm.describe();
}

// What is under ROOT/programs besides the current identity -- an older
// identity's programs, a crashed load's half-written directory and link --
// is removed by the next process (and by the agent at start, the same
// Datapath::open), while the current pins stay.
TEST_F(SluicectlPins, StalePinsAreRemoved) {
  auto list = ctl(bpffs_.root(), {"pod", "list"});
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  const std::string dir = programsDir(bpffs_.root());
  const std::string id = currentIdentity(bpffs_.root());
  ASSERT_FALSE(id.empty());
  const uint32_t egress = pinnedProgramId(bpffs_.root(), "pod_egress");

  const std::string old = dir + "/00000000deadbeef";
  const std::string crashed = dir + "/" + id + "-new-999999";
  ASSERT_EQ(::mkdir(old.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir(crashed.c_str(), 0700), 0);
  int map = bpf_map_create(BPF_MAP_TYPE_ARRAY, "old", 4, 8, 1, nullptr);
  ASSERT_GE(map, 0);
  ASSERT_EQ(bpf_obj_pin(map, (old + "/record").c_str()), 0);
  ::close(map);
  ASSERT_EQ(::symlink("00000000deadbeef", (dir + "/current-new-999999").c_str()), 0);

  list = ctl(bpffs_.root(), {"pod", "list"});
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  EXPECT_FALSE(pathExists(old));
  EXPECT_FALSE(pathExists(crashed));
  EXPECT_FALSE(pathExists(dir + "/current-new-999999"));
  EXPECT_EQ(currentIdentity(bpffs_.root()), id);
  EXPECT_EQ(pinnedProgramId(bpffs_.root(), "pod_egress"), egress);
}

// Maps re-created under the root (here: every map pin removed, as a
// manual clean-up of the state would) split the pinned programs from the
// maps: they are not reused but loaded anew against the new maps.
TEST_F(SluicectlPins, ProgramsOfRecreatedMapsAreLoadedAnew) {
  auto list = ctl(bpffs_.root(), {"pod", "list"});
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  const std::string id = currentIdentity(bpffs_.root());
  const uint32_t egress = pinnedProgramId(bpffs_.root(), "pod_egress");
  for (const char* name : boundMapNames()) ::unlink((bpffs_.root() + "/" + name).c_str());
  list = ctl(bpffs_.root(), {"--log-level", "info", "pod", "list"});
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  EXPECT_NE(list.err.find("is not the one programs " + id + " were loaded against"), std::string::npos) << list.err;
  EXPECT_EQ(currentIdentity(bpffs_.root()), id);
  EXPECT_NE(pinnedProgramId(bpffs_.root(), "pod_egress"), egress);
}

}  // namespace
}  // namespace sluice::test
