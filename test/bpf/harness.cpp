#include "test/bpf/harness.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/if_addr.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netlink/addr.h>
#include <netlink/route/addr.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "loader/bpffs.h"
#include "enroll/datapath.h"
#include "loader/netlink.h"
#include "base/pod_stats.h"
#include "loader/netns.h"

namespace sluice::test {

const Family kV4{"v4", "10.1.0.5", "10.1.0.6", "10.2.0.9", "10.96.0.10", "10.96.0.11",
                 SLUICE_DEFAULT_PROBE_V4, "127.0.0.1"};
const Family kV6{"v6", "fd00:1::5", "fd00:1::6", "fd00:2::9", "fd00:96::a", "fd00:96::b",
                 SLUICE_DEFAULT_PROBE_V6, "::1"};

namespace {

constexpr const char* kBpffs = "/sys/fs/bpf";
constexpr const char* kRootPrefix = "sluice-bpft-";

std::atomic<int> rootSeq{0};

// A network namespace that exists only as this descriptor: made by
// unshare() on a thread that ends right after, so neither the calling
// thread nor any mount point is touched.
Result<Fd> unshareNetns() {
  std::optional<Result<Fd>> out;
  std::thread t([&] {
    if (::unshare(CLONE_NEWNET) != 0) {
      out = Error::fromErrno(errno, "unshare(CLONE_NEWNET)");
      return;
    }
    Fd fd(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      out = Error::fromErrno(errno, "open /proc/thread-self/ns/net");
      return;
    }
    out = std::move(fd);
  });
  t.join();
  return std::move(*out);
}

// The object shared by the Sandboxes of this process (default mode).
std::unique_ptr<LoadedObject> sharedObject;

// Before the tests: removes roots left by test processes that died without
// running destructors (SIGKILL, a crash). After them: removes this
// process's shared object and root, whatever the tests' outcome.
class BpfTestEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { sharedObject.reset(); }
  void SetUp() override {
    DIR* d = ::opendir(kBpffs);
    if (!d) return;
    std::vector<std::string> stale;
    while (struct dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.rfind(kRootPrefix, 0) != 0) continue;
      pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + std::strlen(kRootPrefix)));
      if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(std::string(kBpffs) + "/" + name);
    }
    ::closedir(d);
    for (const auto& dir : stale) (void)removeTree(dir);
  }
};
[[maybe_unused]] ::testing::Environment* const bpfTestEnv =
    ::testing::AddGlobalTestEnvironment(new BpfTestEnvironment);

}  // namespace

Status linkUp(const char* name) {
  Fd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return Error::fromErrno(errno, "socket");
  struct ifreq ifr {};
  std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  if (::ioctl(s.get(), SIOCGIFFLAGS, &ifr) != 0) return Error::fromErrno(errno, std::string("SIOCGIFFLAGS ") + name);
  ifr.ifr_flags |= IFF_UP;
  if (::ioctl(s.get(), SIOCSIFFLAGS, &ifr) != 0) return Error::fromErrno(errno, std::string("SIOCSIFFLAGS ") + name);
  return {};
}

namespace {

Status addLoAddress(NetlinkSocket& nl, const char* text) {
  IpAddr ip = IpAddr::parse(text);
  struct rtnl_addr* a = rtnl_addr_alloc();
  struct nl_addr* local = nl_addr_build(ip.family, ip.b.data(), ip.size());
  rtnl_addr_set_ifindex(a, 1);
  rtnl_addr_set_family(a, ip.family);
  rtnl_addr_set_local(a, local);
  rtnl_addr_set_prefixlen(a, ip.family == AF_INET ? 32 : 128);
  // No prefix route: until the address's local route is in place (IPv6 adds
  // it from a work queue, a moment later even with NODAD) a connect fails
  // at once with ENETUNREACH and is retried, instead of waiting a second
  // for neighbour discovery on lo through the prefix route.
  rtnl_addr_set_flags(a, IFA_F_NOPREFIXROUTE | (ip.family == AF_INET6 ? IFA_F_NODAD : 0));
  Status st = nl.call([&](nl_sock* s) { return rtnl_addr_add(s, a, 0); }, std::string("add address ") + text);
  nl_addr_put(local);
  rtnl_addr_put(a);
  return st;
}

// sockaddr for text:port.
socklen_t sockaddrOf(const char* text, uint16_t port, sockaddr_storage& ss) {
  IpAddr ip = IpAddr::parse(text);
  std::memset(&ss, 0, sizeof(ss));
  if (ip.family == AF_INET) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    std::memcpy(&sin->sin_addr, ip.b.data(), 4);
    return sizeof(*sin);
  }
  auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
  sin6->sin6_family = AF_INET6;
  sin6->sin6_port = htons(port);
  std::memcpy(&sin6->sin6_addr, ip.b.data(), 16);
  return sizeof(*sin6);
}

