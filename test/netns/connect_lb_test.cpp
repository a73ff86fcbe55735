// sluice beside a primary CNI's connect-time load balancer (Cilium's socket
// LB, Calico's connect-time load balancing): a foreign cgroup connect4/6
// program at the same cgroup as sluice's node hooks that sends a connect()
// to a service address on to a backend (foreign_lb.bpf.c), attached before
// and after sluice's. What the proxy sees as the original destination:
//
//   attached    kernel orders cgroup links     kernel does not (before 6.16)
//   LB first    service (sluice goes in front)  backend, and `sluicectl
//                                              status` warns ("neighbours")
//   LB after    service                         service
//
// sluice's connect hook sends a captured connection to the proxy over
// loopback, which no load balancer translates; one that ran first already
// replaced the service by a backend, and the proxy (ztunnel: its policy, its
// own load balancing of the service) only sees that. docs/neighbours.md
// says what each primary CNI needs.
//
//   test process (moved into its own cgroup: the hooks see only its sockets)
//     pod netns: app connect(10.96.0.10:80) ──▶ [LB?][sluice][LB?] ──▶ stand-in :15001
//     stand-in relays to the original destination ──▶ backend in the node netns
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <string>
#include <tuple>

#include "enroll/datapath.h"
#include "foreign_lb.skel.h"
#include "loader/sock_hooks.h"
#include "test/common/cgroup_scope.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

constexpr const char* kServiceV4 = "10.96.0.10";
constexpr const char* kServiceV6 = "fd00:96::a";
constexpr uint16_t kServicePort = 80;

// Whether this kernel orders cgroup links (BPF_F_BEFORE, Linux 6.16+): two
// trivial connect4 programs at a scratch cgroup, the second linked in front.
bool kernelOrdersCgroupLinks(const std::string& parent) {
  const std::string dir = parent + "/order-probe";
  if (::mkdir(dir.c_str(), 0755) != 0) return false;
  bool ordered = false;
  {
    Fd cg(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    const bpf_insn insns[] = {{BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 1}, {BPF_JMP | BPF_EXIT, 0, 0, 0, 0}};
    LIBBPF_OPTS(bpf_prog_load_opts, po, .expected_attach_type = BPF_CGROUP_INET4_CONNECT);
    Fd a(bpf_prog_load(BPF_PROG_TYPE_CGROUP_SOCK_ADDR, "probe_a", "GPL", insns, 2, &po));
    Fd b(bpf_prog_load(BPF_PROG_TYPE_CGROUP_SOCK_ADDR, "probe_b", "GPL", insns, 2, &po));
    LIBBPF_OPTS(bpf_link_create_opts, front, .flags = 1U << 3);  // BPF_F_BEFORE
    Fd la(bpf_link_create(a.get(), cg.get(), BPF_CGROUP_INET4_CONNECT, nullptr));
    Fd lb(bpf_link_create(b.get(), cg.get(), BPF_CGROUP_INET4_CONNECT, &front));
    ordered = cg.valid() && a.valid() && b.valid() && la.valid() && lb.valid();
  }
  ::rmdir(dir.c_str());
  return ordered;
}

/// The load balancer, loaded with the service and backend of @p family.
struct ForeignLb {
  foreign_lb* skel = nullptr;
  Fd link4, link6;
  ~ForeignLb() { foreign_lb__destroy(skel); }
  static Result<std::unique_ptr<ForeignLb>> load(int family, const Endpoint& backend) {
    auto lb = std::make_unique<ForeignLb>();
    lb->skel = foreign_lb__open();
    if (!lb->skel) return Error::fromErrno(errno, "open foreign_lb");
    auto* ro = lb->skel->rodata;
    if (family == AF_INET) {
      ::inet_pton(AF_INET, kServiceV4, const_cast<uint32_t*>(&ro->service_v4));
      ::inet_pton(AF_INET, backend.ip().c_str(), const_cast<uint32_t*>(&ro->backend_v4));
    } else {
      ::inet_pton(AF_INET6, kServiceV6, const_cast<uint32_t*>(ro->service_v6));
      ::inet_pton(AF_INET6, backend.ip().c_str(), const_cast<uint32_t*>(ro->backend_v6));
    }
    ro->service_port = htons(kServicePort);
    ro->backend_port = htons(backend.port());
    if (int err = foreign_lb__load(lb->skel); err != 0) return Error::fromErrno(-err, "load foreign_lb");
    return lb;
  }
  /// Appended at @p cgroup (as a CNI that started first, or any kernel
  /// without ordered links, attaches).
  Status attach(const std::string& cgroup) {
    Fd cg(::open(cgroup.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!cg.valid()) return Error::fromErrno(errno, "open " + cgroup);
    link4 = Fd(bpf_link_create(bpf_program__fd(skel->progs.lb_connect4), cg.get(), BPF_CGROUP_INET4_CONNECT, nullptr));
    link6 = Fd(bpf_link_create(bpf_program__fd(skel->progs.lb_connect6), cg.get(), BPF_CGROUP_INET6_CONNECT, nullptr));
    if (!link4.valid() || !link6.valid()) return Error::fromErrno(errno, "link the load balancer at " + cgroup);
    return {};
  }
  uint64_t translated() const { return skel->bss->translated; }
};

using Param = std::tuple<bool, int>;  // the load balancer attached first; family

class ConnectLb : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (std::string why = socketCaptureUnsupported(); !why.empty()) GTEST_SKIP() << why;
  }
  bool lbFirst() const { return std::get<0>(GetParam()); }
  int family() const { return std::get<1>(GetParam()); }
};

