// The per-pod counters of pod_stats (struct sluice_pod_stats in
// maps/sluice_maps.h) by name: one list for the agent's wire format, the
// CLI's table, the sum over CPUs and the tests' messages.
#pragma once

#include <iterator>
#include <utility>
#include <vector>

#include "maps/sluice_maps.h"

namespace sluice {

/// Every counter, in wire order; the names are those of `sluicectl stats`
/// and the agent API.
inline constexpr std::pair<const char*, __u64 sluice_pod_stats::*> kPodCounters[] = {
    {"outbound_conns", &sluice_pod_stats::outbound_conns},
    {"inbound_conns", &sluice_pod_stats::inbound_conns},
    {"dns_tcp_conns", &sluice_pod_stats::dns_tcp_conns},
    {"dns_udp_queries", &sluice_pod_stats::dns_udp_queries},
    {"dns_answers", &sluice_pod_stats::dns_answers},
    {"owned_pkts", &sluice_pod_stats::owned_pkts},
    {"dropped_pkts", &sluice_pod_stats::dropped_pkts},
    {"probe_conns", &sluice_pod_stats::probe_conns},
};
// Every field but `reserved` (the never-used passed_pkts, kept for the map's
// layout) is a counter users see.
static_assert(sizeof(sluice_pod_stats) == (std::size(kPodCounters) + 1) * sizeof(__u64),
              "a counter of sluice_pod_stats is missing from kPodCounters");

/// Calls f(name, field) for each counter, in wire order (field is a
/// reference: const when s is).
template <typename S, typename F>
void eachCounter(S& s, F f) {
  for (const auto& [name, field] : kPodCounters) f(name, s.*field);
}

/// A per-CPU value of pod_stats summed over the CPUs.
inline sluice_pod_stats sumPerCpu(const std::vector<sluice_pod_stats>& perCpu) {
  sluice_pod_stats sum{};
  for (const auto& v : perCpu)
    for (const auto& [name, field] : kPodCounters) sum.*field += v.*field;
  return sum;
}

}  // namespace sluice
