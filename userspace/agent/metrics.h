// Prometheus text exposition (format 0.0.4) of the agent's own counters;
// per-pod counters are read from the maps at scrape time by the agent.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "userspace/agent/zds/server.h"

namespace sluice::agent {

struct KubeCounters;

/// A latency histogram with fixed buckets (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double seconds);
  /// `name_bucket{le=...}`, `name_sum`, `name_count` lines.
  void render(std::string& out, const std::string& name, const std::string& labels = "") const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  ///< per bucket, not cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

/// The agent's counters; thread-safe.
class Metrics {
 public:
  Metrics();
  void request(const std::string& op, bool ok);
  void addLatency(double seconds);
  void removeLatency(double seconds);
  void reconciled(size_t removed, size_t repaired, int programsReplaced, size_t errors);
  /// The CNI config watcher put sluice-cni back (or failed to look).
  void cniConf(bool restored);
  /// A connection refused because the listener served its maximum.
  void connectionRefused(bool metricsListener);

  /// Everything the agent itself counts, with HELP and TYPE lines.
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, bool>, uint64_t> requests_;
  Histogram add_;
  Histogram remove_;
  uint64_t reconciles_ = 0, podsRemoved_ = 0, podsRepaired_ = 0, programsReplaced_ = 0, reconcileErrors_ = 0;
  uint64_t cniRestores_ = 0, cniErrors_ = 0;
  uint64_t refusedApi_ = 0, refusedMetrics_ = 0;
};

/// The ZDS server's counts, told as they happen (zds::Observer); thread-safe.
class ZdsMetrics : public zds::Observer {
 public:
  ZdsMetrics();
  void request(const std::string& type, const std::string& result) override;
  void acked(double seconds) override;
  void accepted(const std::string& result) override;
  void acceptThrottled() override;
  void dropped(const std::string& reason) override;
  /// Prometheus text: sluice_ztunnel_connections (gauge, @p connections),
  /// sluice_ztunnel_requests_total{type=add|del|keep|snapshot_sent,
  /// result=ok|error|timeout|no_connection}, sluice_ztunnel_ack_duration_seconds
  /// (histogram), sluice_ztunnel_accepts_total{result=served|gone},
  /// sluice_ztunnel_accept_throttled_total,
  /// sluice_ztunnel_dropped_total{reason=...} (zds::kDropReasons).
  void render(std::string& out, size_t connections) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> requests_;
  std::map<std::string, uint64_t> accepts_, drops_;
  uint64_t throttled_ = 0;
  Histogram ackLatency_;
};

/// sluice_kube_* metrics from the Kubernetes side's counters.
void renderKubeMetrics(std::string& out, const KubeCounters& counters);

/// Appends "# HELP name help\n# TYPE name type\n".
void metricHeader(std::string& out, const std::string& name, const std::string& type, const std::string& help);
/// A label value escaped per the exposition format (\\, \", \n).
std::string labelValue(const std::string& v);

}  // namespace sluice::agent
