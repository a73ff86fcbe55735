// BPF_PROG_TEST_RUN harness for the pod and node programs (in the style of
// Katran's tester and Cilium's bpf tests): a table of cases, each run against
// fresh state in a sandbox of its own.
//
// A Sandbox is a new network namespace plus a unique bpffs root with the
// programs loaded and their maps pinned there. The programs find their pod by
// the netns cookie of skb->dev, and in BPF_PROG_TEST_RUN skb->dev is the
// loopback device of the *calling thread's* netns, so every test run, every
// socket and the pod's map entries are made from a thread inside the
// sandbox's netns (runInNetns).
//
// Nothing is left behind: the namespace exists only as a file descriptor
// (unshare on a throw-away thread, never mounted under /var/run/netns), so
// the kernel frees it with the process even after a crash; the bpffs root is
// removed by the destructor, and roots of dead test processes (after a
// SIGKILL) are swept when the test binary starts.
#pragma once

#include <gtest/gtest.h>
#include <linux/pkt_cls.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/fd.h"
#include "loader/programs.h"
#include "base/result.h"
#include "maps/sluice_maps.h"
#include "test/common/packet.h"

namespace sluice::test {

enum class Prog { Egress, Ingress, LoEgress, HostEgress, HostIngress };
const char* progName(Prog p);

/// What the programs return when they decide nothing (bpf/lib/verdict.h):
/// TCX_NEXT on tcx, TC_ACT_UNSPEC on clsact -- the next program runs.
constexpr int kNext = -1;

/// TC verdicts by name ("TC_ACT_REDIRECT", "NEXT"), numbers only for unknown ones.
std::string verdictName(int verdict);
std::string hex32(uint32_t v);

constexpr uint32_t kDefaultPodFlags = SLUICE_POD_DNS_CAPTURE | SLUICE_POD_INBOUND_CAPTURE;
constexpr uint32_t tagMark(enum sluice_tag t) { return SLUICE_TAG_MAGIC | t; }

/// The pod's entry in pod_config (and an empty pod_stats entry).
struct PodSetup {
  bool enrolled = true;
  uint32_t flags = kDefaultPodFlags;
  std::vector<uint32_t> reroute;  ///< reroute_ifindex[], count = size()
};

/// A dns_nat entry: the querying socket (in the sandbox's netns) and the
/// resolver it asked.
struct NatEntry {
  std::string client;
  uint16_t clientPort = 0;
  uint8_t proto = 0;  ///< IPPROTO_TCP / IPPROTO_UDP
  std::string resolver;
  uint16_t resolverPort = 53;
  uint64_t cookieDelta = 0;  ///< non-zero: keyed by another netns's cookie
};

/// Sockets a case needs in the sandbox's netns (lo is brought up and the
/// case's addresses are added to it first).
enum class Sockets {
  None,
  /// A TCP connection over lo with fixed ends, IPv4 and IPv6:
  /// client kPodV4:kClientPort -> listener kRemoteV4:kServerPort (same v6).
  Connection,
};
constexpr uint16_t kServerPort = 7000;
constexpr uint16_t kClientPort = 7001;

/// What one program run produced.
struct RunResult {
  int verdict = -1;
  Bytes out;
  uint32_t mark = 0;
};

/// The loaded BPF object: a bpffs root (/sys/fs/bpf/sluice-bpft-<pid>-<n>)
/// with the programs loaded and their maps pinned there. Removed (programs
/// closed, pins and root deleted) on destruction.
struct LoadedObject {
  static Result<std::unique_ptr<LoadedObject>> load();
  ~LoadedObject();
  std::string root;
  std::unique_ptr<PodPrograms> progs;
};

/// One test's world: a fresh network namespace (so a fresh netns cookie:
/// the pod's key in every map) and the programs with empty maps.
///
/// Loading the object costs 0.2-0.4 s (libbpf reads the kernel's BTF for the
/// CO-RE relocations each time), which for ~400 cases would be minutes, so
/// by default one object is loaded per test process and its maps are
/// emptied (settings zeroed) when a Sandbox is made and when it goes away.
/// SLUICE_BPF_TEST_FRESH_LOAD=1 loads a separate object under its own bpffs
/// root for every Sandbox instead. (Run through ctest, every test is a
/// process of its own and so gets its own object and root anyway.)
class Sandbox {
 public:
  static Result<std::unique_ptr<Sandbox>> create();
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  /// Runs fn on a thread inside the sandbox's netns.
  Status inNetns(const std::function<Status()>& fn);

  /// Settings{} defaults (encodeSettings) at key 0, or all zeros.
  Status writeSettings(bool zero = false);
  /// Seeds pod_config[cookie] and pod_stats[cookie] = {}.
  Status enroll(const PodSetup& pod);
  Status seedNat(const NatEntry& e);
  Status openSockets(Sockets s);