Result<Fd> tcpSocket(const char* addr, uint16_t port) {
  sockaddr_storage ss;
  socklen_t len = sockaddrOf(addr, port, ss);
  Fd s(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return Error::fromErrno(errno, "socket");
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0)
    return Error::fromErrno(errno, std::string("bind ") + addr + ":" + std::to_string(port));
  return s;
}

std::string natKeyStr(const sluice_dns_nat_key& k) {
  IpAddr a;
  a.family = k.family;
  std::memcpy(a.b.data(), k.client_addr, 16);
  std::ostringstream o;
  o << "{cookie " << k.netns_cookie << ", " << (k.proto == IPPROTO_TCP ? "tcp " : k.proto == IPPROTO_UDP ? "udp " : "proto? ")
    << a.str() << ":" << ntohs(k.client_port) << " family " << int(k.family) << " pad " << k.pad << "}";
  return o.str();
}

std::string natValueStr(const sluice_dns_nat_value& v, int family) {
  IpAddr a;
  a.family = family;
  std::memcpy(a.b.data(), v.resolver_addr, 16);
  return a.str() + ":" + std::to_string(ntohs(v.resolver_port));
}

}  // namespace

// ------------------------------------------------------------------ names

Result<Fd> newNetns() { return unshareNetns(); }

const char* progName(Prog p) {
  switch (p) {
    case Prog::Egress: return "pod_egress";
    case Prog::Ingress: return "pod_ingress";
    case Prog::LoEgress: return "pod_lo_egress";
    case Prog::HostEgress: return "host_egress";
    case Prog::HostIngress: return "host_ingress";
  }
  return "?";
}

std::string verdictName(int v) {
  switch (v) {
    case kNext: return "NEXT (TCX_NEXT / TC_ACT_UNSPEC)";
    case TC_ACT_OK: return "TC_ACT_OK";
    case TC_ACT_RECLASSIFY: return "TC_ACT_RECLASSIFY";
    case TC_ACT_SHOT: return "TC_ACT_SHOT";
    case TC_ACT_PIPE: return "TC_ACT_PIPE";
    case TC_ACT_STOLEN: return "TC_ACT_STOLEN";
    case TC_ACT_QUEUED: return "TC_ACT_QUEUED";
    case TC_ACT_REPEAT: return "TC_ACT_REPEAT";
    case TC_ACT_REDIRECT: return "TC_ACT_REDIRECT";
    case TC_ACT_TRAP: return "TC_ACT_TRAP";
    default: return "verdict " + std::to_string(v);
  }
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%x", v);
  return buf;
}

std::string describeCounters(const sluice_pod_stats& s) {
  std::ostringstream o;
  auto field = [&](const char* name, __u64 v) {
    if (v) o << (o.tellp() ? " " : "") << name << "=" << v;
  };
  eachCounter(s, field);
  std::string r = o.str();
  return r.empty() ? "all zero" : r;
}

