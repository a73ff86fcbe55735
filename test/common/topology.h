// Shared RAII fixtures of the `netns` tests: throw-away network namespaces,
// bpffs roots and a pod/node topology joined by a veth pair, plus small
// socket helpers that create their sockets inside a namespace.
//
//   node netns "sluice-node-<pid>-<n>"        pod netns "sluice-pod-<pid>-<n>"
//   +-------------------------------+         +-------------------------------+
//   | vethpod 10.200.0.1/24         |<------->| eth0 10.200.0.2/24            |
//   |         fd00:200::1/64        |  veth   |      fd00:200::2/64           |
//   | (probe addresses on demand)   |         | default via 10.200.0.1 /      |
//   |                               |         |             fd00:200::1       |
//   +-------------------------------+         +-------------------------------+
//
// The "node" is a test namespace too: nothing here touches the machine's own
// network namespace. Every name carries the pid and a per-process counter, so
// tests can run in parallel (`ctest -j`), and every destructor cleans up even
// when an assertion failed half way.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include "enroll/datapath.h"
#include "base/fd.h"
#include "base/result.h"
#include "loader/tc.h"
#include "test/standin/node_proxy.h"
#include "test/standin/standin.h"

namespace sluice::test {

using namespace std::chrono_literals;

// ---- Processes -----------------------------------------------------------------

/// What a finished child process left.
struct CommandResult {
  int exitCode = -1;  ///< exit status; 128+N when killed by signal N; -1 not run
  bool timedOut = false;
  std::string out;
  std::string err;
  /// "exit N, stdout: ..., stderr: ..." for assertion messages.
  std::string describe() const;
};

/// A child process with its stdout and stderr captured (stdin is /dev/null).
/// The destructor kills (SIGKILL, by pid) and reaps a child still running.
class Subprocess {
 public:
  /// Spawns argv (argv[0] is a path or a name looked up in PATH).
  static Result<std::unique_ptr<Subprocess>> start(const std::vector<std::string>& argv);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  /// Collects the output and waits for the exit; past the timeout the child
  /// is killed and the result says timedOut.
  CommandResult wait(std::chrono::milliseconds timeout = 30s);

  /// The child's pid (-1 once it was reaped).
  pid_t pid() const { return pid_; }
  /// Sends @p sig to the child (while it runs).
  void signal(int sig);

 private:
  Subprocess() = default;
  pid_t pid_ = -1;
  Fd out_;
  Fd err_;
};

/// Runs argv to completion (see Subprocess).
CommandResult runCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout = 30s);

/// Runs a /bin/sh command line to completion.
CommandResult sh(const std::string& commandLine, std::chrono::milliseconds timeout = 30s);

/// Path of a binary built by this project (SLUICE_BUILD_DIR/name).
std::string builtBinary(const std::string& name);

// ---- Namespaces and bpffs ------------------------------------------------------

/// A named network namespace (`ip netns add sluice-<tag>-<pid>-<n>`) with lo
/// up, deleted in the destructor.
class TestNetns {
 public:
  explicit TestNetns(const std::string& tag);
  ~TestNetns();
  TestNetns(const TestNetns&) = delete;
  TestNetns& operator=(const TestNetns&) = delete;

  /// False when creating it failed; error() says why.
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  const std::string& name() const { return name_; }
  /// /run/netns/NAME.
  std::string path() const;

  /// Runs fn on a thread that joined this namespace (loader's runInNetns).
  Status run(const std::function<Status()>& fn) const;

  /// The namespace's cookie: the key of its pod in pod_config/pod_stats.
  Result<uint64_t> cookie() const;

  /// `ip -n NAME ARGS`.
  CommandResult ip(const std::string& args) const;

  /// Reads /proc/sys/KEY of this namespace ("net/ipv4/conf/eth0/accept_local").
  Result<std::string> sysctl(const std::string& key) const;
  Status setSysctl(const std::string& key, const std::string& value) const;

  /// Deletes the namespace now (idempotent); the destructor then does nothing.
  void remove();

 private:
  std::string name_;
  std::string error_;
  bool removed_ = false;
};

/// A private bpffs root /sys/fs/bpf/sluice-t-<pid>-<n> (not created: the
/// loader creates it), removed with everything pinned under it.
class TestBpffs {
 public:
  TestBpffs();
  ~TestBpffs();
  TestBpffs(const TestBpffs&) = delete;
  TestBpffs& operator=(const TestBpffs&) = delete;