TEST_P(ConnectLb, TheProxySeesTheServiceWhereSluiceRunsFirst) {
  CgroupScope scope("lb");
  ASSERT_TRUE(scope.ok()) << scope.error();
  const bool ordered = kernelOrdersCgroupLinks(scope.path());
  PodTopology topo;
  ASSERT_TRUE(topo.ok()) << topo.error();
  auto backend = TcpServer::start(topo.node(), Endpoint::of(PodTopology::nodeAddr(family()), 0));
  ASSERT_TRUE(backend.ok()) << backend.error().message;
  const Endpoint service = Endpoint::of(family() == AF_INET ? kServiceV4 : kServiceV6, kServicePort);
  auto lb = ForeignLb::load(family(), (*backend)->local());
  ASSERT_TRUE(lb.ok()) << lb.error().message;
  if (lbFirst()) ASSERT_TRUE((*lb)->attach(scope.path()).ok());

  TestBpffs bpffs;
  DatapathOptions o;
  o.bpffsRoot = bpffs.root();
  o.capture = CaptureMode::Socket;
  o.cgroupPath = scope.path();
  o.podGuard = false;
  auto dp = Datapath::open(o);
  ASSERT_TRUE(dp.ok()) << dp.error().message;
  StandInConfig c = testStandInConfig(CaptureMode::Socket);
  c.netnsPath = topo.pod().path();
  auto standIn = ProxyStandIn::start(c);  // listening before the pod is enrolled
  ASSERT_TRUE(standIn.ok()) << standIn.error().message;
  PodSpec spec;
  spec.netnsPath = topo.pod().path();
  auto info = (*dp)->addPod(spec);
  ASSERT_TRUE(info.ok()) << info.error().message;
  if (!lbFirst()) ASSERT_TRUE((*lb)->attach(scope.path()).ok());

  auto conn = tcpConnect(topo.pod(), service);
  ASSERT_TRUE(conn.ok()) << conn.error().message;
  auto echoed = echoRoundTrip(conn->get(), "svc");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  ASSERT_TRUE((*standIn)->waitForEvents(1, kIoTimeout));
  const ProxyEvent ev = (*standIn)->events().front();
  EXPECT_EQ(ev.listener, "outbound");
  const bool sluiceFirst = !lbFirst() || ordered;
  EXPECT_EQ(ev.origDst, sluiceFirst ? service.str() : (*backend)->local().str())
      << (lbFirst() ? "load balancer linked first" : "load balancer linked after sluice")
      << (ordered ? ", kernel orders cgroup links" : ", kernel appends cgroup links");
  EXPECT_GE((*lb)->translated(), 1u) << "the backend was reached through the load balancer";

  // What status says of it: the programs ahead of sluice's, by hook.
  auto ahead = foreignHooksAhead(bpffs.root(), scope.path());
  if (sluiceFirst) {
    EXPECT_TRUE(ahead.empty()) << ahead.front().hook << " " << ahead.front().progName;
  } else {
    ASSERT_EQ(ahead.size(), 2u);
    EXPECT_EQ(ahead[0].hook, "connect4");
    EXPECT_EQ(ahead[0].progName, "lb_connect4");
    EXPECT_EQ(ahead[1].hook, "connect6");
  }
  auto status = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs.root(), "--cgroup", scope.path(),
                            "--socket", bpffs.root() + "/no-agent.sock", "status", "--json"});
  ASSERT_EQ(status.exitCode, 0) << status.describe();
  auto j = nlohmann::json::parse(status.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << status.out;
  EXPECT_EQ(j["neighbours"]["cgroup"], scope.path());
  EXPECT_EQ(j["neighbours"]["ahead_of_sluice"].size(), sluiceFirst ? 0u : 2u) << j["neighbours"];
  auto text = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs.root(), "--cgroup", scope.path(), "--socket",
                          bpffs.root() + "/no-agent.sock", "status"});
  EXPECT_EQ(text.out.find("neighbours         WARNING: connect4: program ") != std::string::npos, !sluiceFirst)
      << text.out;
  (*standIn)->stop();
  EXPECT_TRUE((*dp)->removePod(info->id).ok());
}

INSTANTIATE_TEST_SUITE_P(All, ConnectLb, ::testing::Combine(::testing::Bool(), ::testing::Values(AF_INET, AF_INET6)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "lb_first_" : "lb_after_") +
                                  familyName(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace sluice::test