  // ---- node side (host_tc.bpf.c) ----
  /// Seeds pod_addrs[addr] = {cookie} (Istio's probe ipset) and, unless
  /// there is one already, an empty pod_stats[cookie].
  Status addPodAddr(const std::string& addr, uint64_t cookie);
  /// Seeds a probe SNAT connection (an element of snat_rev).
  Status seedSnat(const sluice_snat_key& k, const sluice_snat_value& v);
  /// The whole snat_rev map (one element per connection), sorted by key text.
  std::vector<std::pair<sluice_snat_key, sluice_snat_value>> snatEntries() const;
  /// pod_stats[cookie] summed over CPUs (counters() for another cookie).
  std::optional<sluice_pod_stats> countersOf(uint64_t cookie) const;

  /// One BPF_PROG_TEST_RUN of prog over the frame, with ctx mark/ifindex.
  Result<RunResult> run(Prog prog, const Bytes& frame, uint32_t mark = 0, uint32_t ifindex = 1);

  /// pod_stats[cookie] summed over CPUs; nullopt when there is no entry.
  std::optional<sluice_pod_stats> counters() const;
  /// The whole dns_nat map.
  std::vector<std::pair<sluice_dns_nat_key, sluice_dns_nat_value>> natEntries() const;
  sluice_dns_nat_key natKey(const NatEntry& e) const;
  static sluice_dns_nat_value natValue(const NatEntry& e);

  uint64_t cookie() const { return cookie_; }
  PodPrograms& programs() const { return *obj_->progs; }
  const std::string& root() const { return obj_->root; }

 private:
  Sandbox() = default;
  /// Empties every map and zeroes the settings.
  Status resetMaps();

  std::unique_ptr<LoadedObject> own_;  // SLUICE_BPF_TEST_FRESH_LOAD mode
  LoadedObject* obj_ = nullptr;        // own_ or the process's shared one
  Fd netns_;
  uint64_t cookie_ = 0;
  std::vector<Fd> sockets_;
};

/// Fixture: one fresh Sandbox per test.
class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override { sb_.reset(); }
  Sandbox& sb() { return *sb_; }
  std::unique_ptr<Sandbox> sb_;
};

/// Counter values by name: "outbound_conns=1 dropped_pkts=2" ("all zero").
std::string describeCounters(const sluice_pod_stats& s);
bool operator==(const sluice_pod_stats& a, const sluice_pod_stats& b);

/// Probe SNAT key / value from text ("src:sport -> dst:dport"; the value's
/// address and port, FIN flags and the pod's netns cookie).
sluice_snat_key snatKey(const std::string& src, uint16_t sport, const std::string& dst, uint16_t dport);
sluice_snat_value snatValue(const std::string& addr, uint16_t port, uint16_t flags = 0, uint64_t cookie = 0);
/// "10.1.0.1:40000 -> 10.1.0.5:8080" / "169.254.7.127:40000 flags FIN_OUT cookie 7"
/// (pad bytes that are not zero are shown too).
std::string describeSnatKey(const sluice_snat_key& k);
std::string describeSnatValue(const sluice_snat_value& v, int family);

/// A network namespace that exists only as the returned descriptor (made by
/// unshare() on a throw-away thread): freed by the kernel when the last
/// descriptor (and the last socket in it) goes, even after a crash.
Result<Fd> newNetns();

/// Sets interface @p name up in the calling thread's network namespace.
Status linkUp(const char* name);

// Addresses used throughout (pod, a remote peer, the resolver the app asks,
// the probe SNAT addresses of the spec's defaults).
struct Family {
  const char* tag;  ///< "v4" / "v6", for case names
  const char* pod;
  const char* pod2;  ///< another address on the pod's side
  const char* remote;
  const char* resolver;
  const char* resolver2;
  const char* probe;
  const char* loopback;
};
extern const Family kV4;
extern const Family kV6;
inline const Family* const kFamilies[] = {&kV4, &kV6};

/// One row of a packet table.
struct Case {
  std::string name;  ///< test name suffix: [A-Za-z0-9_]
  std::string what;  ///< what the case proves, with the spec rule
  Prog prog;
  Packet in;
  uint32_t mark = 0;     ///< ctx_in mark
  uint32_t ifindex = 1;  ///< ctx_in ifindex (1: lo of the sandbox)
  PodSetup pod{};
  bool zeroSettings = false;
  std::vector<NatEntry> natSeed{};
  Sockets sockets = Sockets::None;

  int verdict = kNext;
  std::optional<uint32_t> outMark{};   ///< nullopt: the input mark, unchanged
  std::optional<Packet> out{};         ///< nullopt: the input frame, unchanged
  sluice_pod_stats counts{};           ///< exact expected pod_stats sums
  std::optional<NatEntry> natAdded{};  ///< the one dns_nat entry the run adds
  /// Non-empty: "BUG: ..." -- a known bug in the programs; the case is
  /// skipped unless SLUICE_BPF_TEST_KNOWN_BUGS is set in the environment.
  std::string bug{};
};

/// Runs one case in sb and checks every expectation (gtest assertions).
void runCase(Sandbox& sb, const Case& c);

/// Parameterized fixture over a table of cases.
class PacketCase : public SandboxTest, public ::testing::WithParamInterface<Case> {};
std::string caseName(const ::testing::TestParamInfo<Case>& info);
/// gtest prints a failing parameter by its name, not as bytes.
void PrintTo(const Case& c, std::ostream* os);

}  // namespace sluice::test