bool operator==(const sluice_pod_stats& a, const sluice_pod_stats& b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

std::string caseName(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// ---------------------------------------------------------------- Sandbox

Result<std::unique_ptr<LoadedObject>> LoadedObject::load() {
  if (!isOnBpffs(kBpffs)) return Error::msg(std::string(kBpffs) + " is not a mounted bpffs");
  std::unique_ptr<LoadedObject> obj(new LoadedObject());
  std::string root = std::string(kBpffs) + "/" + kRootPrefix + std::to_string(::getpid()) + "-" +
                     std::to_string(rootSeq++);
  if (::mkdir(root.c_str(), 0700) != 0) return Error::fromErrno(errno, "mkdir " + root);
  obj->root = root;  // from here on the destructor removes it
  auto progs = PodPrograms::load(root);
  SLUICE_TRY(progs);
  obj->progs = std::move(*progs);
  return obj;
}

LoadedObject::~LoadedObject() {
  progs.reset();
  if (!root.empty()) {
    Status st = removeTree(root);
    if (!st.ok()) std::fprintf(stderr, "sluice bpf tests: cleanup of %s: %s\n", root.c_str(), st.error().message.c_str());
  }
}

Result<std::unique_ptr<Sandbox>> Sandbox::create() {
  std::unique_ptr<Sandbox> sb(new Sandbox());
  if (std::getenv("SLUICE_BPF_TEST_FRESH_LOAD")) {
    auto obj = LoadedObject::load();
    SLUICE_TRY(obj);
    sb->own_ = std::move(*obj);
    sb->obj_ = sb->own_.get();
  } else {
    if (!sharedObject) {
      auto obj = LoadedObject::load();
      SLUICE_TRY(obj);
      sharedObject = std::move(*obj);
    }
    sb->obj_ = sharedObject.get();
  }
  SLUICE_TRY(sb->resetMaps());
  auto ns = unshareNetns();
  SLUICE_TRY(ns);
  sb->netns_ = std::move(*ns);
  uint64_t cookie = 0;
  SLUICE_TRY(sb->inNetns([&]() -> Status {
    auto c = currentNetnsCookie();
    SLUICE_TRY(c);
    cookie = *c;
    return {};
  }));
  sb->cookie_ = cookie;
  return sb;
}

Sandbox::~Sandbox() {
  sockets_.clear();
  if (obj_ && !own_) {
    Status st = resetMaps();
    if (!st.ok()) ADD_FAILURE() << "emptying the maps after the test: " << st.error().message;
  }
  own_.reset();
}

Status Sandbox::resetMaps() {
  PodPrograms& p = *obj_->progs;
  SLUICE_TRY(p.settings.update(0, sluice_settings{}));
  for (const auto& k : p.podConfig.keys()) SLUICE_TRY(p.podConfig.erase(k));
  for (const auto& k : p.podStats.keys()) SLUICE_TRY(p.podStats.erase(k));
  for (const auto& k : p.dnsNat.keys()) SLUICE_TRY(p.dnsNat.erase(k));
  for (const auto& k : p.pods.keys()) SLUICE_TRY(p.pods.erase(k));
  for (const auto& k : p.podAddrs.keys()) SLUICE_TRY(p.podAddrs.erase(k));
  for (const auto& k : p.snatRev.keys()) SLUICE_TRY(p.snatRev.erase(k));
  for (const auto& k : p.snatClosed.keys()) SLUICE_TRY(p.snatClosed.erase(k));
  SLUICE_TRY(p.proxyIdentity.update(0, sluice_proxy_identity{}));
  for (const auto& k : p.proxyCgroups.keys()) SLUICE_TRY(p.proxyCgroups.erase(k));
  if (!p.podConfig.keys().empty() || !p.podStats.keys().empty() || !p.dnsNat.keys().empty() ||
      !p.podAddrs.keys().empty() || !p.snatRev.keys().empty() ||
      !p.snatClosed.keys().empty())
    return Error::msg("maps not empty after reset");
  return {};
}

Status Sandbox::inNetns(const std::function<Status()>& fn) { return runInNetns(netns_.get(), fn); }

Status Sandbox::writeSettings(bool zero) {
  sluice_settings s{};
  if (!zero) {
    auto enc = encodeSettings(Settings{});
    SLUICE_TRY(enc);
    s = *enc;
  }
  return programs().settings.update(0, s);
}

Status Sandbox::enroll(const PodSetup& pod) {
  sluice_pod_config cfg{};
  cfg.flags = pod.flags;
  if (pod.reroute.size() > SLUICE_MAX_REROUTE_IFACES) return Error::msg("too many reroute interfaces");
  cfg.reroute_count = static_cast<__u32>(pod.reroute.size());
  for (size_t i = 0; i < pod.reroute.size(); i++) cfg.reroute_ifindex[i] = pod.reroute[i];
  std::strncpy(cfg.id, "bpf-test-pod", sizeof(cfg.id) - 1);
  // Seeded from a thread inside the netns, with the cookie read right there:
  // the same cookie the programs compute from skb->dev in a test run.
  return inNetns([&]() -> Status {
    auto c = currentNetnsCookie();
    SLUICE_TRY(c);
    if (*c != cookie_) return Error::msg("netns cookie changed");
    SLUICE_TRY(programs().podConfig.update(*c, cfg));
    SLUICE_TRY(programs().podStats.update(*c, sluice_pod_stats{}));
    return {};
  });
}

sluice_dns_nat_key Sandbox::natKey(const NatEntry& e) const {
  sluice_dns_nat_key k{};
  IpAddr a = IpAddr::parse(e.client);
  k.netns_cookie = cookie_ + e.cookieDelta;
  std::memcpy(k.client_addr, a.b.data(), 16);
  k.client_port = htons(e.clientPort);
  k.family = static_cast<__u8>(a.family);
  k.proto = e.proto;
  return k;
}

sluice_dns_nat_value Sandbox::natValue(const NatEntry& e) {
  sluice_dns_nat_value v{};
  IpAddr a = IpAddr::parse(e.resolver);
  std::memcpy(v.resolver_addr, a.b.data(), 16);
  v.resolver_port = htons(e.resolverPort);
  return v;
}

Status Sandbox::seedNat(const NatEntry& e) { return programs().dnsNat.update(natKey(e), natValue(e)); }

Status Sandbox::openSockets(Sockets which) {
  if (which == Sockets::None) return {};
  return inNetns([&]() -> Status {
    SLUICE_TRY(linkUp("lo"));
    auto nl = NetlinkSocket::open();
    SLUICE_TRY(nl);
    for (const Family* f : kFamilies) {
      SLUICE_TRY(addLoAddress(*nl, f->pod));
      SLUICE_TRY(addLoAddress(*nl, f->remote));
    }
    for (const Family* f : kFamilies) {
      auto listener = tcpSocket(f->remote, kServerPort);
      SLUICE_TRY(listener);
      if (::listen(listener->get(), 8) != 0) return Error::fromErrno(errno, "listen");
      sockaddr_storage ss;
      socklen_t len = sockaddrOf(f->remote, kServerPort, ss);
      // A new IPv6 address becomes usable a moment after it is added (its
      // local route comes with the end of address set-up, even with
      // NODAD): retry while the network is "unreachable".
      Result<Fd> client = Error::msg("not connected");
      for (int attempt = 0;; attempt++) {
        client = Error::msg("not connected");  // closes the failed socket, freeing its port
        client = tcpSocket(f->pod, kClientPort);
        SLUICE_TRY(client);
        if (::connect(client->get(), reinterpret_cast<sockaddr*>(&ss), len) == 0) break;
        int err = errno;
        if ((err != ENETUNREACH && err != EHOSTUNREACH && err != EADDRNOTAVAIL) || attempt >= 200)
          return Error::fromErrno(err, std::string("connect to ") + f->remote);
        ::usleep(10000);
      }
      Fd accepted(::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!accepted.valid()) return Error::fromErrno(errno, "accept");
      sockets_.push_back(std::move(*listener));
      sockets_.push_back(std::move(*client));
      sockets_.push_back(std::move(accepted));
    }
    return {};
  });
}

Result<RunResult> Sandbox::run(Prog prog, const Bytes& frame, uint32_t mark, uint32_t ifindex) {
  int fd = -1;
  switch (prog) {
    case Prog::Egress: fd = programs().egressFd(); break;
    case Prog::Ingress: fd = programs().ingressFd(); break;
    case Prog::LoEgress: fd = programs().loEgressFd(); break;
    case Prog::HostEgress: fd = programs().hostEgressFd(); break;
    case Prog::HostIngress: fd = programs().hostIngressFd(); break;
  }
  RunResult r;
  Status st = inNetns([&]() -> Status {
    Bytes in = frame;
    r.out.assign(frame.size() + 512, 0);
    struct __sk_buff ctxIn {}, ctxOut {};
    ctxIn.mark = mark;
    ctxIn.ifindex = ifindex;
    LIBBPF_OPTS(bpf_test_run_opts, o);
    o.data_in = in.data();
    o.data_size_in = static_cast<__u32>(in.size());
    o.data_out = r.out.data();
    o.data_size_out = static_cast<__u32>(r.out.size());
    o.ctx_in = &ctxIn;
    o.ctx_size_in = sizeof(ctxIn);
    o.ctx_out = &ctxOut;
    o.ctx_size_out = sizeof(ctxOut);
    o.repeat = 1;
    if (bpf_prog_test_run_opts(fd, &o) != 0)
      return Error::fromErrno(errno, std::string("BPF_PROG_TEST_RUN ") + progName(prog));
    r.verdict = static_cast<int>(o.retval);
    r.out.resize(o.data_size_out);
    r.mark = ctxOut.mark;
    return {};
  });
  SLUICE_TRY(st);
  return r;
}

std::optional<sluice_pod_stats> Sandbox::counters() const { return countersOf(cookie_); }

std::optional<sluice_pod_stats> Sandbox::countersOf(uint64_t cookie) const {
  auto per = programs().podStats.lookupPerCpu(cookie);
  if (per.empty()) return std::nullopt;
  return sumPerCpu(per);
}

std::vector<std::pair<sluice_dns_nat_key, sluice_dns_nat_value>> Sandbox::natEntries() const {
  std::vector<std::pair<sluice_dns_nat_key, sluice_dns_nat_value>> out;
  for (const auto& k : programs().dnsNat.keys())
    if (auto v = programs().dnsNat.lookup(k)) out.emplace_back(k, *v);
  return out;
}

// ------------------------------------------------------------- node side

Status Sandbox::addPodAddr(const std::string& addr, uint64_t cookie) {
  IpAddr a = IpAddr::parse(addr);
  sluice_pod_addr k{};
  std::memcpy(k.addr, a.b.data(), a.size());
  k.family = static_cast<__u8>(a.family);
  SLUICE_TRY(programs().podAddrs.update(k, sluice_pod_addr_info{.netns_cookie = cookie}));
  if (programs().podStats.lookupPerCpu(cookie).empty()) SLUICE_TRY(programs().podStats.update(cookie, sluice_pod_stats{}));
  return {};
}

Status Sandbox::seedSnat(const sluice_snat_key& k, const sluice_snat_value& v) {
  return programs().snatRev.update(k, v);
}

std::vector<std::pair<sluice_snat_key, sluice_snat_value>> Sandbox::snatEntries() const {
  const auto& m = programs().snatRev;
  std::vector<std::pair<sluice_snat_key, sluice_snat_value>> out;
  for (const auto& k : m.keys())
    if (auto v = m.lookup(k)) out.emplace_back(k, *v);
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return describeSnatKey(a.first) < describeSnatKey(b.first); });
  return out;
}