  const std::string& root() const { return root_; }
  /// Where the tcx links of pod @p id are pinned.
  std::string linkDir(const std::string& id) const;

 private:
  std::string root_;
};

/// Deletes what earlier runs of these fixtures left behind after a crash
/// (namespaces and bpffs roots whose pid is gone). Runs once per process.
void cleanupStaleTestState();

// ---- Addresses -----------------------------------------------------------------

/// An IP address and port of either family.
struct Endpoint {
  sockaddr_storage ss{};
  socklen_t len = 0;

  /// "10.0.0.1" / "fd00::1"; an empty Endpoint (len 0) when @p ip is invalid.
  static Endpoint of(const std::string& ip, uint16_t port);
  static Endpoint fromSockaddr(const sockaddr* sa, socklen_t len);
  /// The wildcard address of @p family.
  static Endpoint any(int family, uint16_t port = 0);

  bool valid() const { return len != 0; }
  int family() const { return ss.ss_family; }
  uint16_t port() const;
  Endpoint withPort(uint16_t port) const;
  /// The address alone; v4-mapped IPv6 is printed as plain IPv4.
  std::string ip() const;
  /// "1.2.3.4:80" / "[fd00::1]:80": the format of ProxyEvent.
  std::string str() const;
  const sockaddr* raw() const { return reinterpret_cast<const sockaddr*>(&ss); }
  sockaddr* raw() { return reinterpret_cast<sockaddr*>(&ss); }
};

// ---- Sockets -------------------------------------------------------------------

/// Default time limit of every network step, so that a broken redirect fails
/// the test quickly instead of hanging it.
inline constexpr std::chrono::milliseconds kIoTimeout = 2s;

/// A socket created inside @p ns (close-on-exec, send/receive time-outs of
/// kIoTimeout). The socket stays in that namespace whatever thread uses it.
Result<Fd> socketIn(const TestNetns& ns, int family, int type);

struct ConnectOptions {
  std::chrono::milliseconds timeout = kIoTimeout;
  uint32_t mark = 0;              ///< SO_MARK when non-zero
  std::optional<Endpoint> bind;   ///< local address to bind first
};

/// A TCP connection from inside @p ns to @p dst; the error carries errno
/// (ETIMEDOUT after options.timeout, ECONNREFUSED, ...).
Result<Fd> tcpConnect(const TestNetns& ns, const Endpoint& dst, const ConnectOptions& options = {});

/// Sends @p payload on a connected TCP socket and reads until as many bytes
/// came back (or EOF / time-out); returns what was read.
Result<std::string> echoRoundTrip(int fd, const std::string& payload, std::chrono::milliseconds timeout = kIoTimeout);
/// echoRoundTrip's answer, or "error: " and the error's text (for tests
/// that compare what a connection saw with one expectation).
std::string echoOrError(int fd, const std::string& payload);

/// Reads until EOF or @p max bytes or time-out.
Result<std::string> readSome(int fd, size_t max, std::chrono::milliseconds timeout = kIoTimeout);

/// @p bound stretched for a slow machine: times SLUICE_TEST_TIME_SCALE (an
/// integer, default 1), which the 6.1 guest sets under emulation
/// (vagrant/local/guest.sh), where a whole agent start, watch and hand-off
/// can take many times as long as on hardware. For bounds on something
/// expected to happen only: stretching them costs nothing when it does.
std::chrono::milliseconds scaledBound(std::chrono::milliseconds bound);

/// Polls @p cond every 5 ms until it holds (true) or @p timeout (scaled by
/// scaledBound) passes (false, after one last look).
bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout = 10s);

/// One short connection from inside @p ns to @p dst: connect, a 1-byte
/// echo, close. Fails with what went wrong (the connection loops of the
/// restart and upgrade tests count these).
Status connectAndEcho(const TestNetns& ns, const Endpoint& dst, std::chrono::milliseconds timeout = 3s);

/// An HTTP/1.0 GET of @p path from 127.0.0.1:@p port (in the caller's
/// netns): the whole answer (status line, headers, body), or what failed
/// (nothing for @p timeout is a failure).
std::string httpGetLoopback(uint16_t port, const std::string& path, std::chrono::milliseconds timeout = kIoTimeout);

/// Local / remote address of a socket.
Endpoint localOf(int fd);
Endpoint peerOf(int fd);

