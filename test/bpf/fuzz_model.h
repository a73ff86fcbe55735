// The reference model of the differential fuzzer (fuzz_test.cpp): what the
// redirection contract (docs/redirection.md, README "Fail closed on what
// cannot be judged") says a pod program must do with a frame, written from
// the contract and the kernel's view of a frame -- not from bpf/ -- so that
// a packet on which the two disagree is a bug in one of them.
//
// The model predicts everything a BPF_PROG_TEST_RUN shows: the verdict, the
// mark, the output frame (DNS translation, the reset given to an app whose
// proxy socket is gone), the pod's counters and the DNS translation it
// records. It keeps the state a pod has between packets (its recorded DNS
// queries) and knows the sockets of the sandbox's network namespace.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "maps/sluice_maps.h"
#include "test/bpf/harness.h"
#include "test/common/packet.h"

namespace sluice::test::fuzz {

/// A recorded DNS query: the querying end (the app's address and port,
/// protocol, family), as the pod's query left it.
struct NatClient {
  int family = 0;
  std::array<uint8_t, 16> addr{};
  uint16_t port = 0;  ///< host byte order
  uint8_t proto = 0;
  auto operator<=>(const NatClient&) const = default;
};
/// The resolver the query was sent to.
struct NatResolver {
  std::array<uint8_t, 16> addr{};
  uint16_t port = 0;  ///< host byte order
  bool operator==(const NatResolver&) const = default;
};

/// A TCP connection in the pod's netns: a socket whose local end is
/// local:localPort and whose peer is peer:peerPort.
struct Conn {
  IpAddr local;
  uint16_t localPort = 0;
  IpAddr peer;
  uint16_t peerPort = 0;
};

/// A probe SNAT connection's key: the pod's end and the translated port
/// its replies go to (the probe address is the family's).
struct SnatKey {
  int family = 0;
  std::array<uint8_t, 16> pod{};
  uint16_t podPort = 0;
  uint16_t port = 0;  ///< the translated (probe-side) port
  auto operator<=>(const SnatKey&) const = default;
};
/// The prober behind a translated connection, and the FINs seen.
struct SnatConn {
  IpAddr prober;
  uint16_t proberPort = 0;
  uint16_t flags = 0;  ///< SLUICE_SNAT_FIN_OUT / SLUICE_SNAT_FIN_IN
};

/// The pod as the programs find it.
struct Env {
  bool settings = true;  ///< the loader wrote the settings (spec defaults)
  bool enrolled = true;  ///< pod_config (and pod_stats) hold the pod
  uint32_t flags = kDefaultPodFlags;
  std::vector<uint32_t> reroute;  ///< reroute interfaces
  uint32_t ifindex = 1;           ///< the interface the packet passes
  /// The proxy's listeners exist in the netns (15001, 15006 on [::];
  /// 15053 TCP and UDP on loopback).
  bool listeners = false;
  /// Established TCP sockets (listeners are never owners).
  std::vector<Conn> conns;
  /// The pod's recorded DNS queries.
  std::map<NatClient, NatResolver> nat;

  // ---- node side (rules 10, 11) ----
  /// Enrolled pods' addresses (Istio's probe ipset), all of this pod.
  std::vector<IpAddr> podAddrs;
  /// Translated probe connections, and finished ones kept for late packets.
  std::map<SnatKey, SnatConn> snat, snatClosed;
};

/// What one run must show.
struct Prediction {
  bool refused = false;  ///< BPF_PROG_TEST_RUN refuses the frame (EINVAL)
  int verdict = kNext;
  uint32_t mark = 0;
  Bytes out;
  sluice_pod_stats counts{};  ///< the run's increments of the pod's counters
  std::optional<std::pair<NatClient, NatResolver>> natRecorded;
  // Probe SNAT state changes, applied in this order.
  std::optional<SnatKey> closedErase;                   ///< a new connection takes over the key
  std::optional<std::pair<SnatKey, SnatConn>> snatSet;  ///< opened or tracked
  std::optional<SnatKey> snatForget;                    ///< finished: leaves snat
  bool keepClosed = false;                              ///< ...and is kept in snatClosed
  /// A new probe connection whose prober's own port is taken on the probe
  /// address: the contract wants "another port", which the program
  /// chooses; chosePort() checks and takes it from the program's output.
  bool portToChoose = false;
  std::string why;  ///< the rule that decided, for a disagreement report
};

/// The model's prediction for one run of @p prog over @p frame with
/// ctx mark @p mark in @p env. Does not change env (see apply()).
Prediction predict(Prog prog, const Bytes& frame, uint32_t mark, const Env& env);

/// The state change a prediction implies (a recorded DNS query, probe
/// SNAT state).
void apply(const Prediction& p, Env& env);

/// For a prediction with portToChoose on @p frame: the port the program
/// chose, read from its output @p got; checks it is another free port in 1024-65535
/// and completes the prediction with it. Empty string when acceptable,
/// else why not.
std::string choosePort(Prediction& p, const Bytes& frame, const Bytes& got, const Env& env);

}  // namespace sluice::test::fuzz
