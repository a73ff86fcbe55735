// What one sluice-bench run found, and its three renderings: the table on
// stdout, the JSON file, the SVG chart.
#pragma once

#include <cmath>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "test/bench/cases.h"
#include "test/bench/enroll.h"
#include "test/bench/kube.h"
#include "test/bench/micro.h"

namespace sluice::bench {

struct Config {
  bool quick = false;
  int rounds = 10;
  double duration = 1.0;
  double warmup = 0.2;
  int connConcurrency = 16;
  int rrConnections = 1;
  int dnsConcurrency = 16;
  int enrollPods = 200;
  int scalePods = 1000;
  int kubePods = 250;  ///< running pods of the labelled namespace (kube phase)
  int cliPods = 20;
  double bpfDuration = 1.0;
  int microRuns = 5000;
  bool pin = true;
  int mss = 0;  ///< TCP_MAXSEG for every client connection (0: the route's)
  bool rrSameCpu = true;  ///< request/response client on the sink's CPU
  int nice = -20;  ///< applied to the whole process (all its threads and children)
  int sliceUs = 100;  ///< EEVDF custom slice (sched_setattr), 0: the kernel's default
  int clientCpu = -1, sinkCpu = -1;
  std::vector<CaseKind> cases;
  std::vector<std::string> workloads;
  std::vector<std::string> phases;
  std::string rulesDir;
  std::string jsonPath, chartPath;
  std::string command;
  bool hasPhase(const std::string& p) const;
  bool hasCase(CaseKind k) const;
};

/// One figure of the traffic phase, per case and round (NaN: the round's
/// check failed, so it has no number).
struct Metric {
  std::string key;    ///< "conn_out.rate"
  std::string label;  ///< "outbound new connections"
  std::string unit;   ///< "conn/s"
  bool higherIsBetter = true;
  /// Indexed by round; NaN: no figure that round (a failed check).
  std::map<CaseKind, std::vector<double>> rounds;
  double median(CaseKind k) const;
  /// a/b paired by round (both measured within seconds of each other),
  /// median over rounds: robust to load that drifts between rounds. NaN
  /// when either has no figure.
  double ratio(CaseKind a, CaseKind b) const;
};

struct CaseCheck {
  std::vector<std::string> failures;
  std::vector<std::string> notes;
  int measurements = 0;  ///< measurements that passed their checks
};

/// One BPF program's run time under one workload.
struct ProgSample {
  std::string program, workload;
  uint64_t ns = 0, cnt = 0;
  double nsPerRun() const { return cnt ? static_cast<double>(ns) / static_cast<double>(cnt) : NAN; }
};

struct Target {
  std::string name;   ///< what is compared
  std::string goal;   ///< "≥ 1.25 × iptables"
  std::string value;  ///< what was measured
  int met = -1;       ///< 1 met, 0 missed, -1 not measured
};

struct Machine {
  int nproc = 0;
  std::string kernel, cpu, date, memTotal, loadavg;
};

struct Results {
  Config cfg;
  Machine machine;
  std::vector<Metric> metrics;
  std::map<CaseKind, CaseCheck> checks;
  std::map<CaseKind, std::vector<ProgSample>> bpf;
  std::string bpfStatsHow, bpfStatsBefore, bpfStatsAfter;
  std::map<CaseKind, std::vector<MicroSample>> micro;
  std::optional<EnrollResult> enroll;
  std::optional<CliResult> cli;
  std::vector<HandOffResult> handoff;  ///< sluice-cni -> agent -> ZDS ack, per mode
  std::optional<ScaleResult> scale;
  std::optional<KubeScaleResult> kube;  ///< a namespace labelled ambient at node scale
  std::vector<Target> targets;
  std::vector<std::string> errors;  ///< phase-level failures
  std::vector<std::string> roundLoad;  ///< load average when each round started
  std::vector<std::string> phaseNotes;  ///< e.g. how long namespace clean-up took
  double seconds = 0;

  Metric* metric(const std::string& key);
  const Metric* metric(const std::string& key) const;
  /// True when every case's checks, the enrollment and scale checks passed
  /// and no phase failed.
  bool verified() const;
};

/// Fills results.targets from the figures (reported, never asserted).
void evaluateTargets(Results& r);

void printReport(const Results& r, std::ostream& out);
std::string toJson(const Results& r);
std::string toSvg(const Results& r);

/// Median of the ms samples [from, to) of v.
double sliceMedian(const std::vector<double>& v, size_t from, size_t to);
double slicePercentile(const std::vector<double>& v, size_t from, size_t to, double p);

}  // namespace sluice::bench