sluice_snat_key snatKey(const std::string& src, uint16_t sport, const std::string& dst, uint16_t dport) {
  IpAddr s = IpAddr::parse(src), d = IpAddr::parse(dst);
  sluice_snat_key k{};
  std::memcpy(k.saddr, s.b.data(), s.size());
  std::memcpy(k.daddr, d.b.data(), d.size());
  k.sport = htons(sport);
  k.dport = htons(dport);
  k.family = static_cast<__u8>(s.family);
  return k;
}

sluice_snat_value snatValue(const std::string& addr, uint16_t port, uint16_t flags, uint64_t cookie) {
  IpAddr a = IpAddr::parse(addr);
  sluice_snat_value v{};
  std::memcpy(v.addr, a.b.data(), a.size());
  v.port = htons(port);
  v.flags = flags;
  v.netns_cookie = cookie;
  return v;
}

namespace {
std::string addrText(const __u8* bytes, int family) {
  IpAddr a;
  a.family = family;
  std::memcpy(a.b.data(), bytes, 16);
  std::string s = family == AF_INET6 ? "[" + a.str() + "]" : a.str();
  // IPv4 keeps the other 12 bytes zero: the programs key by all 16.
  if (family == AF_INET)
    for (int i = 4; i < 16; i++)
      if (bytes[i]) return s + "(+junk)";
  return s;
}
}  // namespace