/// A TCP server inside a namespace, served by its own thread: accepts, records
/// each peer, and echoes everything back (or, with a greeting, sends it first).
class TcpServer {
 public:
  /// Binds @p addr (port 0: the kernel picks) and listens. A v6 wildcard is
  /// v6-only, so v4 and v6 servers never share a socket. With
  /// @p closeAfterEcho the server closes each connection after its first
  /// echo (the server closes first).
  static Result<std::unique_ptr<TcpServer>> start(const TestNetns& ns, const Endpoint& addr,
                                                  bool closeAfterEcho = false);
  ~TcpServer();
  TcpServer(const TcpServer&) = delete;
  TcpServer& operator=(const TcpServer&) = delete;

  /// The bound address (with the kernel's port).
  const Endpoint& local() const { return local_; }
  uint16_t port() const { return local_.port(); }

  /// Peers of the connections accepted so far, in order.
  std::vector<Endpoint> peers() const;
  size_t accepted() const;
  bool waitForAccepts(size_t n, std::chrono::milliseconds timeout) const;

 private:
  TcpServer() = default;
  void serve();

  Endpoint local_;
  bool closeAfterEcho_ = false;
  Fd listen_;
  Fd wake_;
  std::thread thread_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::vector<Endpoint> peers_;
};

/// One datagram a UdpServer received.
struct Datagram {
  Endpoint from;
  std::string payload;
};

/// A UDP server inside a namespace that records each datagram and sends it
/// back to its sender.
class UdpServer {
 public:
  static Result<std::unique_ptr<UdpServer>> start(const TestNetns& ns, const Endpoint& addr);
  ~UdpServer();
  UdpServer(const UdpServer&) = delete;
  UdpServer& operator=(const UdpServer&) = delete;

  const Endpoint& local() const { return local_; }
  uint16_t port() const { return local_.port(); }
  std::vector<Datagram> received() const;
  bool waitForDatagrams(size_t n, std::chrono::milliseconds timeout) const;

 private:
  UdpServer() = default;
  void serve();

  Endpoint local_;
  Fd sock_;
  Fd wake_;
  std::thread thread_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::vector<Datagram> received_;
};

/// What came back to a UDP client.
struct UdpReply {
  Endpoint from;
  std::string payload;
};

/// Sends @p payload from a fresh UDP socket inside @p ns to @p dst and waits
/// for one datagram back. With @p connected the socket is connect()ed first,
/// so the kernel drops anything not from @p dst exactly.
Result<UdpReply> udpExchange(const TestNetns& ns, const Endpoint& dst, const std::string& payload,
                             bool connected = true, std::chrono::milliseconds timeout = kIoTimeout);

/// Sends one ICMP / ICMPv6 echo request from inside @p ns (raw socket) and
/// waits for the matching echo reply.
Status icmpEcho(const TestNetns& ns, const std::string& dstIp, std::chrono::milliseconds timeout = kIoTimeout);

// ---- DNS -----------------------------------------------------------------------

/// A DNS query (RD set) for @p name / @p qtype (1 = A, 28 = AAAA).
std::string dnsQuery(uint16_t id, const std::string& name, uint16_t qtype);

struct DnsAnswer {
  uint16_t id = 0;
  bool response = false;
  uint16_t rcode = 0;
  std::string question;                ///< "example.com"
  std::vector<std::string> addresses;  ///< A / AAAA records, as text
};

/// Parses a DNS message (header, one question, A/AAAA answers); nullopt
/// when it is malformed.
std::optional<DnsAnswer> parseDnsAnswer(const std::string& msg);

// ---- The pod topology ------------------------------------------------------------

/// A "node" and a "pod" namespace joined by veth vethpod <-> eth0 (see the
/// diagram at the top of this file), with permanent neighbour entries both
/// ways so no test depends on ARP / ND timing.
class PodTopology {
 public:
  static constexpr const char* kPodV4 = "10.200.0.2";
  static constexpr const char* kNodeV4 = "10.200.0.1";
  static constexpr const char* kPodV6 = "fd00:200::2";
  static constexpr const char* kNodeV6 = "fd00:200::1";
  static constexpr const char* kProbeV4 = "169.254.7.127";
  static constexpr const char* kProbeV6 = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff";

