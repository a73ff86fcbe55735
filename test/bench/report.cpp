#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <functional>
#include <iomanip>
#include <set>
#include <sstream>

#include "test/bench/results.h"
#include "test/bench/util.h"

namespace sluice::bench {

namespace {

using json = nlohmann::json;

const char* shortName(CaseKind k) {
  switch (k) {
    case CaseKind::Floor: return "floor";
    case CaseKind::Iptables: return "ipt";
    case CaseKind::IptablesLegacy: return "ipt-leg";
    case CaseKind::SluiceTcx: return "tcx";
    case CaseKind::SluiceLegacy: return "legacy";
    case CaseKind::TcMinimal: return "minimal";
    case CaseKind::SluiceSocket: return "socket";
    case CaseKind::FloorXdp: return "floor+xdp";
    case CaseKind::FloorXdpFrags: return "floor+xdpf";
    case CaseKind::SluiceTcxXdp: return "tcx+xdp";
    case CaseKind::SluiceTcxXdpFrags: return "tcx+xdpf";
    case CaseKind::SluiceSocketXdp: return "socket+xdp";
    case CaseKind::SluiceSocketXdpFrags: return "socket+xdpf";
  }
  return "?";
}

const char* color(CaseKind k) {
  switch (k) {
    case CaseKind::Floor: return "#8c8c8c";
    case CaseKind::Iptables: return "#d62728";
    case CaseKind::IptablesLegacy: return "#ff9896";
    case CaseKind::SluiceTcx: return "#1f77b4";
    case CaseKind::SluiceLegacy: return "#9ecae1";
    case CaseKind::TcMinimal: return "#2ca02c";
    case CaseKind::SluiceSocket: return "#9467bd";
    case CaseKind::FloorXdp:
    case CaseKind::FloorXdpFrags: return "#c7c7c7";
    case CaseKind::SluiceTcxXdp:
    case CaseKind::SluiceTcxXdpFrags: return "#17becf";
    case CaseKind::SluiceSocketXdp:
    case CaseKind::SluiceSocketXdpFrags: return "#c5b0d5";
  }
  return "#000";
}

// What a pod's netns had been through before its enrollment.
std::string podModel() {
  return PodFarm::bare ? "  (--bare-netns: no /proc/sys/net lookup in a pod's netns before its enrollment)\n"
                       : "  (each pod's /proc/sys/net written once just before, untimed, as the bridge CNI plugin does)\n";
}

std::string ratioText(double r) { return std::isnan(r) ? "-" : fmtNum(r) + "x"; }

std::string pad(const std::string& s, size_t w, bool right = true) {
  // Counts UTF-8 code points so "µs" and "≥" line up.
  size_t cps = 0;
  for (unsigned char c : s)
    if ((c & 0xc0) != 0x80) cps++;
  if (cps >= w) return s;
  return right ? std::string(w - cps, ' ') + s : s + std::string(w - cps, ' ');
}

json num(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

std::string kib(uint64_t bytes) { return fmtNum(static_cast<double>(bytes) / 1024.0) + " KiB"; }

uint64_t totalMem(const std::vector<MapMem>& maps) {
  uint64_t t = 0;
  for (const auto& m : maps) t += m.memlock;
  return t;
}

struct Dist {
  double p50 = NAN, p99 = NAN;
};
Dist dist(const std::vector<double>& v) { return {percentile(v, 50), percentile(v, 99)}; }

/// Max ns per run of a program over workloads.
double worstNs(const std::vector<ProgSample>& samples, const std::string& prog) {
  double w = NAN;
  for (const auto& s : samples)
    if (s.program == prog && s.cnt >= 100) w = std::isnan(w) ? s.nsPerRun() : std::max(w, s.nsPerRun());
  return w;
}

double overallNs(const std::vector<ProgSample>& samples, const std::string& prog) {
  uint64_t ns = 0, cnt = 0;
  for (const auto& s : samples)
    if (s.program == prog) {
      ns += s.ns;
      cnt += s.cnt;
    }
  return cnt ? static_cast<double>(ns) / static_cast<double>(cnt) : NAN;
}

std::vector<std::string> programsOf(const std::vector<ProgSample>& samples) {
  std::vector<std::string> out;
  for (const auto& s : samples)
    if (std::find(out.begin(), out.end(), s.program) == out.end()) out.push_back(s.program);
  return out;
}

std::vector<std::string> workloadsOf(const std::vector<ProgSample>& samples) {
  std::vector<std::string> out;
  for (const auto& s : samples)
    if (std::find(out.begin(), out.end(), s.workload) == out.end()) out.push_back(s.workload);
  return out;
}

/// The path of @p k enrolled as a cluster does (node side included), or
/// with @p nodeSide false sluice's in-pod part alone.
const PathTimes* path(const Results& r, CaseKind k, bool nodeSide = true) {
  if (!r.enroll) return nullptr;
  for (const auto& p : r.enroll->paths)
    if (p.kind == k && p.nodeSide == nodeSide) return &p;
  return nullptr;
}

std::string pathLabel(const PathTimes& p) {
  if (!isSluice(p.kind)) return std::string(caseName(p.kind)) + " (whole: in pod + ipset)";
  return std::string(caseName(p.kind)) + (p.nodeSide ? " (whole, node side)" : " (in-pod part)");
}

/// Istio's whole path without its route script, per pod: a lower bound of
/// what its agent pays, which sets the policy route over netlink (tens of µs)
/// where the bench runs `ip` commands.
std::vector<double> istioWithoutRouteScript(const PathTimes& p) {
  std::vector<double> v;
  for (size_t i = 0; i < p.addMs.size() && i < p.routeMs.size(); i++) v.push_back(p.addMs[i] - p.routeMs[i]);
  return v;
}

/// sluice's node part at percentile @p pct: the whole path's percentile less
/// its in-pod part's (separate pods of the same run, interleaved).
double sluiceNodePart(const PathTimes& whole, const PathTimes& inPod, double pct) {
  return percentile(whole.addMs, pct) - percentile(inPod.addMs, pct);
}
/// The same as text: below zero, the node part is within the two paths' noise.
std::string nodePartText(const PathTimes& whole, const PathTimes& inPod, double pct) {
  double v = sluiceNodePart(whole, inPod, pct);
  return v < 0 ? "~0 (" + fmtNum(v) + ", within the noise)" : fmtNum(v);
}

}  // namespace

// ---- Model helpers -----------------------------------------------------------------

bool Config::hasPhase(const std::string& p) const { return std::find(phases.begin(), phases.end(), p) != phases.end(); }
bool Config::hasCase(CaseKind k) const { return std::find(cases.begin(), cases.end(), k) != cases.end(); }

double Metric::median(CaseKind k) const {
  auto it = rounds.find(k);
  if (it == rounds.end()) return NAN;
  // Any failed round voids the figure: a broken redirect posts no number.
  for (double v : it->second)
    if (std::isnan(v)) return NAN;
  return bench::median(it->second);
}

double Metric::ratio(CaseKind a, CaseKind b) const {
  if (std::isnan(median(a)) || std::isnan(median(b))) return NAN;
  const auto& x = rounds.at(a);
  const auto& y = rounds.at(b);
  std::vector<double> r;
  for (size_t i = 0; i < x.size() && i < y.size(); i++)
    if (y[i] > 0) r.push_back(x[i] / y[i]);
  return bench::median(r);
}

Metric* Results::metric(const std::string& key) {
  for (auto& m : metrics)
    if (m.key == key) return &m;
  return nullptr;
}
const Metric* Results::metric(const std::string& key) const {
  for (const auto& m : metrics)
    if (m.key == key) return &m;
  return nullptr;
}

bool Results::verified() const {
  if (!errors.empty()) return false;
  for (const auto& [k, c] : checks)
    if (!c.failures.empty()) return false;
  if (enroll)
    for (const auto& p : enroll->paths)
      if (p.failures || !p.verified) return false;
  if (cli && cli->failures) return false;
  for (const auto& h : handoff)
    if (h.failures || !h.verified) return false;
  for (const auto& s : scales)
    if (s.failures || !s.verified) return false;
  if (kube && kube->skipped.empty() && (kube->failures || !kube->verified)) return false;
  return true;
}

double sliceMedian(const std::vector<double>& v, size_t from, size_t to) {
  if (from >= to || to > v.size()) return NAN;
  return median(std::vector<double>(v.begin() + static_cast<long>(from), v.begin() + static_cast<long>(to)));
}

double slicePercentile(const std::vector<double>& v, size_t from, size_t to, double p) {
  if (from >= to || to > v.size()) return NAN;
  return percentile(std::vector<double>(v.begin() + static_cast<long>(from), v.begin() + static_cast<long>(to)), p);
}

// ---- Targets ------------------------------------------------------------------------

namespace {

using AddTarget = std::function<void(const std::string&, const std::string&, double, const std::string&, bool)>;
using RatioFn = std::function<double(const Metric*, CaseKind, CaseKind)>;
using BothFn = std::function<std::string(double, double)>;

// Issue 16's targets, for every sluice case measured: the socket mode is
// what they were set for, the TC modes stand beside it for comparison.
void issue16Targets(Results& r, const AddTarget& add, const RatioFn& medRatio, const BothFn& both) {
  for (CaseKind s : {CaseKind::SluiceSocket, CaseKind::SluiceTcx, CaseKind::SluiceLegacy}) {
    if (!r.cfg.hasCase(s)) continue;
    const std::string sn = caseName(s);
    auto floorRatio = [&](const char* key, double goal, bool atLeast) {
      const Metric* m = r.metric(key);
      if (!m) return;
      double v = m->ratio(s, CaseKind::Floor), mv = medRatio(m, s, CaseKind::Floor);
      bool met = atLeast ? v >= goal && mv >= goal : v <= goal && mv <= goal;
      add(sn + " " + m->label, std::string(atLeast ? "≥ " : "≤ ") + fmtNum(goal) + " × floor", v, both(v, mv), met);
    };
    for (const char* key : {"conn_out.rate", "conn_out6.rate"}) {
      floorRatio(key, 0.98, true);
      const Metric* m = r.metric(key);
      if (!m) continue;
      double v = m->ratio(s, CaseKind::Iptables), mv = medRatio(m, s, CaseKind::Iptables);
      // No redirect can pass the floor: where the floor itself is under the
      // goal, the line says so.
      std::string shown = both(v, mv);
      if (r.cfg.hasCase(CaseKind::Floor)) {
        double bound = medRatio(m, CaseKind::Floor, CaseKind::Iptables);
        if (!std::isnan(bound)) shown += "; the floor itself " + ratioText(bound) + " (medians)";
      }
      add(sn + " " + m->label, "≥ 1.45 × iptables", v, shown, v >= 1.45 && mv >= 1.45);
    }
    floorRatio("conn_in.rate", 0.98, true);
    floorRatio("conn_in6.rate", 0.98, true);
    floorRatio("dns.qps", 0.95, true);
    floorRatio("rr_out.p99", 1.02, false);
    floorRatio("rr_in.p99", 1.02, false);
  }
}

// Issue 31's targets, with the node side included, for every sluice mode
// measured: where one is missed, the value names the parts' costs.
void issue31Targets(Results& r, const AddTarget& add) {
  const PathTimes* ipt = path(r, CaseKind::Iptables);
  for (CaseKind s : {CaseKind::SluiceSocket, CaseKind::SluiceTcx, CaseKind::SluiceLegacy}) {
    if (!r.cfg.hasCase(s)) continue;
    const std::string sn = caseName(s);
    if (const PathTimes* p = path(r, s); p && !p->addMs.empty()) {
      Dist d = dist(p->addMs), rm = dist(p->removeMs);
      std::string parts;
      if (const PathTimes* part = path(r, s, false); part && !part->addMs.empty())
        parts = "; in-pod part p99 " + fmtNum(percentile(part->addMs, 99)) + " ms, node part p99 " +
                nodePartText(*p, *part, 99) + " ms";
      add(sn + " pod enroll p99 (in process, node side included)", "≤ 1 ms", d.p99,
          fmtNum(d.p99) + " ms (p50 " + fmtNum(d.p50) + ")" + parts, d.p99 <= 1.0);
      if (ipt && !ipt->addMs.empty()) {
        Dist di = dist(ipt->addMs);
        double v50 = di.p50 / d.p50, v99 = di.p99 / d.p99;
        double lb99 = percentile(istioWithoutRouteScript(*ipt), 99) / d.p99;
        add(sn + " pod enroll vs Istio's whole per-pod path (in pod + ipset)", "≥ 10 × faster at p99", v99,
            ratioText(v99) + " faster at p99, " + ratioText(v50) + " at p50 (Istio " + fmtNum(di.p99) +
                " ms p99; without its route script " + ratioText(lb99) + " at p99)",
            v99 >= 10);
      }
      if (!p->removeMs.empty())
        add(sn + " pod removal vs add (in process, node side included)", "≤ add", rm.p50 / d.p50,
            "remove p50 " + fmtNum(rm.p50) + " / p99 " + fmtNum(rm.p99) + " ms vs add " + fmtNum(d.p50) + " / " +
                fmtNum(d.p99) + " ms",
            rm.p50 <= d.p50 && rm.p99 <= d.p99);
    }
    for (const auto& h : r.handoff)
      if (h.mode == (s == CaseKind::SluiceSocket ? "socket" : s == CaseKind::SluiceTcx ? "tcx" : "legacy")) {
        Dist d = dist(h.addMs);
        std::string vs;
        if (ipt && !ipt->addMs.empty()) vs = "; Istio's whole path in process " + fmtNum(dist(ipt->addMs).p99) + " ms p99";
        add(sn + " pod enroll p99 via sluice-cni -> agent -> ZDS ack (process)", "≤ 5 ms", d.p99,
            fmtNum(d.p99) + " ms (p50 " + fmtNum(d.p50) + ")" + vs, d.p99 <= 5.0);
      }
  }
}

}  // namespace

void evaluateTargets(Results& r) {
  r.targets.clear();
  auto add = [&](const std::string& name, const std::string& goal, double value, const std::string& valueText,
                 bool met) {
    Target t;
    t.name = name;
    t.goal = goal;
    t.value = std::isnan(value) ? "not measured" : valueText;
    t.met = std::isnan(value) ? -1 : met ? 1 : 0;
    r.targets.push_back(t);
  };
  // Ratio targets are met only when the paired per-round ratio and the
  // ratio of the medians both meet them: on a noisy machine the two can
  // disagree, and then the figure does not support the claim.
  auto medRatio = [](const Metric* m, CaseKind a, CaseKind b) {
    double x = m->median(a), y = m->median(b);
    return std::isnan(x) || std::isnan(y) || y == 0 ? NAN : x / y;
  };
  auto both = [](double paired, double medians) {
    return ratioText(paired) + " (paired), " + ratioText(medians) + " (medians)";
  };
  // What the TC mechanism alone reaches (tc-minimal), next to each floor
  // target: how much of the distance is the hook's, not sluice's.
  auto mechanism = [&](const Metric* m) -> std::string {
    double v = m->ratio(CaseKind::TcMinimal, CaseKind::Floor);
    return std::isnan(v) ? "" : "; tc-minimal " + ratioText(v);
  };
  // Next to each per-packet target: what tc-minimal's programs and an empty
  // program cost per run in the same traffic.
  std::string floorText;
  if (auto mb = r.bpf.find(CaseKind::TcMinimal); mb != r.bpf.end()) {
    double mw = NAN, ew = NAN;
    for (const auto& mp : programsOf(mb->second)) {
      double x = worstNs(mb->second, mp);
      double& into = mp == kEmptyProgramName ? ew : mw;
      if (!std::isnan(x)) into = std::isnan(into) ? x : std::max(into, x);
    }
    floorText = "; same traffic: tc-minimal's loop up to " + fmtNum(mw) + " ns, an empty program up to " +
                fmtNum(ew) + " ns";
  }
  if (r.cli && !r.cli->addMs.empty()) {
    Dist a = dist(r.cli->addMs);
    std::string vs;
    if (!r.cli->istioAddMs.empty())
      vs = "; Istio's processes " + fmtNum(dist(r.cli->istioAddMs).p50) + " ms p50";
    add("sluicectl pod add --node-netns p50 (process, pinned programs)", "≤ 10 ms", a.p50,
        fmtNum(a.p50) + " ms (p99 " + fmtNum(a.p99) + ", first add " + fmtNum(r.cli->firstAddMs) + ")" + vs,
        a.p50 <= 10.0);
  }
  for (CaseKind s : {CaseKind::SluiceTcx, CaseKind::SluiceLegacy}) {
    if (!r.cfg.hasCase(s)) continue;
    std::string sn = caseName(s);
    for (const char* key : {"conn_out.rate", "conn_in.rate"}) {
      const Metric* m = r.metric(key);
      if (!m) continue;
      double vi = m->ratio(s, CaseKind::Iptables), mi = medRatio(m, s, CaseKind::Iptables);
      double vf = m->ratio(s, CaseKind::Floor), mf = medRatio(m, s, CaseKind::Floor);
      add(sn + " " + m->label, "≥ 1.25 × iptables", vi, both(vi, mi), vi >= 1.25 && mi >= 1.25);
      add(sn + " " + m->label, "≥ 0.95 × floor", vf, both(vf, mf) + mechanism(m), vf >= 0.95 && mf >= 0.95);
    }
    for (const char* key : {"rr_out.p99", "rr_in.p99"}) {
      const Metric* m = r.metric(key);
      if (!m) continue;
      double v = m->ratio(s, CaseKind::Iptables), mv = medRatio(m, s, CaseKind::Iptables);
      add(sn + " " + m->label, "≤ iptables", v,
          fmtNum(m->median(s)) + " vs " + fmtNum(m->median(CaseKind::Iptables)) + " µs: " + both(v, mv),
          v <= 1.0 && mv <= 1.0);
    }
    for (const char* key : {"bulk_out.gbps", "bulk_in.gbps"}) {
      const Metric* m = r.metric(key);
      if (!m) continue;
      double v = m->ratio(s, CaseKind::Floor), mv = medRatio(m, s, CaseKind::Floor);
      add(sn + " " + m->label, "≥ 0.95 × floor", v, both(v, mv) + mechanism(m), v >= 0.95 && mv >= 0.95);
    }
    auto it = r.bpf.find(s);
    if (it != r.bpf.end()) {
      for (const auto& prog : programsOf(it->second)) {
        double w = worstNs(it->second, prog), o = overallNs(it->second, prog);
        add(sn + " " + prog + " per packet (bpf_stats, traffic)", "≤ 100 ns", w,
            fmtNum(w) + " ns worst workload, " + fmtNum(o) + " ns overall" + floorText, w <= 100);
      }
    }
    auto mi = r.micro.find(s);
    if (mi != r.micro.end()) {
      std::vector<std::string> progs;
      for (const auto& m : mi->second)
        if (m.program != "baseline" && std::find(progs.begin(), progs.end(), m.program) == progs.end())
          progs.push_back(m.program);
      for (const auto& prog : progs) {
        double w = NAN;
        std::string which;
        for (const auto& m : mi->second)
          if (m.program == prog && m.error.empty() && (std::isnan(w) || m.nsMedian > w)) {
            w = m.nsMedian;
            which = m.packet;
          }
        add(sn + " " + prog + " per packet (test_run, median)", "≤ 100 ns", w,
            fmtNum(w) + " ns worst packet kind (" + which + ")", w <= 100);
      }
    }
  }
  for (const auto& sc : r.scales) {
    const auto& a = sc.addMs;
    if (a.empty()) continue;
    size_t g = std::min<size_t>(100, std::max<size_t>(1, a.size() / 5));
    double first = sliceMedian(a, 0, g), last = sliceMedian(a, a.size() - g, a.size());
    double v = last / first;
    add("sluice-" + sc.mode + " enroll p50 of pods " + std::to_string(a.size() - g + 1) + "-" +
            std::to_string(a.size()) + " vs pods 1-" + std::to_string(g) + " (node side included)",
        "≤ 1.5 ×", v, fmtNum(last) + " vs " + fmtNum(first) + " ms (" + ratioText(v) + ")", v <= 1.5);
  }
  if (r.kube) {
    const auto& k = *r.kube;
    add("namespace labelled: " + std::to_string(k.pods) + " running pods enrolled and acked", "≤ 2 s",
        k.enrolledMs / 1000, fmtNum(k.enrolledMs / 1000) + " s; agent RSS " + std::to_string(k.agentRssKb / 1024) + " MiB",
        k.enrolledMs <= 2000);
  }
  issue16Targets(r, add, medRatio, both);
  issue31Targets(r, add);
}

// ---- Table ----------------------------------------------------------------------------

void printReport(const Results& r, std::ostream& out) {
  const auto& c = r.cfg;
  out << "sluice-bench " << (c.quick ? "(quick mode: a smoke test, small counts; figures are not meaningful)" : "")
      << "\n";
  out << "  " << r.machine.date << "; " << r.machine.nproc << " CPUs (" << r.machine.cpu << "), Linux "
      << r.machine.kernel << ", load average at start " << r.machine.loadavg << "\n";
  out << "  command: " << c.command << "\n\n";

  out << "Verification (every case really redirected; a failed check voids the figure)\n";
  for (CaseKind k : c.cases) {
    auto it = r.checks.find(k);
    if (it == r.checks.end()) continue;
    const auto& ck = it->second;
    out << "  " << pad(caseName(k), 24, false) << (ck.failures.empty() ? "ok" : "FAILED") << " ("
        << ck.measurements << " measurements passed)\n";
    for (const auto& n : ck.notes) out << "      " << n << "\n";
    for (const auto& f : ck.failures) out << "    ! " << f << "\n";
  }
  for (const auto& e : r.errors) out << "  ! " << e << "\n";
  out << "\n";

  if (!r.metrics.empty()) {
    out << "Traffic: IPv4 (IPv6 where marked v6), median of " << c.rounds << " interleaved round(s) of " << fmtNum(c.duration)
        << " s (after " << fmtNum(c.warmup) << " s warm-up); ratios: median of the per-round ratios\n"
        << "  client on CPU " << c.clientCpu << ", sink on CPU " << c.sinkCpu
        << (c.rrSameCpu ? " (request/response: client on the sink's CPU)" : "") << ", nice " << c.nice
        << ", slice " << c.sliceUs << " µs" << (c.mss ? ", MSS " + std::to_string(c.mss) : std::string()) << "\n";
    std::vector<CaseKind> cols;
    for (CaseKind k : kAllCases)
      if (c.hasCase(k)) cols.push_back(k);
    for (CaseKind k : kXdpCases)
      if (c.hasCase(k)) cols.push_back(k);
    out << pad("metric", 32, false) << pad("unit", 8, false);
    // Wide enough for "sluice-socket+xdp-frags" and a space.
    auto colWidth = [](CaseKind k) { return std::max<size_t>(16, std::strlen(caseName(k)) + 2); };
    for (CaseKind k : cols) out << pad(caseName(k), colWidth(k));
    std::vector<std::pair<CaseKind, CaseKind>> ratios;
    for (CaseKind s : {CaseKind::SluiceSocket, CaseKind::SluiceTcx, CaseKind::SluiceLegacy})
      for (CaseKind b : {CaseKind::Iptables, CaseKind::Floor})
        if (c.hasCase(s) && c.hasCase(b)) ratios.push_back({s, b});
    for (auto [s, b] : ratios) out << pad(std::string(shortName(s)) + "/" + shortName(b), 14);
    out << "\n";
    for (const auto& m : r.metrics) {
      out << pad(m.label, 32, false) << pad(m.unit, 8, false);
      for (CaseKind k : cols) {
        auto it = m.rounds.find(k);
        bool failed = it != m.rounds.end() && std::any_of(it->second.begin(), it->second.end(), [](double v) { return std::isnan(v); });
        out << pad(failed ? "FAIL" : fmtNum(m.median(k)), colWidth(k));
      }
      for (auto [s, b] : ratios) out << pad(ratioText(m.ratio(s, b)), 14);
      out << "\n";
    }
    out << "\n";
    std::vector<CaseKind> xdp;
    for (CaseKind k : kXdpCases)
      if (c.hasCase(k) && c.hasCase(baseCase(k))) xdp.push_back(k);
    if (!xdp.empty()) {
      out << "XDP on the pod's veth: each case with an XDP_PASS program in native mode on eth0 and vethpod\n"
          << "over the same case without (xdpf: the frags-aware program), paired by round\n";
      out << pad("metric", 32, false);
      for (CaseKind k : xdp) out << pad(std::string(shortName(k)) + "/" + shortName(baseCase(k)), 20);
      out << "\n";
      for (const auto& m : r.metrics) {
        out << pad(m.label, 32, false);
        for (CaseKind k : xdp) out << pad(ratioText(m.ratio(k, baseCase(k))), 20);
        out << "\n";
      }
      out << "\n";
    }
    if (c.hasCase(CaseKind::TcMinimal) && c.hasCase(CaseKind::Floor)) {
      out << "The TC mechanism alone: tc-minimal runs in sluice-tcx's links (same tcx attachments, return-mark\n"
          << "route, sysctls) only the egress -> ingress loop and bpf_sk_assign of a listener held in a SOCKMAP\n";
      out << pad("metric", 32, false) << pad("minimal/floor", 16);
      for (CaseKind s : {CaseKind::SluiceTcx, CaseKind::SluiceLegacy})
        if (c.hasCase(s)) out << pad(std::string(shortName(s)) + "/minimal", 16);
      out << "\n";
      for (const auto& m : r.metrics) {
        if (!m.rounds.count(CaseKind::TcMinimal)) continue;
        out << pad(m.label, 32, false) << pad(ratioText(m.ratio(CaseKind::TcMinimal, CaseKind::Floor)), 16);
        for (CaseKind s : {CaseKind::SluiceTcx, CaseKind::SluiceLegacy})
          if (c.hasCase(s)) out << pad(ratioText(m.ratio(s, CaseKind::TcMinimal)), 16);
        out << "\n";
      }
      out << "\n";
    }
  }

  if (!r.bpf.empty()) {
    out << "BPF programs: ns per run (run_time_ns / run_cnt, " << r.bpfStatsHow << "), "
        << fmtNum(c.bpfDuration) << " s per workload; kernel.bpf_stats_enabled " << r.bpfStatsBefore << " before, "
        << r.bpfStatsAfter << " after\n";
    for (const auto& [k, samples] : r.bpf) {
      auto wls = workloadsOf(samples);
      out << pad(caseName(k), 32, false);
      for (const auto& w : wls) out << pad(w, 10);
      out << pad("overall", 10) << "\n";
      for (const auto& prog : programsOf(samples)) {
        out << pad("  " + prog, 32, false);
        for (const auto& w : wls) {
          double v = NAN;
          for (const auto& s : samples)
            if (s.program == prog && s.workload == w && s.cnt) v = s.nsPerRun();
          out << pad(fmtNum(v), 10);
        }
        out << pad(fmtNum(overallNs(samples, prog)), 10) << "\n";
      }
      out << pad("  (runs per workload, in that order)", 32, false);
      for (const auto& w : wls) {
        std::string cnts;
        for (const auto& prog : programsOf(samples))
          for (const auto& s : samples)
            if (s.program == prog && s.workload == w) cnts += (cnts.empty() ? "" : "/") + fmtNum(static_cast<double>(s.cnt) / 1000.0) + "k";
        out << " " << cnts;
      }
      out << "\n";
    }
    out << "\n";
  }

  if (!r.micro.empty()) {
    out << "BPF programs: ns per packet with BPF_PROG_TEST_RUN in an enrolled pod (median and mean of "
        << c.microRuns << " single runs)\n";
    std::vector<CaseKind> ks;
    for (const auto& [k, v] : r.micro) ks.push_back(k);
    out << pad("program / packet", 50, false);
    for (CaseKind k : ks) out << pad(std::string(caseName(k)) + " p50", 18) << pad("mean", 8);
    out << "   verdict\n";
    const auto& first = r.micro.begin()->second;
    for (size_t i = 0; i < first.size(); i++) {
      out << pad("  " + first[i].program + ": " + first[i].packet, 50, false);
      for (CaseKind k : ks) {
        const auto& v = r.micro.at(k);
        if (i < v.size() && v[i].error.empty()) out << pad(fmtNum(v[i].nsMedian), 18) << pad(fmtNum(v[i].nsMean), 8);
        else out << pad("-", 18) << pad("-", 8);
      }
      out << "   " << first[i].verdict << (first[i].error.empty() ? "" : " (" + first[i].error + ")") << "\n";
    }
    out << "\n";
  }

  if (r.enroll) {
    out << "Pod enrollment as a cluster pays for it: " << r.enroll->pods
        << " pods per path, fresh netns each, paths interleaved; ms\n"
        << podModel()
        << "  whole = node side included: sluice's host-side veth in a node netns (probe SNAT, as pod add\n"
        << "  --node-netns), Istio's pod address in its node probe ipset (netlink, as its agent) beside its\n"
        << "  in-pod iptables-restore + route script (processes); in-pod part = sluice without the node side\n";
    out << pad("path", 40, false) << pad("add p50", 10) << pad("add p99", 10) << pad("remove p50", 12)
        << pad("remove p99", 12) << "   checks\n";
    for (const auto& p : r.enroll->paths) {
      Dist a = dist(p.addMs), d = dist(p.removeMs);
      out << pad(pathLabel(p), 40, false) << pad(fmtNum(a.p50), 10) << pad(fmtNum(a.p99), 10) << pad(fmtNum(d.p50), 12)
          << pad(fmtNum(d.p99), 12) << "   " << (p.verified && !p.failures ? "ok" : "FAILED");
      for (const auto& ck : p.checks) out << "; " << ck;
      out << "\n";
      if (!p.inPodMs.empty()) {
        Dist ip = dist(p.inPodMs), nd = dist(p.nodeMs);
        out << "      in-pod part p50 " << fmtNum(ip.p50) << " p99 " << fmtNum(ip.p99) << " (p50 of the steps: iptables-restore "
            << fmtNum(median(p.v4Ms)) << ", ip6tables-restore " << fmtNum(median(p.v6Ms)) << ", route script "
            << fmtNum(median(p.routeMs)) << "); node part (ipset add, netlink) p50 " << fmtNum(nd.p50) << " p99 "
            << fmtNum(nd.p99) << "\n";
        Dist lb = dist(istioWithoutRouteScript(p));
        out << "      without the route script (its agent sets the route over netlink): p50 " << fmtNum(lb.p50)
            << " p99 " << fmtNum(lb.p99) << "\n";
      }
      if (isSluice(p.kind) && p.nodeSide)
        if (const PathTimes* part = path(r, p.kind, false); part && !part->addMs.empty() && !p.addMs.empty())
          out << "      node part (whole less in-pod part): p50 " << nodePartText(p, *part, 50) << " p99 "
              << nodePartText(p, *part, 99) << "\n";
      if (p.failures) out << "    ! " << p.failures << " failure(s), first: " << p.firstError << "\n";
    }
    if (r.cli) {
      Dist a = dist(r.cli->addMs), d = dist(r.cli->removeMs);
      out << pad("sluicectl --node-netns (process)", 40, false) << pad(fmtNum(a.p50), 10) << pad(fmtNum(a.p99), 10)
          << pad(fmtNum(d.p50), 12) << pad(fmtNum(d.p99), 12) << "   " << r.cli->addMs.size()
          << " pods reusing the pinned programs; peak RSS add " << r.cli->addMaxRssKb << " KiB, remove "
          << r.cli->removeMaxRssKb << " KiB";
      for (const auto& ck : r.cli->checks) out << "; " << ck;
      out << "\n      first add on the fresh root (loads, verifies, pins the programs): " << fmtNum(r.cli->firstAddMs)
          << " ms\n";
      if (!r.cli->istioAddMs.empty()) {
        Dist i = dist(r.cli->istioAddMs), ir = dist(r.cli->istioRemoveMs);
        out << pad("Istio's processes (restore+ip+ipset)", 40, false) << pad(fmtNum(i.p50), 10) << pad(fmtNum(i.p99), 10)
            << pad(fmtNum(ir.p50), 12) << pad(fmtNum(ir.p99), 12) << "   in pod p50 " << fmtNum(median(r.cli->istioInPodMs))
            << ", `ipset add` p50 " << fmtNum(median(r.cli->istioNodeMs)) << "\n";
        if (!r.cli->addMs.empty())
          out << "  Istio's processes / sluicectl process: add " << ratioText(i.p50 / a.p50) << " (p50) "
              << ratioText(i.p99 / a.p99) << " (p99)\n";
      }
      if (r.cli->failures) out << "    ! " << r.cli->failures << " failure(s), first: " << r.cli->firstError << "\n";
    }
    for (const auto& h : r.handoff) {
      Dist a = dist(h.addMs), d = dist(h.removeMs);
      out << pad("sluice-cni+ZDS ack (" + h.mode + ", process)", 40, false) << pad(fmtNum(a.p50), 10)
          << pad(fmtNum(a.p99), 10) << pad(fmtNum(d.p50), 12) << pad(fmtNum(d.p99), 12) << "   "
          << (h.verified ? "ok; " : "NOT VERIFIED; ") << h.addMs.size() << " pods, peak RSS add " << h.addMaxRssKb
          << " KiB";
      for (const auto& c : h.checks) out << "; " << c;
      out << "\n";
      if (h.failures) out << "    ! " << h.failures << " failure(s), first: " << h.firstError << "\n";
    }
    const PathTimes* ipt = path(r, CaseKind::Iptables);
    for (CaseKind s : {CaseKind::SluiceSocket, CaseKind::SluiceTcx, CaseKind::SluiceLegacy}) {
      const PathTimes* p = path(r, s);
      if (!p || !ipt || p->addMs.empty() || ipt->addMs.empty()) continue;
      Dist a = dist(p->addMs), ai = dist(ipt->addMs), d = dist(p->removeMs), di = dist(ipt->removeMs);
      Dist lb = dist(istioWithoutRouteScript(*ipt));
      out << "  Istio's whole path / " << caseName(s) << " whole: add " << ratioText(ai.p50 / a.p50) << " (p50) "
          << ratioText(ai.p99 / a.p99) << " (p99), remove " << ratioText(di.p50 / d.p50) << " (p50) "
          << ratioText(di.p99 / d.p99) << " (p99); without the route script " << ratioText(lb.p50 / a.p50)
          << " (p50) " << ratioText(lb.p99 / a.p99) << " (p99)\n";
      const PathTimes* part = path(r, s, false);
      if (!part || part->addMs.empty() || ipt->inPodMs.empty()) continue;
      Dist pi = dist(ipt->inPodMs), ps = dist(part->addMs), ni = dist(ipt->nodeMs);
      out << "    in-pod parts: " << ratioText(pi.p50 / ps.p50) << " (p50) " << ratioText(pi.p99 / ps.p99)
          << " (p99); node parts: Istio " << fmtNum(ni.p50) << " / " << fmtNum(ni.p99) << " ms, sluice "
          << nodePartText(*p, *part, 50) << " / " << nodePartText(*p, *part, 99) << " ms (p50 / p99)\n";
    }
    out << "\n";
  }

  for (const auto& s : r.scales) {
    size_t n = s.addMs.size();
    size_t g = std::min<size_t>(100, std::max<size_t>(1, n / 5));
    out << "Scale: " << s.pods << " pods enrolled in one Datapath (" << s.mode << "), node side included, ms\n"
        << podModel();
    if (n >= g) {
      out << "  enroll  first " << g << ": p50 " << fmtNum(sliceMedian(s.addMs, 0, g)) << " p99 "
          << fmtNum(slicePercentile(s.addMs, 0, g, 99)) << "; last " << g << ": p50 "
          << fmtNum(sliceMedian(s.addMs, n - g, n)) << " p99 " << fmtNum(slicePercentile(s.addMs, n - g, n, 99))
          << "; ratio of p50 " << ratioText(sliceMedian(s.addMs, n - g, n) / sliceMedian(s.addMs, 0, g)) << "\n";
    }
    size_t m = s.removeMs.size();
    if (m >= g) {
      out << "  remove  first " << g << ": p50 " << fmtNum(sliceMedian(s.removeMs, 0, g)) << " p99 "
          << fmtNum(slicePercentile(s.removeMs, 0, g, 99)) << "; last " << g << ": p50 "
          << fmtNum(sliceMedian(s.removeMs, m - g, m)) << " p99 " << fmtNum(slicePercentile(s.removeMs, m - g, m, 99))
          << " (removal order = enroll order)\n";
    }
    if (!s.stubs.empty()) out << "  " << s.stubs << "\n";
    if (!s.nodeSide.empty()) out << "  node side: " << s.nodeSide << "\n";
    out << "  map memory (memlock, as bpftool map show): " << kib(totalMem(s.mapsBefore)) << " with 0 pods, "
        << kib(totalMem(s.mapsAfter)) << " with " << n << " pods; programs " << kib(s.progMemlock) << "\n";
    for (const auto& a : s.mapsAfter) {
      uint64_t before = 0;
      for (const auto& b : s.mapsBefore)
        if (b.name == a.name) before = b.memlock;
      out << "      " << pad(a.name, 15, false) << pad(a.type, 16, false) << pad(std::to_string(a.maxEntries), 8)
          << " entries max  " << pad(kib(before), 14) << " -> " << pad(kib(a.memlock), 14) << "\n";
    }
    out << "  RSS of this process: " << s.rssBeforeKb << " KiB before Datapath::open, " << s.rssAfterOpenKb
        << " after, " << s.rssAfterPodsKb << " with " << n << " pods\n";
    out << "  sluicectl with " << n << " pods enrolled: pod add " << fmtNum(s.cliAddMs) << " ms / peak RSS "
        << s.cliAddRssKb << " KiB, pod list " << fmtNum(s.cliListMs) << " ms / " << s.cliListRssKb
        << " KiB, pod remove " << fmtNum(s.cliRemoveMs) << " ms / " << s.cliRemoveRssKb << " KiB\n";
    out << "  checks: " << (s.verified && !s.failures ? "ok" : "FAILED");
    if (s.failures) out << " (" << s.failures << " failure(s), first: " << s.firstError << ")";
    out << "\n\n";
  }

  if (r.kube && !r.kube->skipped.empty()) out << "Kubernetes: skipped (" << r.kube->skipped << ")\n\n";
  if (r.kube && r.kube->skipped.empty()) {
    const auto& k = *r.kube;
    out << "Kubernetes: " << k.pods << " running pods, their namespace labelled ambient in one write (sluiced "
        << "--kube-api, the test API server, the node proxy stand-in)\n";
    out << "  all enrolled and handed off " << fmtNum(k.enrolledMs) << " ms, all annotated " << fmtNum(k.annotatedMs)
        << " ms; label removed -> all out " << fmtNum(k.removedMs) << " ms\n";
    out << "  agent RSS " << k.agentRssIdleKb << " KiB synced and idle, " << k.agentRssKb << " KiB with " << k.pods
        << " pods, peak " << k.agentHwmKb << " KiB\n";
    out << "  checks: " << (k.verified && !k.failures ? "ok" : "FAILED");
    for (const auto& c : k.checks) out << "; " << c;
    if (k.failures) out << " (" << k.failures << " failure(s), first: " << k.firstError << ")";
    out << "\n\n";
  }

  if (!r.targets.empty()) {
    out << "Targets (issues 5, 16 and 31; reported, not asserted)\n";
    for (const auto& t : r.targets)
      out << "  [" << (t.met == 1 ? " met " : t.met == 0 ? "MISSED" : " n/a ") << "] " << pad(t.name, 58, false)
          << pad(t.goal, 20, false) << t.value << "\n";
    out << "\n";
  }
  if (!r.roundLoad.empty()) {
    out << "Load average at the start of each round:";
    for (const auto& l : r.roundLoad) out << " [" << l << "]";
    out << "\n";
  }
  for (const auto& n : r.phaseNotes) out << n << "\n";
  out << "Result: " << (r.verified() ? "every check passed" : "CHECKS FAILED") << " (" << fmtNum(r.seconds)
      << " s)\n";
}

// ---- JSON -----------------------------------------------------------------------------

std::string toJson(const Results& r) {
  const auto& c = r.cfg;
  json j;
  j["tool"] = "sluice-bench";
  j["command"] = c.command;
  j["seconds"] = r.seconds;
  j["verified"] = r.verified();
  j["machine"] = {{"nproc", r.machine.nproc}, {"kernel", r.machine.kernel}, {"cpu", r.machine.cpu},
                  {"date", r.machine.date},   {"mem_total", r.machine.memTotal}, {"loadavg", r.machine.loadavg}};
  json cases = json::array();
  for (CaseKind k : c.cases) cases.push_back(caseName(k));
  j["config"] = {{"quick", c.quick},
                 {"rounds", c.rounds},
                 {"duration_s", c.duration},
                 {"warmup_s", c.warmup},
                 {"conn_concurrency", c.connConcurrency},
                 {"rr_connections", c.rrConnections},
                 {"dns_concurrency", c.dnsConcurrency},
                 {"enroll_pods", c.enrollPods},
                 {"scale_pods", c.scalePods},
                 {"cli_pods", c.cliPods},
                 {"bpf_duration_s", c.bpfDuration},
                 {"micro_runs", c.microRuns},
                 {"client_cpu", c.clientCpu},
                 {"sink_cpu", c.sinkCpu},
                 {"nice", c.nice},
                 {"slice_us", c.sliceUs},
                 {"rr_same_cpu", c.rrSameCpu},
                 {"mss", c.mss},
                 {"cases", cases},
                 {"workloads", c.workloads},
                 {"phases", c.phases},
                 {"rules_dir", c.rulesDir}};
  json checks = json::object();
  for (const auto& [k, ck] : r.checks)
    checks[caseName(k)] = {{"ok", ck.failures.empty()},
                           {"measurements_passed", ck.measurements},
                           {"failures", ck.failures},
                           {"notes", ck.notes}};
  j["checks"] = checks;
  j["errors"] = r.errors;
  j["round_loadavg"] = r.roundLoad;
  j["phase_notes"] = r.phaseNotes;

  json traffic = json::object();
  for (const auto& m : r.metrics) {
    json per = json::object();
    for (const auto& [k, v] : m.rounds) {
      json rounds = json::array();
      for (double x : v) rounds.push_back(num(x));
      per[caseName(k)] = {{"median", num(m.median(k))}, {"rounds", rounds}};
    }
    json ratios = json::object(), medRatios = json::object();
    auto addRatio = [&](CaseKind s, CaseKind b) {
      if (!c.hasCase(s) || !c.hasCase(b)) return;
      std::string name = std::string(caseName(s)) + "/" + caseName(b);
      ratios[name] = num(m.ratio(s, b));
      double x = m.median(s), y = m.median(b);
      medRatios[name] = num(std::isnan(x) || std::isnan(y) || y == 0 ? NAN : x / y);
    };
    for (CaseKind s : {CaseKind::SluiceSocket, CaseKind::SluiceTcx, CaseKind::SluiceLegacy})
      for (CaseKind b : {CaseKind::Iptables, CaseKind::IptablesLegacy, CaseKind::Floor}) addRatio(s, b);
    // Each XDP variant over its case without XDP.
    for (CaseKind k : kXdpCases) addRatio(k, baseCase(k));
    traffic[m.key] = {{"label", m.label},        {"unit", m.unit},
                      {"higher_is_better", m.higherIsBetter}, {"cases", per},
                      {"ratios_paired", ratios}, {"ratios_of_medians", medRatios}};
  }
  j["traffic"] = traffic;

  json bpf = json::object();
  for (const auto& [k, samples] : r.bpf) {
    json arr = json::array();
    for (const auto& s : samples)
      arr.push_back({{"program", s.program}, {"workload", s.workload}, {"run_time_ns", s.ns}, {"run_cnt", s.cnt},
                     {"ns_per_run", num(s.nsPerRun())}});
    json summary = json::object();
    for (const auto& prog : programsOf(samples))
      summary[prog] = {{"overall_ns", num(overallNs(samples, prog))}, {"worst_workload_ns", num(worstNs(samples, prog))}};
    bpf[caseName(k)] = {{"samples", arr}, {"summary", summary}};
  }
  json micro = json::object();
  for (const auto& [k, v] : r.micro) {
    json arr = json::array();
    for (const auto& m : v)
      arr.push_back({{"program", m.program}, {"packet", m.packet}, {"verdict", m.verdict}, {"ns_median", num(m.nsMedian)},
                     {"ns_mean", num(m.nsMean)}, {"runs", m.runs}, {"error", m.error}});
    micro[caseName(k)] = arr;
  }
  j["bpf_test_run"] = {{"runs", c.microRuns}, {"cases", micro}};
  j["bpf_programs"] = {{"stats", r.bpfStatsHow},
                       {"bpf_stats_enabled_before", r.bpfStatsBefore},
                       {"bpf_stats_enabled_after", r.bpfStatsAfter},
                       {"cases", bpf}};

  if (r.enroll) {
    json paths = json::array();
    for (const auto& p : r.enroll->paths) {
      Dist a = dist(p.addMs), d = dist(p.removeMs);
      json pj = {{"path", caseName(p.kind)},   {"add_ms_p50", num(a.p50)},    {"add_ms_p99", num(a.p99)},
                 {"remove_ms_p50", num(d.p50)}, {"remove_ms_p99", num(d.p99)}, {"add_ms", p.addMs},
                 {"remove_ms", p.removeMs},     {"failures", p.failures},      {"first_error", p.firstError},
                 {"checks", p.checks},          {"verified", p.verified}};
      pj["node_side"] = p.nodeSide;
      if (!p.v4Ms.empty()) pj["steps_ms"] = {{"iptables_restore", p.v4Ms}, {"ip6tables_restore", p.v6Ms}, {"route_script", p.routeMs}};
      if (!p.inPodMs.empty()) {
        Dist ip = dist(p.inPodMs), nd = dist(p.nodeMs);
        pj["in_pod_part"] = {{"add_ms_p50", num(ip.p50)}, {"add_ms_p99", num(ip.p99)}, {"add_ms", p.inPodMs}};
        pj["node_part"] = {{"how", "ipset add over netlink"}, {"add_ms_p50", num(nd.p50)}, {"add_ms_p99", num(nd.p99)}, {"add_ms", p.nodeMs}};
        Dist lb = dist(istioWithoutRouteScript(p));
        pj["without_route_script"] = {{"add_ms_p50", num(lb.p50)}, {"add_ms_p99", num(lb.p99)}};
      }
      if (isSluice(p.kind) && p.nodeSide)
        if (const PathTimes* part = path(r, p.kind, false); part && !part->addMs.empty() && !p.addMs.empty())
          pj["node_part"] = {{"how", "whole less the in-pod part's path"},
                             {"add_ms_p50", num(sluiceNodePart(p, *part, 50))},
                             {"add_ms_p99", num(sluiceNodePart(p, *part, 99))}};
      paths.push_back(pj);
    }
    j["enroll"] = {{"pods", r.enroll->pods}, {"paths", paths}};
  }
  if (!r.handoff.empty()) {
    json h = json::array();
    for (const auto& x : r.handoff) {
      Dist a = dist(x.addMs), d = dist(x.removeMs);
      h.push_back({{"mode", x.mode},         {"add_ms_p50", num(a.p50)}, {"add_ms_p99", num(a.p99)},
                   {"remove_ms_p50", num(d.p50)}, {"remove_ms_p99", num(d.p99)}, {"add_ms", x.addMs},
                   {"remove_ms", x.removeMs},   {"failures", x.failures},    {"first_error", x.firstError},
                   {"checks", x.checks},        {"verified", x.verified}});
    }
    j["handoff_enroll"] = h;
  }
  if (r.cli) {
    Dist a = dist(r.cli->addMs), d = dist(r.cli->removeMs);
    j["sluicectl"] = {{"add_ms_p50", num(a.p50)},        {"add_ms_p99", num(a.p99)},       {"remove_ms_p50", num(d.p50)},
                      {"remove_ms_p99", num(d.p99)},     {"add_ms", r.cli->addMs},         {"remove_ms", r.cli->removeMs},
                      {"add_max_rss_kb", r.cli->addMaxRssKb}, {"remove_max_rss_kb", r.cli->removeMaxRssKb},
                      {"failures", r.cli->failures},     {"first_error", r.cli->firstError},
                      {"node_netns", true},              {"checks", r.cli->checks}};
    if (!r.cli->istioAddMs.empty()) {
      Dist i = dist(r.cli->istioAddMs), ir = dist(r.cli->istioRemoveMs);
      j["sluicectl"]["istio_processes"] = {
          {"add_ms_p50", num(i.p50)},        {"add_ms_p99", num(i.p99)},          {"remove_ms_p50", num(ir.p50)},
          {"remove_ms_p99", num(ir.p99)},    {"add_ms", r.cli->istioAddMs},       {"remove_ms", r.cli->istioRemoveMs},
          {"in_pod_ms", r.cli->istioInPodMs}, {"ipset_add_ms", r.cli->istioNodeMs}};
    }
  }
  json scales = json::array();
  for (const auto& s : r.scales) {
    auto maps = [](const std::vector<MapMem>& v) {
      json a = json::array();
      for (const auto& m : v)
        a.push_back({{"name", m.name}, {"type", m.type}, {"max_entries", m.maxEntries}, {"memlock", m.memlock}});
      return a;
    };
    size_t n = s.addMs.size(), g = std::min<size_t>(100, std::max<size_t>(1, n / 5));
    scales.push_back({{"mode", s.mode},
                  {"pods", s.pods},
                  {"group", g},
                  {"add_first_p50_ms", num(sliceMedian(s.addMs, 0, g))},
                  {"add_first_p99_ms", num(slicePercentile(s.addMs, 0, g, 99))},
                  {"add_last_p50_ms", num(n >= g ? sliceMedian(s.addMs, n - g, n) : NAN)},
                  {"add_last_p99_ms", num(n >= g ? slicePercentile(s.addMs, n - g, n, 99) : NAN)},
                  {"add_ms", s.addMs},
                  {"node_side", s.nodeSide},
                  {"remove_ms", s.removeMs},
                  {"map_memlock_before", totalMem(s.mapsBefore)},
                  {"map_memlock_after", totalMem(s.mapsAfter)},
                  {"maps_before", maps(s.mapsBefore)},
                  {"maps_after", maps(s.mapsAfter)},
                  {"prog_memlock", s.progMemlock},
                  {"sk_lookup_stubs", s.stubs},
                  {"rss_kb", {{"before_open", s.rssBeforeKb}, {"after_open", s.rssAfterOpenKb}, {"after_pods", s.rssAfterPodsKb}}},
                  {"sluicectl",
                   {{"add_ms", s.cliAddMs},
                    {"add_max_rss_kb", s.cliAddRssKb},
                    {"list_ms", s.cliListMs},
                    {"list_max_rss_kb", s.cliListRssKb},
                    {"remove_ms", s.cliRemoveMs},
                    {"remove_max_rss_kb", s.cliRemoveRssKb}}},
                  {"failures", s.failures},
                  {"first_error", s.firstError},
                  {"verified", s.verified}});
  }
  if (r.kube) {
    const auto& k = *r.kube;
    j["kube"] = {{"pods", k.pods},
                 {"enrolled_ms", num(k.enrolledMs)},
                 {"annotated_ms", num(k.annotatedMs)},
                 {"removed_ms", num(k.removedMs)},
                 {"agent_rss_kb", {{"idle", k.agentRssIdleKb}, {"enrolled", k.agentRssKb}, {"peak", k.agentHwmKb}}},
                 {"checks", k.checks},
                 {"failures", k.failures},
                 {"first_error", k.firstError},
                 {"skipped", k.skipped},
                 {"verified", k.verified}};
  }
  if (!scales.empty()) j["scale"] = scales;
  json targets = json::array();
  for (const auto& t : r.targets)
    targets.push_back({{"name", t.name}, {"goal", t.goal}, {"value", t.value},
                       {"met", t.met == -1 ? json(nullptr) : json(t.met == 1)}});
  j["targets"] = targets;
  return j.dump(2) + "\n";
}

// ---- SVG ------------------------------------------------------------------------------

std::string toSvg(const Results& r) {
  struct Panel {
    std::string title, unit;
    std::vector<std::pair<CaseKind, double>> bars;
    bool failedAny = false;
  };
  std::vector<Panel> panels;
  for (const char* key : {"conn_out.rate", "conn_in.rate", "conn_out6.rate", "conn_in6.rate", "dns.qps", "rr_out.tps", "rr_in.tps", "rr_out.p50",
                          "rr_out.p99", "rr_in.p50", "rr_in.p99", "bulk_out.gbps", "bulk_in.gbps"}) {
    const Metric* m = r.metric(key);
    if (!m) continue;
    Panel p{m->label, m->unit, {}};
    for (CaseKind k : kAllCases)
      if (m->rounds.count(k)) p.bars.push_back({k, m->median(k)});
    panels.push_back(p);
  }
  if (r.enroll) {
    Panel p{"pod enroll p99", "ms", {}};
    for (const auto& pt : r.enroll->paths)
      if (pt.nodeSide) p.bars.push_back({pt.kind, percentile(pt.addMs, 99)});
    panels.push_back(p);
  }
  const int cols = 4, pw = 300, ph = 230, top = 70;
  int rows = static_cast<int>((panels.size() + cols - 1) / cols);
  int width = cols * pw + 20, height = top + rows * ph + 30;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">sluice-bench: connection rates, latency, "
       "throughput (median of "
    << r.cfg.rounds << " round(s))" << (r.cfg.quick ? " — quick mode" : "") << "</text>\n";
  s << "<text x=\"10\" y=\"38\" fill=\"#444\">" << r.machine.date << ", " << r.machine.nproc << " CPUs ("
    << r.machine.cpu << "), Linux " << r.machine.kernel << "</text>\n";
  int lx = 10;
  for (CaseKind k : kAllCases) {
    if (!r.cfg.hasCase(k)) continue;
    s << "<rect x=\"" << lx << "\" y=\"48\" width=\"12\" height=\"12\" fill=\"" << color(k) << "\"/>";
    s << "<text x=\"" << lx + 16 << "\" y=\"58\">" << caseName(k) << "</text>\n";
    lx += 130;
  }
  for (size_t i = 0; i < panels.size(); i++) {
    const auto& p = panels[i];
    int x0 = 10 + static_cast<int>(i % cols) * pw, y0 = top + static_cast<int>(i / cols) * ph;
    int plotTop = y0 + 34, plotBottom = y0 + ph - 36, plotLeft = x0 + 10, plotRight = x0 + pw - 20;
    s << "<rect x=\"" << x0 << "\" y=\"" << y0 << "\" width=\"" << pw - 10 << "\" height=\"" << ph - 10
      << "\" fill=\"none\" stroke=\"#ddd\"/>\n";
    s << "<text x=\"" << x0 + 8 << "\" y=\"" << y0 + 18 << "\" font-weight=\"bold\">" << p.title << " (" << p.unit
      << ")</text>\n";
    double mx = 0;
    for (const auto& [k, v] : p.bars)
      if (!std::isnan(v)) mx = std::max(mx, v);
    if (mx <= 0) mx = 1;
    int n = static_cast<int>(p.bars.size());
    if (n == 0) continue;
    double slot = static_cast<double>(plotRight - plotLeft) / n;
    s << "<line x1=\"" << plotLeft << "\" y1=\"" << plotBottom << "\" x2=\"" << plotRight << "\" y2=\"" << plotBottom
      << "\" stroke=\"#999\"/>\n";
    for (int b = 0; b < n; b++) {
      auto [k, v] = p.bars[static_cast<size_t>(b)];
      double bx = plotLeft + slot * b + slot * 0.15, bw = slot * 0.7;
      double h = std::isnan(v) ? 0 : (v / (mx * 1.15)) * (plotBottom - plotTop);
      s << "<rect x=\"" << bx << "\" y=\"" << plotBottom - h << "\" width=\"" << bw << "\" height=\"" << h
        << "\" fill=\"" << color(k) << "\"/>";
      s << "<text x=\"" << bx + bw / 2 << "\" y=\"" << plotBottom - h - 4 << "\" text-anchor=\"middle\">"
        << (std::isnan(v) ? "n/a" : fmtNum(v)) << "</text>";
      s << "<text x=\"" << bx + bw / 2 << "\" y=\"" << plotBottom + 14 << "\" text-anchor=\"middle\" fill=\"#444\">"
        << shortName(k) << "</text>\n";
    }
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace sluice::bench