std::string describeSnatKey(const sluice_snat_key& k) {
  std::string s = addrText(k.saddr, k.family) + ":" + std::to_string(ntohs(k.sport)) + " -> " +
                  addrText(k.daddr, k.family) + ":" + std::to_string(ntohs(k.dport));
  if (k.family != AF_INET && k.family != AF_INET6) s += " family " + std::to_string(k.family);
  if (k.pad[0] || k.pad[1] || k.pad[2]) s += " (pad not zero)";
  return s;
}

std::string describeSnatValue(const sluice_snat_value& v, int family) {
  std::string s = addrText(v.addr, family) + ":" + std::to_string(ntohs(v.port));
  if (v.flags) {
    s += " flags";
    if (v.flags & SLUICE_SNAT_FIN_OUT) s += " FIN_OUT";
    if (v.flags & SLUICE_SNAT_FIN_IN) s += " FIN_IN";
    if (v.flags & ~(SLUICE_SNAT_FIN_OUT | SLUICE_SNAT_FIN_IN)) s += " " + hex32(v.flags);
  }
  s += " cookie " + std::to_string(v.netns_cookie);
  if (v.pad) s += " (pad not zero)";
  return s;
}

void SandboxTest::SetUp() {
  auto sb = Sandbox::create();
  ASSERT_TRUE(sb.ok()) << "sandbox: " << sb.error().message;
  sb_ = std::move(*sb);
}

