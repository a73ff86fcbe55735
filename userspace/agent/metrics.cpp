#include "userspace/agent/metrics.h"

#include <algorithm>
#include <cstdio>

#include "userspace/agent/kube/wiring.h"

namespace sluice::agent {

namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// Pod add/remove take about a millisecond in process; the buckets span
// 100 µs to 10 s.
std::vector<double> latencyBounds() { return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10}; }

// 50 µs .. 5 s (the default ack deadline): an ack from a local ztunnel comes
// in well under a millisecond; the upper buckets show a struggling one.
std::vector<double> ackBounds() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
}

}  // namespace

void metricHeader(std::string& out, const std::string& name, const std::string& type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

std::string labelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double seconds) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin();
  counts_[i]++;
  sum_ += seconds;
  count_++;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); i++) {
    cumulative += counts_[i];
    out += name + "_bucket{" + labels + sep + "le=\"" + number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{" + labels + sep + "le=\"+Inf\"} " + std::to_string(count_) + "\n";
  std::string braces = labels.empty() ? "" : "{" + labels + "}";
  out += name + "_sum" + braces + " " + number(sum_) + "\n";
  out += name + "_count" + braces + " " + std::to_string(count_) + "\n";
}

Metrics::Metrics() : add_(latencyBounds()), remove_(latencyBounds()) {}

void Metrics::request(const std::string& op, bool ok) {
  std::lock_guard<std::mutex> g(mu_);
  requests_[{op, ok}]++;
}

void Metrics::addLatency(double seconds) {
  std::lock_guard<std::mutex> g(mu_);
  add_.observe(seconds);
}

void Metrics::removeLatency(double seconds) {
  std::lock_guard<std::mutex> g(mu_);
  remove_.observe(seconds);
}

void Metrics::reconciled(size_t removed, size_t repaired, int programsReplaced, size_t errors) {
  std::lock_guard<std::mutex> g(mu_);
  reconciles_++;
  podsRemoved_ += removed;
  podsRepaired_ += repaired;
  programsReplaced_ += static_cast<uint64_t>(programsReplaced);
  reconcileErrors_ += errors;
}

void Metrics::cniConf(bool restored) {
  std::lock_guard<std::mutex> g(mu_);
  (restored ? cniRestores_ : cniErrors_)++;
}

void Metrics::connectionRefused(bool metricsListener) {
  std::lock_guard<std::mutex> g(mu_);
  (metricsListener ? refusedMetrics_ : refusedApi_)++;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> g(mu_);
  std::string out;
  metricHeader(out, "sluice_agent_requests_total", "counter", "API requests handled, by op and result.");
  for (const auto& [key, n] : requests_)
    out += "sluice_agent_requests_total{op=\"" + labelValue(key.first) + "\",result=\"" + (key.second ? "ok" : "error") +
           "\"} " + std::to_string(n) + "\n";
  uint64_t errors = 0;
  for (const auto& [key, n] : requests_)
    if (!key.second) errors += n;
  metricHeader(out, "sluice_agent_errors_total", "counter", "Failed API requests, reconciliation problems left unrepaired, unreadable CNI configuration.");
  out += "sluice_agent_errors_total{source=\"api\"} " + std::to_string(errors) + "\n";
  out += "sluice_agent_errors_total{source=\"reconcile\"} " + std::to_string(reconcileErrors_) + "\n";
  out += "sluice_agent_errors_total{source=\"cni_conf\"} " + std::to_string(cniErrors_) + "\n";
  metricHeader(out, "sluice_pod_add_duration_seconds", "histogram", "Time to enroll a pod (successful adds).");
  add_.render(out, "sluice_pod_add_duration_seconds");
  metricHeader(out, "sluice_pod_remove_duration_seconds", "histogram", "Time to remove a pod (successful removals).");
  remove_.render(out, "sluice_pod_remove_duration_seconds");
  metricHeader(out, "sluice_reconcile_runs_total", "counter", "Completed reconciliation sweeps.");
  out += "sluice_reconcile_runs_total " + std::to_string(reconciles_) + "\n";
  metricHeader(out, "sluice_reconcile_pods_removed_total", "counter", "Pods removed because their netns was gone.");
  out += "sluice_reconcile_pods_removed_total " + std::to_string(podsRemoved_) + "\n";
  metricHeader(out, "sluice_reconcile_pods_repaired_total", "counter", "Pods found damaged by a sweep.");
  out += "sluice_reconcile_pods_repaired_total " + std::to_string(podsRepaired_) + "\n";
  metricHeader(out, "sluice_reconcile_programs_replaced_total", "counter",
               "Hooks switched in place to the agent's programs (upgrades, pods enrolled by another process).");
  out += "sluice_reconcile_programs_replaced_total " + std::to_string(programsReplaced_) + "\n";
  metricHeader(out, "sluice_cni_conflist_restored_total", "counter",
               "Times sluice-cni was put back into the primary CNI conflist after it was rewritten without it.");
  out += "sluice_cni_conflist_restored_total " + std::to_string(cniRestores_) + "\n";
  metricHeader(out, "sluice_agent_connections_refused_total", "counter",
               "Connections refused because the listener already served its maximum (--max-connections).");
  out += "sluice_agent_connections_refused_total{listener=\"api\"} " + std::to_string(refusedApi_) + "\n";
  out += "sluice_agent_connections_refused_total{listener=\"metrics\"} " + std::to_string(refusedMetrics_) + "\n";
  return out;
}

ZdsMetrics::ZdsMetrics() : ackLatency_(ackBounds()) {}

void ZdsMetrics::request(const std::string& type, const std::string& result) {
  std::lock_guard lock(mu_);
  requests_[{type, result}]++;
}

void ZdsMetrics::acked(double seconds) {
  std::lock_guard lock(mu_);
  ackLatency_.observe(seconds);
}

void ZdsMetrics::accepted(const std::string& result) {
  std::lock_guard lock(mu_);
  accepts_[result]++;
}

void ZdsMetrics::acceptThrottled() {
  std::lock_guard lock(mu_);
  throttled_++;
}

void ZdsMetrics::dropped(const std::string& reason) {
  std::lock_guard lock(mu_);
  drops_[reason]++;
}

void ZdsMetrics::render(std::string& out, size_t connections) const {
  metricHeader(out, "sluice_ztunnel_connections", "gauge", "ztunnel connections on the ZDS socket (after their hello).");
  out += "sluice_ztunnel_connections " + std::to_string(connections) + "\n";
  std::lock_guard lock(mu_);
  metricHeader(out, "sluice_ztunnel_requests_total", "counter",
               "ZDS requests to ztunnel by type and result (error: error ack or broken connection).");
  for (const char* type : zds::kRequestTypes) {
    for (const char* result : zds::kRequestResults) {
      auto it = requests_.find({type, result});
      uint64_t n = it == requests_.end() ? 0 : it->second;
      out += std::string("sluice_ztunnel_requests_total{type=\"") + type + "\",result=\"" + result + "\"} " +
             std::to_string(n) + "\n";
    }
  }
  metricHeader(out, "sluice_ztunnel_ack_duration_seconds", "histogram", "Time from sending a ZDS request to its ack.");
  ackLatency_.render(out, "sluice_ztunnel_ack_duration_seconds");
  auto counted = [](const std::map<std::string, uint64_t>& m, const char* key) {
    auto it = m.find(key);
    return std::to_string(it == m.end() ? 0 : it->second);
  };
  metricHeader(out, "sluice_ztunnel_accepts_total", "counter",
               "Connections accepted on the ZDS socket (gone: its peer had left while it waited in the backlog).");
  for (const char* result : zds::kAcceptResults)
    out += std::string("sluice_ztunnel_accepts_total{result=\"") + result + "\"} " + counted(accepts_, result) + "\n";
  metricHeader(out, "sluice_ztunnel_accept_throttled_total", "counter",
               "Times the accept rate limit (5 a second, as Istio's agent) held back a waiting connection.");
  out += "sluice_ztunnel_accept_throttled_total " + std::to_string(throttled_) + "\n";
  metricHeader(out, "sluice_ztunnel_dropped_total", "counter", "ZDS connections the agent dropped, by reason.");
  for (const char* reason : zds::kDropReasons)
    out += std::string("sluice_ztunnel_dropped_total{reason=\"") + reason + "\"} " + counted(drops_, reason) + "\n";
}

void renderKubeMetrics(std::string& out, const KubeCounters& c) {
  const kube::ControllerStats& s = c.controller;
  auto gauge = [&](const char* name, const char* help, uint64_t v) {
    metricHeader(out, name, "gauge", help);
    out += std::string(name) + " " + std::to_string(v) + "\n";
  };
  auto counter = [&](const char* name, const char* help, std::initializer_list<std::pair<const char*, uint64_t>> rows) {
    metricHeader(out, name, "counter", help);
    for (const auto& [label, v] : rows) out += std::string(name) + label + " " + std::to_string(v) + "\n";
  };
  gauge("sluice_kube_synced", "1 once the pod and namespace caches listed and the start-up reconciliation ran.",
        s.synced && s.reconciled ? 1 : 0);
  gauge("sluice_kube_pods_enrolled", "Pods of this node the Kubernetes controller holds as enrolled.", s.enrolled);
  gauge("sluice_kube_queue_depth", "Pods waiting for the controller (or for a retry).", s.queued);
  counter("sluice_kube_dataplane_total", "The controller's changes to the data plane, by operation and result.",
          {{"{op=\"enroll\",result=\"ok\"}", s.enrolls},
           {"{op=\"enroll\",result=\"error\"}", s.enrollFailures},
           {"{op=\"update\",result=\"ok\"}", s.updates},
           {"{op=\"update\",result=\"error\"}", s.updateFailures},
           {"{op=\"unenroll\",result=\"ok\"}", s.unenrolls},
           {"{op=\"unenroll\",result=\"error\"}", s.unenrollFailures}});
  counter("sluice_kube_netns_not_found_total", "Selected running pods whose network namespace was not found (retried).",
          {{"", s.netnsNotFound}});
  counter("sluice_kube_status_patches_total", "ambient.istio.io/redirection patches of pods/status, by result.",
          {{"{result=\"ok\"}", s.patches}, {"{result=\"error\"}", s.patchFailures}});
  counter("sluice_kube_cni_decisions_total", "The API's adds answered from Kubernetes, by answer.",
          {{"{answer=\"enrolled\"}", c.cniEnrolled},
           {"{answer=\"not_in_mesh\"}", c.cniNotInMesh},
           {"{answer=\"error\"}", c.cniErrors},
           {"{answer=\"no_identity\"}", c.cniByHand}});
  counter("sluice_kube_direct_lookups_total", "Pods the CNI path asked the API server for (not yet in the watch cache).",
          {{"", s.directLookups}});
  counter("sluice_kube_watch_errors_total", "Failed list/watch attempts, by resource.",
          {{"{resource=\"pods\"}", s.pods.errors}, {"{resource=\"namespaces\"}", s.namespaces.errors}});
}

}  // namespace sluice::agent
