// Differential fuzzer (issue 13, item 4): generated frames
// (fuzz_generator.h) through the pod programs with BPF_PROG_TEST_RUN,
// every run compared with the reference model (fuzz_model.h): verdict,
// mark, output frame byte for byte, the pod's counters, the DNS
// translations recorded. The pod's situation changes every few hundred
// packets (settings written or not, enrolled or not, DNS / inbound capture,
// virtual interfaces, the proxy listening or not, recorded queries).
//
// Short run (CI, the default): SLUICE_FUZZ_PACKETS packets per program
// (default 20000), cut short after SLUICE_FUZZ_SECONDS (default 3) so an
// emulated guest stays quick. Long run (on demand, docs/fuzzing.md):
//   SLUICE_FUZZ_PACKETS=1000000 SLUICE_FUZZ_SEED=7 build/test/sluice_bpf_tests --gtest_filter='Fuzz.*'
// (an explicit packet count runs to the end, however long it takes). A
// disagreement prints the seed, the packet's index and hex, the situation,
// and what the model and the program did, so it can be replayed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "base/pod_stats.h"
#include "test/bpf/fuzz_generator.h"
#include "test/bpf/fuzz_model.h"
#include "test/bpf/harness.h"

namespace sluice::test::fuzz {
namespace {

constexpr uint64_t kPhase = 256;        // packets between changes of the pod's situation
constexpr size_t kMaxNatEntries = 512;  // far below the map's size: no LRU eviction
constexpr int kReportedDisagreements = 10;

uint64_t envNumber(const char* name, uint64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : dflt;
}

std::string hexOf(const Bytes& b) {
  std::string s;
  char buf[4];
  for (uint8_t c : b) {
    std::snprintf(buf, sizeof(buf), "%02x", c);
    s += buf;
  }
  return s;
}

std::string describeEnv(const Env& e) {
  std::ostringstream o;
  o << "settings " << (e.settings ? "on" : "zero") << ", " << (e.enrolled ? "enrolled" : "not enrolled")
    << ", dns-capture " << ((e.flags & SLUICE_POD_DNS_CAPTURE) ? "on" : "off") << ", inbound-capture "
    << ((e.flags & SLUICE_POD_INBOUND_CAPTURE) ? "on" : "off") << ", reroute {";
  for (size_t i = 0; i < e.reroute.size(); i++) o << (i ? "," : "") << e.reroute[i];
  o << "}, listeners " << (e.listeners ? "yes" : "no") << ", " << e.nat.size() << " recorded queries";
  return o.str();
}

sluice_dns_nat_key natKeyOf(uint64_t cookie, const NatClient& c) {
  sluice_dns_nat_key k{};
  k.netns_cookie = cookie;
  std::memcpy(k.client_addr, c.addr.data(), 16);
  k.client_port = htons(c.port);
  k.family = static_cast<__u8>(c.family);
  k.proto = c.proto;
  return k;
}

bool natValueIs(const sluice_dns_nat_value& v, const NatResolver& r) {
  return std::memcmp(v.resolver_addr, r.addr.data(), 16) == 0 && ntohs(v.resolver_port) == r.port;
}

sluice_pod_stats minus(const sluice_pod_stats& a, const sluice_pod_stats& b) {
  sluice_pod_stats d{};
  const auto* pa = reinterpret_cast<const __u64*>(&a);
  const auto* pb = reinterpret_cast<const __u64*>(&b);
  auto* pd = reinterpret_cast<__u64*>(&d);
  for (size_t i = 0; i < sizeof(d) / sizeof(__u64); i++) pd[i] = pa[i] - pb[i];
  return d;
}

// The proxy's listeners as ztunnel opens them (docs/redirection.md, the
// proxy's side): 15001 and 15006 on [::] (dual-stack), DNS on 127.0.0.1 and
// ::1, TCP and UDP.
Status openListeners(Sandbox& sb, std::vector<Fd>& out) {
  return sb.inNetns([&]() -> Status {
    auto one = [&](int family, int type, const char* addr, uint16_t port) -> Status {
      Fd s(::socket(family, type | SOCK_CLOEXEC, 0));
      if (!s.valid()) return Error::fromErrno(errno, "socket");
      int on = 1, off = 0;
      ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
      sockaddr_storage ss{};
      socklen_t len;
      if (family == AF_INET) {
        auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
        sin->sin_family = AF_INET;
        sin->sin_port = htons(port);
        ::inet_pton(AF_INET, addr, &sin->sin_addr);
        len = sizeof(*sin);
      } else {
        ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
        auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(port);
        ::inet_pton(AF_INET6, addr, &sin6->sin6_addr);
        len = sizeof(*sin6);
      }
      if (::bind(s.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0)
        return Error::fromErrno(errno, std::string("bind ") + addr + ":" + std::to_string(port));
      if (type == SOCK_STREAM && ::listen(s.get(), 8) != 0) return Error::fromErrno(errno, "listen");
      out.push_back(std::move(s));
      return {};
    };
    SLUICE_TRY(one(AF_INET6, SOCK_STREAM, "::", SLUICE_DEFAULT_OUTBOUND_PORT));
    SLUICE_TRY(one(AF_INET6, SOCK_STREAM, "::", SLUICE_DEFAULT_INBOUND_PORT));
    for (int type : {SOCK_STREAM, SOCK_DGRAM}) {
      SLUICE_TRY(one(AF_INET, type, "127.0.0.1", SLUICE_DEFAULT_DNS_PORT));
      SLUICE_TRY(one(AF_INET6, type, "::1", SLUICE_DEFAULT_DNS_PORT));
    }
    return {};
  });
}

class Fuzz : public SandboxTest {
 protected:
  /// Runs @p prog, compared with the model's prediction for @p modelProg
  /// (the same program, except in the self-test); returns the disagreements.
  uint64_t fuzz(Prog prog, std::optional<Prog> modelProg = std::nullopt);

 private:
  // Changes the pod's situation, in the maps and in the model alike.
  void newPhase(Generator& g, Prog prog);
  // The whole dns_nat map against the model's recorded queries.
  void checkNat(const std::string& when);
  void clearNat();
  // The node side: settings and the probe ipset change; SNAT state stays.
  void newHostPhase(Generator& g);
  // snat_rev and snat_closed against the model's connections.
  void checkSnat(const std::string& when);
  void clearSnat();
  // A packet of a connection the model knows, either way (drives probe
  // connections through their life: FINs, resets, late packets).
  std::optional<Input> knownConnectionPacket(Generator& g, Prog prog);
  void disagree(const std::string& what);

  Env env_;
  std::vector<Fd> listeners_;
  sluice_pod_stats last_{};
  uint64_t seed_ = 0, index_ = 0, disagreements_ = 0;
  Prog prog_ = Prog::Egress;

 protected:
  bool quiet_ = false;  // the self-test expects disagreements
  uint64_t cap_ = 0;    // non-zero: at most this many packets, whatever the environment says
};

void Fuzz::disagree(const std::string& what) {
  if (disagreements_++ < kReportedDisagreements && !quiet_) ADD_FAILURE() << what;
}

void Fuzz::clearNat() {
  for (const auto& k : sb().programs().dnsNat.keys()) ASSERT_TRUE(sb().programs().dnsNat.erase(k).ok());
  env_.nat.clear();
}

void Fuzz::checkNat(const std::string& when) {
  auto real = sb().natEntries();
  bool same = real.size() == env_.nat.size();
  for (const auto& [c, r] : env_.nat) {
    auto v = sb().programs().dnsNat.lookup(natKeyOf(sb().cookie(), c));
    if (!v || !natValueIs(*v, r)) same = false;
  }
  if (!same)
    disagree("seed " + std::to_string(seed_) + " " + progName(prog_) + ": dns_nat holds " +
             std::to_string(real.size()) + " entries, the model " + std::to_string(env_.nat.size()) + " (" + when +
             ", packet " + std::to_string(index_) + ")");
}

void Fuzz::newPhase(Generator& g, Prog prog) {
  PodPrograms& p = sb().programs();
  const bool wasEnrolled = env_.enrolled;
  env_.settings = !g.chance(5);
  ASSERT_TRUE(sb().writeSettings(!env_.settings).ok());
  env_.enrolled = !g.chance(10);
  env_.flags = g.below(4);
  switch (g.below(10)) {
    case 0: env_.reroute = {1}; break;
    case 1: env_.reroute = {7}; break;
    case 2: env_.reroute = {2, 3, 4, 5, 6, 7, 8, 1}; break;
    default: env_.reroute.clear(); break;
  }
  if (g.chance(12)) {
    env_.listeners = !env_.listeners;
    listeners_.clear();
    if (env_.listeners) {
      Status st = openListeners(sb(), listeners_);
      ASSERT_TRUE(st.ok()) << st.error().message;
    }
  }
  if (env_.enrolled) {
    // Enrolling (again) starts the pod's counters from zero.
    ASSERT_TRUE(sb().enroll({.flags = env_.flags, .reroute = env_.reroute}).ok());
    last_ = {};
    if (!wasEnrolled) clearNat();
    // Queries the pod made before (pod_lo_egress translates their answers).
    for (unsigned i = 0, n = prog == Prog::LoEgress ? g.below(5) : g.below(2); i < n; i++) {
      const bool v4 = g.chance(50);
      const Family& f = v4 ? kV4 : kV6;
      IpAddr client = IpAddr::parse(g.chance(80) ? f.pod : g.address(v4));
      IpAddr resolver = IpAddr::parse(g.address(v4));
      NatClient c;
      c.family = client.family;
      std::memcpy(c.addr.data(), client.b.data(), client.size());
      c.port = g.chance(70) ? static_cast<uint16_t>(40000 + g.below(2)) : g.port();
      c.proto = g.chance(50) ? IPPROTO_UDP : IPPROTO_TCP;
      NatResolver r;
      std::memcpy(r.addr.data(), resolver.b.data(), resolver.size());
      r.port = g.chance(80) ? 53 : g.port();
      sluice_dns_nat_value v{};
      std::memcpy(v.resolver_addr, r.addr.data(), 16);
      v.resolver_port = htons(r.port);
      ASSERT_TRUE(p.dnsNat.update(natKeyOf(sb().cookie(), c), v).ok());
      env_.nat[c] = r;
    }
  } else {
    // Removal: the pod's entries go (pod remove drops its dns_nat too).
    (void)p.podConfig.erase(sb().cookie());
    (void)p.podStats.erase(sb().cookie());
    clearNat();
  }
}

void Fuzz::newHostPhase(Generator& g) {
  env_.settings = !g.chance(3);
  ASSERT_TRUE(sb().writeSettings(!env_.settings).ok());
  const bool listed = !g.chance(10);
  env_.podAddrs.clear();
  for (const Family* f : kFamilies) {
    IpAddr a = IpAddr::parse(f->pod);
    sluice_pod_addr k{};
    std::memcpy(k.addr, a.b.data(), a.size());
    k.family = static_cast<__u8>(a.family);
    if (listed) {
      ASSERT_TRUE(sb().addPodAddr(f->pod, sb().cookie()).ok());
      env_.podAddrs.push_back(a);
    } else {
      (void)sb().programs().podAddrs.erase(k);
    }
  }
}

void Fuzz::clearSnat() {
  for (const auto& k : sb().programs().snatRev.keys()) ASSERT_TRUE(sb().programs().snatRev.erase(k).ok());
  for (const auto& k : sb().programs().snatClosed.keys()) ASSERT_TRUE(sb().programs().snatClosed.erase(k).ok());
  env_.snat.clear();
  env_.snatClosed.clear();
}

void Fuzz::checkSnat(const std::string& when) {
  const IpAddr probe4 = IpAddr::parse(kV4.probe), probe6 = IpAddr::parse(kV6.probe);
  auto check = [&](const char* name, const auto& map, const std::map<SnatKey, SnatConn>& model) {
    std::vector<std::string> problems;
    if (map.keys().size() != model.size())
      problems.push_back(std::to_string(map.keys().size()) + " elements, the model " + std::to_string(model.size()));
    for (const auto& [k, c] : model) {
      IpAddr pod;
      pod.family = k.family;
      std::memcpy(pod.b.data(), k.pod.data(), 16);
      const IpAddr& probe = k.family == AF_INET ? probe4 : probe6;
      // The key is the reply's tuple: pod -> probe.
      auto v = map.lookup(snatKey(pod.str(), k.podPort, probe.str(), k.port));
      if (!v) {
        problems.push_back("no element for " + pod.str() + ":" + std::to_string(k.podPort) + " -> probe:" +
                           std::to_string(k.port));
        continue;
      }
      const std::string want = describeSnatValue(snatValue(c.prober.str(), c.proberPort, c.flags, sb().cookie()), k.family);
      const std::string have = describeSnatValue(*v, k.family);
      if (want != have) problems.push_back("element " + pod.str() + ":" + std::to_string(k.podPort) + " holds " + have + ", the model " + want);
    }
    if (!problems.empty()) {
      std::string all;
      for (const auto& p : problems) all += "\n    " + p;
      disagree("seed " + std::to_string(seed_) + " " + name + " (" + when + ", packet " + std::to_string(index_) + "):" + all);
    }
  };
  check("snat_rev", sb().programs().snatRev, env_.snat);
  check("snat_closed", sb().programs().snatClosed, env_.snatClosed);
}

std::optional<Input> Fuzz::knownConnectionPacket(Generator& g, Prog prog) {
  const auto& pool = g.chance(80) || env_.snatClosed.empty() ? env_.snat : env_.snatClosed;
  if (pool.empty()) return std::nullopt;
  auto it = pool.begin();
  std::advance(it, g.below(static_cast<uint32_t>(pool.size())));
  const auto& [k, c] = *it;
  IpAddr pod;
  pod.family = k.family;
  std::memcpy(pod.b.data(), k.pod.data(), 16);
  static constexpr uint8_t kFlags[] = {tcpflag::ACK, tcpflag::ACK | tcpflag::PSH, tcpflag::FIN | tcpflag::ACK,
                                       tcpflag::RST, tcpflag::RST | tcpflag::ACK, tcpflag::SYN,
                                       tcpflag::SYN | tcpflag::ACK};
  const uint8_t flags = kFlags[g.below(sizeof(kFlags))];
  const char* probe = k.family == AF_INET ? kV4.probe : kV6.probe;
  Packet p = prog == Prog::HostEgress ? Packet::tcp(c.prober.str(), c.proberPort, pod.str(), k.podPort, flags)
                                      : Packet::tcp(pod.str(), k.podPort, probe, k.port, flags);
  return Input{p.bytes(), 0};
}

uint64_t Fuzz::fuzz(Prog prog, std::optional<Prog> modelProg) {
  prog_ = prog;
  const bool selfTest = modelProg.has_value();
  const bool explicitCount = std::getenv("SLUICE_FUZZ_PACKETS") != nullptr;
  const uint64_t packets = cap_ ? cap_ : envNumber("SLUICE_FUZZ_PACKETS", 20000);
  const uint64_t seconds = envNumber("SLUICE_FUZZ_SECONDS", explicitCount ? 0 : 3);
  seed_ = envNumber("SLUICE_FUZZ_SEED", 1);
  // One stream per program, all from the one seed. The node's two programs
  // share their state, so they are fuzzed together, packet by packet.
  const bool host = prog == Prog::HostEgress;
  Generator g(seed_ * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(prog), prog);
  Generator gIn(seed_ * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(Prog::HostIngress), Prog::HostIngress);

  EXPECT_TRUE(sb().writeSettings().ok());
  {
    Status st = sb().openSockets(Sockets::Connection);
    EXPECT_TRUE(st.ok()) << st.error().message;
    if (!st.ok()) return 0;
  }
  for (const Family* f : kFamilies) {
    IpAddr pod = IpAddr::parse(f->pod), remote = IpAddr::parse(f->remote);
    env_.conns.push_back({pod, kClientPort, remote, kServerPort});  // the app's socket
    env_.conns.push_back({remote, kServerPort, pod, kClientPort});  // the accepted one
  }
  env_.enrolled = host;  // node side: the pod's counters are there throughout
  if (host) {
    EXPECT_TRUE(sb().enroll({}).ok());
  }

  std::map<std::string, uint64_t> verdicts, rules;
  uint64_t perProg[2] = {0, 0};
  const auto start = std::chrono::steady_clock::now();
  uint64_t ran = 0, generated = 0;
  // The node's test runs until both of its programs have had `packets`.
  auto done = [&] { return host ? std::min(perProg[0], perProg[1]) >= packets : ran >= packets; };
  for (index_ = 0; !done(); index_++) {
    if (index_ % kPhase == 0) {
      if (index_) host ? checkSnat("end of phase") : checkNat("end of phase");
      if (env_.nat.size() > kMaxNatEntries) clearNat();
      if (env_.snat.size() + env_.snatClosed.size() > kMaxNatEntries) clearSnat();
      if (seconds && std::chrono::steady_clock::now() - start > std::chrono::seconds(seconds)) break;
      host ? newHostPhase(g) : newPhase(g, prog);
      if (HasFatalFailure()) return disagreements_;
    }
    const Prog runProg = host && g.chance(50) ? Prog::HostIngress : prog;
    Generator& gen = runProg == Prog::HostIngress ? gIn : g;
    std::optional<Input> known = host && gen.chance(25) ? knownConnectionPacket(gen, runProg) : std::nullopt;
    const Input in = known ? *known : gen.next();
    Prediction want = predict(modelProg.value_or(runProg), in.frame, in.mark, env_);
    auto got = sb().run(runProg, in.frame, in.mark, env_.ifindex);
    // Counted: the runs the program itself made (test-run refuses frames
    // shorter than Ethernet + the fixed IP header before it runs).
    generated++;
    if (got.ok()) {
      ran++;
      perProg[runProg == Prog::HostIngress ? 1 : 0]++;
    }
    std::string chosen;
    if (want.portToChoose && got.ok()) chosen = choosePort(want, in.frame, got->out, env_);
    verdicts[want.refused ? "refused" : verdictName(want.verdict)]++;
    rules[want.why]++;
    if (!want.refused && want.out != in.frame) verdicts["(frame rewritten)"]++;

    std::ostringstream diff;
    if (!chosen.empty()) diff << "\n  probe port: " << chosen;
    if (want.refused || !got.ok()) {
      if (want.refused != !got.ok() || (!got.ok() && got.error().code != EINVAL))
        diff << "\n  model: " << (want.refused ? "refused (EINVAL)" : "runs") << "; program: "
             << (got.ok() ? "ran, " + verdictName(got->verdict) : got.error().message);
    } else {
      if (got->verdict != want.verdict)
        diff << "\n  verdict: model " << verdictName(want.verdict) << ", program " << verdictName(got->verdict);
      if (got->mark != want.mark) diff << "\n  mark: model " << hex32(want.mark) << ", program " << hex32(got->mark);
      if (got->out != want.out)
        diff << "\n  output frame:\n    model:   " << hexOf(want.out) << "\n    program: " << hexOf(got->out);
      if (env_.enrolled) {
        auto now = sb().counters();
        if (!now) {
          diff << "\n  pod_stats entry gone";
        } else {
          sluice_pod_stats d = minus(*now, last_);
          if (!(d == want.counts))
            diff << "\n  counters: model " << describeCounters(want.counts) << ", program " << describeCounters(d);
          last_ = *now;
        }
      }
      if (want.natRecorded) {
        auto v = sb().programs().dnsNat.lookup(natKeyOf(sb().cookie(), want.natRecorded->first));
        if (!v || !natValueIs(*v, want.natRecorded->second)) diff << "\n  dns_nat: the model's translation is missing";
      }
    }
    if (!diff.str().empty()) {
      disagree("seed " + std::to_string(seed_) + ", " + progName(runProg) + " packet " + std::to_string(index_) +
               " (mark " + hex32(in.mark) + ", " + describeEnv(env_) + ")\n  frame: " + hexOf(in.frame) + "\n  " +
               parsePacket(in.frame).describe() + " (" + std::to_string(in.frame.size()) + " bytes)\n  model's rule: " + want.why + diff.str());
      // Resynchronise the state that may have parted.
      clearNat();
      clearSnat();
      if (auto now = sb().counters()) last_ = *now;
      continue;
    }
    apply(want, env_);
  }
  host ? checkSnat("end of run") : checkNat("end of run");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ fuzz     ] %s seed %llu: %llu packets run (of %llu generated) in %.1f s (%.0f packets/s), "
              "%llu disagreements%s\n",
              host ? "host_egress + host_ingress" : progName(prog), static_cast<unsigned long long>(seed_),
              static_cast<unsigned long long>(ran), static_cast<unsigned long long>(generated), secs,
              generated / (secs > 0 ? secs : 1), static_cast<unsigned long long>(disagreements_),
              done() ? "" : " (cut short by SLUICE_FUZZ_SECONDS)");
  if (host)
    std::printf("[ fuzz     ] host_egress %llu packets, host_ingress %llu packets\n",
                static_cast<unsigned long long>(perProg[0]), static_cast<unsigned long long>(perProg[1]));
  std::printf("[ fuzz     ] %s verdicts:", host ? "host" : progName(prog));
  for (const auto& [name, n] : verdicts) std::printf(" %s=%llu", name.c_str(), static_cast<unsigned long long>(n));
  std::printf("\n");
  if (std::getenv("SLUICE_FUZZ_RULES"))
    for (const auto& [why, n] : rules) std::printf("[ fuzz     ]   %9llu  %s\n", static_cast<unsigned long long>(n), why.c_str());
  std::fflush(stdout);
  if (!selfTest) {
    EXPECT_EQ(disagreements_, 0u) << "seed " << seed_;
  }
  return disagreements_;
}

TEST_F(Fuzz, PodEgress) { fuzz(Prog::Egress); }
TEST_F(Fuzz, PodIngress) { fuzz(Prog::Ingress); }
TEST_F(Fuzz, PodLoEgress) { fuzz(Prog::LoEgress); }
// host_egress and host_ingress together (they share the probe SNAT state).
TEST_F(Fuzz, HostProbeSnat) { fuzz(Prog::HostEgress); }

// The comparison can fail: pod_ingress's frames judged by pod_egress's
// model disagree (at once: rule 6 against rule 1).
TEST_F(Fuzz, SelfTestAnotherProgramsModelDisagrees) {
  quiet_ = true;
  cap_ = 500;
  EXPECT_GT(fuzz(Prog::Ingress, Prog::Egress), 0u);
}

}  // namespace
}  // namespace sluice::test::fuzz