// ---------------------------------------------------------------- runCase

void runCase(Sandbox& sb, const Case& c) {
  // Known bugs are skipped; SLUICE_BPF_TEST_KNOWN_BUGS=1 runs them (to see
  // them fail, or to check a fix).
  if (!c.bug.empty() && !std::getenv("SLUICE_BPF_TEST_KNOWN_BUGS")) GTEST_SKIP() << "BUG: " << c.bug;
  const Bytes in = c.in.bytes();
  SCOPED_TRACE(std::string(progName(c.prog)) + ": " + c.what + "\n  input: " + describeFrame(in) +
               "\n  ctx mark " + hex32(c.mark) + " ifindex " + std::to_string(c.ifindex));

  ASSERT_TRUE(sb.writeSettings(c.zeroSettings).ok());
  if (c.pod.enrolled) {
    Status st = sb.enroll(c.pod);
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  for (const auto& n : c.natSeed) ASSERT_TRUE(sb.seedNat(n).ok());
  {
    Status st = sb.openSockets(c.sockets);
    ASSERT_TRUE(st.ok()) << st.error().message;
  }

  auto r = sb.run(c.prog, in, c.mark, c.ifindex);
  ASSERT_TRUE(r.ok()) << r.error().message;

  EXPECT_EQ(verdictName(r->verdict), verdictName(c.verdict));
  EXPECT_EQ(hex32(r->mark), hex32(c.outMark.value_or(c.mark))) << "skb->mark after the run";

  const Bytes want = c.out ? c.out->bytes() : in;
  if (r->out != want) {
    ADD_FAILURE() << "output frame " << (c.out ? "is not the expected rewrite" : "changed, expected it untouched")
                  << "\n  got:  " << describeFrame(r->out) << "\n  want: " << describeFrame(want);
  }
  if (c.out) {
    ParsedPacket p = parsePacket(r->out);
    EXPECT_TRUE(p.checksumsOk()) << "checksums of the rewritten frame: " << p.describe();
  }

  auto counters = sb.counters();
  EXPECT_EQ(counters.has_value(), c.pod.enrolled) << "pod_stats entry presence";
  EXPECT_EQ(describeCounters(counters.value_or(sluice_pod_stats{})), describeCounters(c.counts)) << "pod_stats";

  auto nat = sb.natEntries();
  std::vector<NatEntry> expected = c.natSeed;
  if (c.natAdded) expected.push_back(*c.natAdded);
  std::ostringstream have;
  for (const auto& [k, v] : nat) have << "\n    " << natKeyStr(k) << " -> " << natValueStr(v, k.family);
  EXPECT_EQ(nat.size(), expected.size()) << "dns_nat entries:" << have.str();
  for (const auto& e : expected) {
    auto key = sb.natKey(e);
    auto v = sb.programs().dnsNat.lookup(key);
    if (!v) {
      ADD_FAILURE() << "dns_nat lacks " << natKeyStr(key) << "; it holds:" << have.str();
      continue;
    }
    auto want = Sandbox::natValue(e);
    EXPECT_EQ(natValueStr(*v, key.family), natValueStr(want, key.family)) << "dns_nat[" << natKeyStr(key) << "]";
    EXPECT_EQ(std::memcmp(&*v, &want, sizeof(want)), 0) << "dns_nat value padding";
  }
}

}  // namespace sluice::test