  PodTopology();
  ~PodTopology() = default;
  PodTopology(const PodTopology&) = delete;
  PodTopology& operator=(const PodTopology&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  TestNetns& node() { return node_; }
  TestNetns& pod() { return pod_; }
  const TestNetns& node() const { return node_; }
  const TestNetns& pod() const { return pod_; }

  static std::string podAddr(int family) { return family == AF_INET ? kPodV4 : kPodV6; }
  static std::string nodeAddr(int family) { return family == AF_INET ? kNodeV4 : kNodeV6; }
  static std::string probeAddr(int family) { return family == AF_INET ? kProbeV4 : kProbeV6; }

  /// Another veth pair: @p podIf in the pod with 10.200.<subnet>.2/24 and
  /// fd00:200:<subnet>::2/64, @p nodeIf in the node with .1 / ::1; neighbour
  /// entries both ways. No routes beyond the connected ones.
  Status addVeth(const std::string& podIf, const std::string& nodeIf, int subnet);

  /// The probe SNAT addresses (169.254.7.127/32 and the v6 one) as secondary
  /// addresses of the node's vethpod, and routes back to them in the pod.
  Status addProbeAddresses();

 private:
  Status build();
  Status linkVeth(const std::string& podIf, const std::string& nodeIf, const std::string& podMac,
                  const std::string& nodeMac, const std::string& podV4, const std::string& nodeV4,
                  const std::string& podV6, const std::string& nodeV6, int prefixV4, int prefixV6);

  TestNetns node_{"node"};
  TestNetns pod_{"pod"};
  std::string error_;
};

// ---- A pod enrolled into sluice, with the stand-in ------------------------------

/// Everything a data-plane test needs, destroyed in the safe order: the
/// stand-in first, then the pod's enrollment (removed when still there),
/// the Datapath, the namespaces, and last the bpffs root.
class PodHarness {
 public:
  /// Captured at TC, attached in @p mode.
  explicit PodHarness(TcMode mode);
  /// Captured as @p capture says (TC hooks, if any, attached in @p mode).
  PodHarness(TcMode mode, CaptureMode capture);
  ~PodHarness();
  PodHarness(const PodHarness&) = delete;
  PodHarness& operator=(const PodHarness&) = delete;

  /// Opens the Datapath on the private bpffs root (once).
  Status open();
  /// Before open(): keep @p n sk_lookup programs loaded ahead, as the agent
  /// does (DatapathOptions::skLookupStubsAhead).
  void keepSkLookupStubs(size_t n) { stubsAhead_ = n; }
  /// Before open(): attach the pod guard at the first enrollment, as the
  /// agent and sluicectl do (DatapathOptions::podGuard). Off by default
  /// here: each BPF LSM attach patches kernel text, hundreds of times over
  /// a suite in an emulated guest; the PodGuard tests turn it on.
  void enablePodGuard() { podGuard_ = true; }
  Datapath& datapath() { return *dp_; }

  /// Enrolls the pod netns; @p spec's netnsPath and id are filled in when
  /// empty (the id defaults to the pod netns' name).
  Result<PodInfo> enroll(PodSpec spec = {}, const Handoff* hook = nullptr);
  /// Removes the pod enrolled by enroll().
  Status unenroll();
  const std::string& podId() const { return podId_; }

  /// Starts the stand-in in the pod netns (config.netnsPath is set).
  Status startStandIn(StandInConfig config = {});
  void stopStandIn();
  /// Waits until the stand-in relays nothing (every connection's two ends
  /// closed). A stop before that resets the relays still open, as a killed
  /// proxy's are, and their app's FIN then meets no proxy socket: a counted
  /// drop. False when connections are still open at the timeout.
  bool waitStandInIdle(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  ProxyStandIn& standIn() { return *standIn_; }
  /// The stand-in's events (empty when it never ran).
  std::vector<ProxyEvent> events() const;
  /// Events of one listener ("outbound", "inbound", "hbone", "dns-udp", "dns-tcp").
  std::vector<ProxyEvent> events(const std::string& listener) const;
  /// Waits until an event of @p listener arrived; the first such event.
  std::optional<ProxyEvent> waitForEvent(const std::string& listener, std::chrono::milliseconds timeout = kIoTimeout);

  /// The pod's counters (all zero when unknown).
  sluice_pod_stats stats();

  TestBpffs& bpffs() { return bpffs_; }
  PodTopology& topo() { return topo_; }
  TestNetns& node() { return topo_.node(); }
  TestNetns& pod() { return topo_.pod(); }
  TcMode mode() const { return mode_; }
  CaptureMode capture() const { return capture_; }
  /// Whether the pod's capture can hand connections to SO_REUSEPORT
  /// listeners here (the socket mode on any kernel, TC from Linux 6.6; a
  /// socket-mode pod with --reroute-iface has that interface captured at
  /// TC): startStandIn leaves ztunnel's SO_REUSEPORT on exactly then.
  bool servesReuseport() const;

 private:
  TcMode mode_;
  CaptureMode capture_ = CaptureMode::Tc;
  bool rerouted_ = false;  ///< the enrolled pod has reroute interfaces
  size_t stubsAhead_ = 0;
  bool podGuard_ = false;
  TestBpffs bpffs_;
  PodTopology topo_;
  std::unique_ptr<Datapath> dp_;
  std::string podId_;
  bool enrolled_ = false;
  std::unique_ptr<ProxyStandIn> standIn_;  // kept after stop(): its events stay readable
};

/// Text of a list of events, for assertion messages.
std::string describe(const std::vector<ProxyEvent>& events);

/// "tcx" / "legacy", for test names.
inline const char* modeName(TcMode m) { return m == TcMode::Legacy ? "legacy" : m == TcMode::Tcx ? "tcx" : "auto"; }

/// Why this kernel cannot capture at the socket, or "" when it can. Tests
/// skip with this reason (GTEST_SKIP).
std::string socketCaptureUnsupported();

/// A mode of a parametrized test: captured at TC with tcx or legacy
/// attachment, or captured at the socket.
struct ModeParam {
  const char* name;  ///< "tcx" | "legacy" | "socket": the test name's suffix
  TcMode tc;
  CaptureMode capture;
};
inline constexpr ModeParam kTcxMode{"tcx", TcMode::Tcx, CaptureMode::Tc};
inline constexpr ModeParam kLegacyMode{"legacy", TcMode::Legacy, CaptureMode::Tc};
inline constexpr ModeParam kSocketMode{"socket", TcMode::Auto, CaptureMode::Socket};
/// Why this kernel cannot run @p m, or "" when it can.
std::string modeUnsupported(const ModeParam& m);
/// gtest prints a ModeParam by its name (not as a byte dump).
inline void PrintTo(const ModeParam& m, std::ostream* os) { *os << m.name; }

/// For a fixture's SetUp: @p h becomes a harness captured in @p m with its
/// Datapath open (and, with @p podGuard, the pod guard on). Skips the test,
/// saying why, where it cannot run (not root, a mode this kernel lacks);
/// fails it when the topology or the Datapath cannot be set up. Callers
/// return when HasFatalFailure() or IsSkipped().
void openHarness(std::unique_ptr<PodHarness>& h, const ModeParam& m, bool podGuard = false);

/// Why this kernel cannot run a test in mode @p m (tcx before Linux 6.6),
/// or "" when it can. Tests skip with this reason (GTEST_SKIP), so a run on
/// an old kernel shows what it did not cover.
std::string tcModeUnsupported(TcMode m);

/// False before Linux 6.6: the kernel cannot hand packets to SO_REUSEPORT
/// sockets, so the harness starts the stand-in without it.
bool kernelAssignsReuseport();

/// The stand-in's defaults, with ztunnel's SO_REUSEPORT wherever the
/// capture mode can serve it (the socket mode on every kernel; the TC mode
/// where the kernel can assign such sockets, Linux 6.6+): what every test
/// whose stand-in receives redirected traffic starts from.
StandInConfig testStandInConfig(CaptureMode capture = CaptureMode::Tc);

/// The node proxy stand-in connecting to @p zdsPath with ztunnel's per-pod
/// socket choices, SO_REUSEPORT only where the kernel can assign such
/// sockets (as testStandInConfig()), and short retry / reconnect intervals
/// (200 ms, 5..50 ms) so tests do not wait for the real 5 s / 15 s.
NodeProxyConfig testNodeProxyConfig(const std::string& zdsPath);

/// "ipv4" / "ipv6", for test names.
inline const char* familyName(int family) { return family == AF_INET ? "ipv4" : "ipv6"; }

/// "tcx_ipv4"-style test names for parameters std::tuple<TcMode, int family>
/// (a GoogleTest name generator).
inline constexpr auto modeFamilyName = [](const auto& info) {
  return std::string(modeName(std::get<0>(info.param))) + "_" + familyName(std::get<1>(info.param));
};

}  // namespace sluice::test
