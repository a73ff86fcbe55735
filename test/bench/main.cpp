// sluice-bench: sluice side by side with Istio's in-pod iptables rules and
// with no redirection at all, on identical pod topologies, in one run.
// See docs/benchmarks.md for what it measures and the latest results.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "test/bench/bpfstats.h"
#include "test/common/cgroup_scope.h"
#include "test/bench/results.h"
#include "test/bench/util.h"

namespace sluice::bench {
namespace {

/// A short EEVDF slice (Linux 6.12+, sched_setattr with sched_runtime on
/// SCHED_OTHER): a woken benchmark thread gets the CPU at once instead of
/// waiting out another task's slice, so a busy machine adds less noise.
Status setSlice(int nice, int sliceUs) {
  struct SchedAttr {
    uint32_t size;
    uint32_t sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
    uint32_t sched_util_min, sched_util_max;
  } a{};
  a.size = sizeof(a);
  a.sched_policy = SCHED_OTHER;
  a.sched_nice = nice;
  a.sched_runtime = static_cast<uint64_t>(sliceUs) * 1000;
  if (::syscall(SYS_sched_setattr, 0, &a, 0) != 0) return Error::fromErrno(errno, "sched_setattr (slice)");
  return {};
}

const std::vector<std::string> kWorkloads = {"conn_out", "conn_in", "conn_out6", "conn_in6", "rr_out",
                                             "rr_in",    "bulk_out", "bulk_in",  "dns"};

/// Workloads whose clients run in the pod (outbound traffic).
bool isOutboundWorkload(const std::string& w) {
  return w == "conn_out" || w == "conn_out6" || w == "rr_out" || w == "bulk_out";
}
const std::vector<std::string> kPhases = {"traffic", "bpf", "enroll", "scale", "kube"};

void usage(std::ostream& o) {
  o << R"(usage: sluice-bench [options]

Compares, on identical pod topologies in throw-away network namespaces:
floor (no redirection), iptables (Istio's in-pod rules, nf_tables backend),
iptables-legacy, sluice-tcx, sluice-legacy (clsact) and tc-minimal (sluice-tcx's
attachments running the least a TC redirect must do: the mechanism's cost,
no DNS). Needs root.

On request (--cases), the XDP variants floor+xdp, sluice-tcx+xdp,
sluice-socket+xdp (an XDP_PASS program in native mode on both ends of the
pod's veth) and their +xdp-frags twins (the same program, frags-aware):
each figure is printed beside its case without XDP.

  --quick               smoke test (< 1 min): 1 short round, few pods; fails only
                        when a case did not really redirect
  --rounds N            interleaved rounds, the median is reported (10)
  --duration S          measured seconds per workload and case (1)
  --warmup S            seconds before each measurement (0.2)
  --conn-concurrency N  connections in flight for the connection rates (16)
  --rr-connections N    long-lived connections for request/response (1)
  --dns-concurrency N   DNS queries in flight (16)
  --pods N              pods per path for enroll/removal times, node side included
                        (200; each sluice mode also without it: its in-pod part)
  --scale-pods N        pods enrolled for the scale test, node side included (1000)
  --bare-netns          enroll pods as `ip netns add` leaves them; by default each
                        pod's /proc/sys/net is first written once, untimed, as the
                        CNI plugins before sluice's in a chain do (bridge)
  --kube-pods N         running pods of the namespace labelled at once (250)
  --cli-pods N          pods added/removed with the sluicectl process (--node-netns),
                        beside Istio's per-pod processes (20)
  --bpf-duration S      seconds per workload with BPF run-time stats on (1)
  --micro-runs N        BPF_PROG_TEST_RUN runs per packet kind (5000)
  --cases LIST          comma-separated subset of the cases (and XDP variants)
  --workloads LIST      subset of conn_out,conn_in,conn_out6,conn_in6,rr_out,rr_in,
                        bulk_out,bulk_in,dns (conn_*6: the same over IPv6)
  --phases LIST         subset of traffic,bpf,enroll,scale,kube
  --rules-dir DIR       Istio's rule files (<source>/test/bench/istio)
  --json PATH           write every figure as JSON
  --chart PATH          write an SVG chart of the rates and latencies
  --mss N               TCP_MAXSEG for every client connection (default: the
                        route's; floor's outbound runs over lo, MTU 64 KiB)
  --no-pin              do not pin the client and sink threads to CPUs
  --rr-cpu same|other   request/response client on the sink's CPU (same) or on
                        the other one (other); same by default
  --slice-us N          EEVDF time slice of the benchmark's threads in µs (100;
                        0: the kernel default): woken threads preempt others at once
  --nice N              scheduling niceness of the benchmark, its threads and the
                        commands it runs (-20: other work on the machine gets
                        the CPU only when the benchmark leaves it)
  --log-level LEVEL     loader log level (warn)

Exit status: 0 when every case's checks passed, 1 when one failed (a case
that did not really redirect), 2 on usage errors. Performance targets are
reported, never enforced.
)";
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

Machine machineInfo() {
  Machine m;
  m.nproc = onlineCpus();
  utsname u{};
  if (::uname(&u) == 0) m.kernel = u.release;
  std::ifstream cpu("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpu, line))
    if (line.rfind("model name", 0) == 0) {
      m.cpu = line.substr(line.find(':') + 2);
      break;
    }
  std::ifstream mem("/proc/meminfo");
  while (std::getline(mem, line))
    if (line.rfind("MemTotal:", 0) == 0) {
      std::stringstream ss(line.substr(9));
      long kb = 0;
      ss >> kb;
      m.memTotal = std::to_string(kb / 1024 / 1024) + " GiB";
      break;
    }
  std::ifstream la("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  la >> a >> b >> c;
  m.loadavg = fmtNum(a) + " " + fmtNum(b) + " " + fmtNum(c);
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  m.date = buf;
  return m;
}

void addMetric(Results& r, const std::string& key, const std::string& label, const std::string& unit, bool higher) {
  Metric m;
  m.key = key;
  m.label = label;
  m.unit = unit;
  m.higherIsBetter = higher;
  r.metrics.push_back(m);
}

void declareMetrics(Results& r) {
  for (const auto& w : r.cfg.workloads) {
    if (w == "conn_out") {
      addMetric(r, "conn_out.rate", "outbound new connections", "conn/s", true);
      addMetric(r, "conn_out.cpu", "  CPU per outbound connection", "µs", false);
    }
    if (w == "conn_in") {
      addMetric(r, "conn_in.rate", "inbound new connections", "conn/s", true);
      addMetric(r, "conn_in.cpu", "  CPU per inbound connection", "µs", false);
    }
    if (w == "conn_out6") {
      addMetric(r, "conn_out6.rate", "outbound new connections, v6", "conn/s", true);
      addMetric(r, "conn_out6.cpu", "  CPU per outbound v6 conn", "µs", false);
    }
    if (w == "conn_in6") {
      addMetric(r, "conn_in6.rate", "inbound new connections, v6", "conn/s", true);
      addMetric(r, "conn_in6.cpu", "  CPU per inbound v6 conn", "µs", false);
    }
    if (w == "rr_out") {
      addMetric(r, "rr_out.tps", "outbound request/response", "tx/s", true);
      addMetric(r, "rr_out.p50", "outbound req/resp latency p50", "µs", false);
      addMetric(r, "rr_out.p99", "outbound req/resp latency p99", "µs", false);
      addMetric(r, "rr_out.cpu", "  CPU per outbound transaction", "µs", false);
    }
    if (w == "rr_in") {
      addMetric(r, "rr_in.tps", "inbound request/response", "tx/s", true);
      addMetric(r, "rr_in.p50", "inbound req/resp latency p50", "µs", false);
      addMetric(r, "rr_in.p99", "inbound req/resp latency p99", "µs", false);
      addMetric(r, "rr_in.cpu", "  CPU per inbound transaction", "µs", false);
    }
    if (w == "bulk_out") {
      addMetric(r, "bulk_out.gbps", "outbound bulk throughput", "Gbit/s", true);
      addMetric(r, "bulk_out.cpu", "  CPU per MB outbound", "µs", false);
    }
    if (w == "bulk_in") {
      addMetric(r, "bulk_in.gbps", "inbound bulk throughput", "Gbit/s", true);
      addMetric(r, "bulk_in.cpu", "  CPU per MB inbound", "µs", false);
    }
    if (w == "dns") {
      addMetric(r, "dns.qps", "DNS queries (UDP capture)", "q/s", true);
      addMetric(r, "dns.cpu", "  CPU per DNS query", "µs", false);
    }
  }
}

/// One workload against one case: the figures and what failed the checks.
struct Outcome {
  std::map<std::string, double> values;
  std::vector<std::string> failures;
};

Outcome measure(CaseEnv& env, const std::string& w, const Config& cfg, double duration) {
  Outcome out;
  Sink& sink = env.sink();
  SinkCounters s0 = sink.counters();
  sluice_pod_stats p0 = env.podStats();
  bool bulk = w == "bulk_out" || w == "bulk_in";
  sink.setMode(bulk ? SinkMode::Discard : SinkMode::Echo);
  LoadOptions lo;
  lo.warmup = cfg.warmup;
  lo.duration = duration;
  lo.cpu = cfg.clientCpu;
  lo.mss = cfg.mss;
  // The window is fixed here so that the CPU time spent in it can be
  // sampled at its edges, from a thread that sleeps in between.
  Window win = windowOf(lo);
  lo.from = win.from;
  lo.end = win.end;
  double cpu0 = NAN, cpu1 = NAN;
  std::thread sampler([&] {
    std::this_thread::sleep_until(win.from);
    cpu0 = cpuSecondsUsed();
    std::this_thread::sleep_until(win.end);
    cpu1 = cpuSecondsUsed();
  });
  double ops = 0;  // operations in the window, for the CPU cost per operation
  RunCheck check;
  uint64_t conns = 0;  // connections the sink must have verified
  uint64_t lost = 0;
  if (w == "conn_out" || w == "conn_in" || w == "conn_out6" || w == "conn_in6") {
    lo.concurrency = cfg.connConcurrency;
    const int family = isIpv6Workload(w) ? AF_INET6 : AF_INET;
    auto r = isOutboundWorkload(w) ? runConnRate(env.podFd(), env.outboundDst(family), lo)
                                   : runConnRate(env.nodeFd(), env.inboundDst(family), lo);
    out.values[w + ".rate"] = r.rate;
    ops = r.rate * duration;
    check = r.check;
    conns = r.check.total;
  } else if (w == "rr_out" || w == "rr_in") {
    lo.concurrency = cfg.rrConnections;
    // One CPU for both ends: in a VM a wake-up across vCPUs can cost more
    // than the whole network path and would hide it.
    if (cfg.rrSameCpu) lo.cpu = cfg.sinkCpu;
    auto r = w == "rr_out" ? runRr(env.podFd(), env.outboundDst(), lo) : runRr(env.nodeFd(), env.inboundDst(), lo);
    out.values[w + ".tps"] = r.tps;
    out.values[w + ".p50"] = r.p50us;
    out.values[w + ".p99"] = r.p99us;
    ops = r.tps * duration;
    check = r.check;
    conns = static_cast<uint64_t>(cfg.rrConnections);
  } else if (bulk) {
    auto r = w == "bulk_out" ? runBulk(env.podFd(), env.outboundDst()(1), sink, lo)
                             : runBulk(env.nodeFd(), env.inboundDst()(1), sink, lo);
    out.values[w + ".gbps"] = r.gbps;
    ops = r.gbps * duration * 1e9 / 8 / 1e6;  // MB
    check = r.check;
    conns = 1;
  } else if (w == "dns") {
    lo.concurrency = cfg.dnsConcurrency;
    auto r = runDns(env.podFd(), env.resolver(), kDnsAnswer, lo);
    out.values["dns.qps"] = r.qps;
    ops = r.qps * duration;
    check = r.check;
    lost = r.lost;
  }
  sampler.join();
  if (ops > 0 && !std::isnan(cpu0) && !std::isnan(cpu1)) out.values[w + ".cpu"] = (cpu1 - cpu0) * 1e6 / ops;
  std::this_thread::sleep_for(50ms);  // the sink finishes what is in flight
  SinkCounters s1 = sink.counters();
  sluice_pod_stats p1 = env.podStats();
  sink.setMode(SinkMode::Echo);

  std::string tag = w + ": ";
  if (s1.bad > s0.bad) {
    auto samples = sink.badSamples();
    out.failures.push_back(tag + std::to_string(s1.bad - s0.bad) + " connection(s) failed the sink's check" +
                           (samples.empty() ? "" : " (" + samples.front() + ")"));
  }
  if (check.total == 0)
    out.failures.push_back(tag + "nothing completed" + (check.firstError.empty() ? "" : " (" + check.firstError + ")"));
  else if (check.errors > std::max<uint64_t>(3, check.total / 100))
    out.failures.push_back(tag + std::to_string(check.errors) + " errors in " + std::to_string(check.total) +
                           " operations (first: " + check.firstError + ")");
  if (w == "dns") {
    if (lost > std::max<uint64_t>(3, check.total / 100))
      out.failures.push_back(tag + std::to_string(lost) + " queries lost of " + std::to_string(check.total));
    if (s1.dnsQueries - s0.dnsQueries < check.total)
      out.failures.push_back(tag + "the sink answered fewer queries than the client got answers");
  } else if (s1.ok - s0.ok < conns) {
    out.failures.push_back(tag + "the sink verified " + std::to_string(s1.ok - s0.ok) + " connections, the client made " +
                           std::to_string(conns));
  }
  if (isSluice(env.kind()) && check.total > 0) {
    // The BPF programs, not something else, must have done the redirect.
    uint64_t seen = 0;
    std::string counter;
    if (isOutboundWorkload(w)) {
      seen = p1.outbound_conns - p0.outbound_conns;
      counter = "outbound_conns";
    } else if (w == "dns") {
      seen = std::min(p1.dns_udp_queries - p0.dns_udp_queries, p1.dns_answers - p0.dns_answers);
      counter = "dns_udp_queries/dns_answers";
      conns = check.total;
    } else {
      seen = p1.inbound_conns - p0.inbound_conns;
      counter = "inbound_conns";
    }
    if (seen < conns)
      out.failures.push_back(tag + "sluice counted " + std::to_string(seen) + " " + counter + ", the client made " +
                             std::to_string(conns));
  }
  if (!out.failures.empty())
    for (auto& [k, v] : out.values) v = NAN;
  return out;
}

int parseArgs(int argc, char** argv, Config& c) {
  std::vector<std::string> a(argv + 1, argv + argc);
  c.command = "sluice-bench";
  for (const auto& x : a) c.command += " " + x;
  bool quick = std::find(a.begin(), a.end(), "--quick") != a.end();
  if (quick) {
    c.quick = true;
    c.rounds = 1;
    c.duration = 0.25;
    c.warmup = 0.05;
    c.enrollPods = 20;
    c.scalePods = 50;
    c.kubePods = 20;
    c.cliPods = 3;
    c.bpfDuration = 0.2;
    c.microRuns = 300;
  }
  c.rulesDir = std::string(SLUICE_SOURCE_DIR) + "/test/bench/istio";
  c.workloads = kWorkloads;
  c.phases = kPhases;
  c.cases.assign(std::begin(kAllCases), std::end(kAllCases));
  for (size_t i = 0; i < a.size(); i++) {
    const std::string& o = a[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= a.size()) throw std::invalid_argument(o + " needs a value");
      return a[++i];
    };
    auto num = [&]() { return std::stod(val()); };
    if (o == "--quick") continue;
    if (o == "-h" || o == "--help") {
      usage(std::cout);
      std::exit(0);
    } else if (o == "--rounds") c.rounds = static_cast<int>(num());
    else if (o == "--duration") c.duration = num();
    else if (o == "--warmup") c.warmup = num();
    else if (o == "--conn-concurrency") c.connConcurrency = static_cast<int>(num());
    else if (o == "--rr-connections") c.rrConnections = static_cast<int>(num());
    else if (o == "--dns-concurrency") c.dnsConcurrency = static_cast<int>(num());
    else if (o == "--pods") c.enrollPods = static_cast<int>(num());
    else if (o == "--scale-pods") c.scalePods = static_cast<int>(num());
    else if (o == "--kube-pods") c.kubePods = static_cast<int>(num());
    else if (o == "--cli-pods") c.cliPods = static_cast<int>(num());
    else if (o == "--bpf-duration") c.bpfDuration = num();
    else if (o == "--micro-runs") c.microRuns = static_cast<int>(num());
    else if (o == "--rules-dir") c.rulesDir = val();
    else if (o == "--json") c.jsonPath = val();
    else if (o == "--chart") c.chartPath = val();
    else if (o == "--no-pin") c.pin = false;
    else if (o == "--bare-netns") PodFarm::bare = true;
    else if (o == "--rr-cpu") {
      std::string v = val();
      if (v != "same" && v != "other") throw std::invalid_argument("--rr-cpu: same or other");
      c.rrSameCpu = v == "same";
    }
    else if (o == "--nice") c.nice = static_cast<int>(num());
    else if (o == "--slice-us") c.sliceUs = static_cast<int>(num());
    else if (o == "--mss") c.mss = static_cast<int>(num());
    else if (o == "--log-level") spdlog::set_level(spdlog::level::from_str(val()));
    else if (o == "--cases") {
      c.cases.clear();
      for (const auto& s : split(val())) {
        auto k = parseCase(s);
        if (!k) throw std::invalid_argument("unknown case '" + s + "'");
        c.cases.push_back(*k);
      }
    } else if (o == "--workloads") {
      c.workloads = split(val());
      for (const auto& w : c.workloads)
        if (std::find(kWorkloads.begin(), kWorkloads.end(), w) == kWorkloads.end())
          throw std::invalid_argument("unknown workload '" + w + "'");
    } else if (o == "--phases") {
      c.phases = split(val());
      for (const auto& p : c.phases)
        if (std::find(kPhases.begin(), kPhases.end(), p) == kPhases.end())
          throw std::invalid_argument("unknown phase '" + p + "'");
    } else {
      throw std::invalid_argument("unknown option '" + o + "'");
    }
  }
  if (c.rounds < 1 || c.duration <= 0 || c.warmup < 0 || c.connConcurrency < 1 || c.rrConnections < 1 ||
      c.dnsConcurrency < 1 || c.enrollPods < 1 || c.scalePods < 1 || c.kubePods < 1 || c.cliPods < 0 || c.bpfDuration <= 0 || c.microRuns < 1)
    throw std::invalid_argument("counts and durations must be positive");
  if (c.pin && onlineCpus() >= 2) {
    c.clientCpu = 0;
    c.sinkCpu = 1;
  }
  return 0;
}

/// Builds the environments of @p kinds; a case that cannot be built is a
/// failed check (and is skipped).
std::vector<std::unique_ptr<CaseEnv>> buildEnvs(const std::vector<CaseKind>& kinds, const IstioRules* rules,
                                                Results& res, bool probe, bool keepNotes) {
  std::vector<std::unique_ptr<CaseEnv>> envs;
  for (CaseKind k : kinds) {
    if (gStop) break;
    auto env = CaseEnv::create(k, rules, res.cfg.sinkCpu);
    if (!env.ok()) {
      res.checks[k].failures.push_back("setup: " + env.error().message);
      continue;
    }
    if (probe) {
      std::vector<std::string> notes;
      auto fails = (*env)->probe(notes);
      auto& ck = res.checks[k];
      for (auto& f : fails) ck.failures.push_back("probe: " + f);
      if (keepNotes) ck.notes = notes;
      if (!fails.empty()) continue;  // no figures from a case that does not redirect
    }
    envs.push_back(std::move(*env));
  }
  return envs;
}

void trafficPhase(Results& res, const IstioRules* rules) {
  const Config& c = res.cfg;
  declareMetrics(res);
  for (auto& m : res.metrics)
    for (CaseKind k : c.cases)
      if (caseRuns(k, m.key.substr(0, m.key.find('.')))) m.rounds[k].assign(static_cast<size_t>(c.rounds), NAN);
  for (int round = 0; round < c.rounds && !gStop; round++) {
    auto t0 = Clock::now();
    res.roundLoad.push_back(loadAverage());
    auto envs = buildEnvs(c.cases, rules, res, true, round == 0);
    std::cerr << "round " << round + 1 << "/" << c.rounds << ": " << envs.size() << " case(s) ready in "
              << fmtNum(secondsSince(t0)) << " s\n";
    for (const auto& w : c.workloads) {
      if (gStop) break;
      // A B C ... each round, starting one case later every round.
      for (size_t i = 0; i < envs.size() && !gStop; i++) {
        CaseEnv& env = *envs[(i + static_cast<size_t>(round)) % envs.size()];
        if (!caseRuns(env.kind(), w)) continue;
        Outcome o = measure(env, w, c, c.duration);
        auto& ck = res.checks[env.kind()];
        for (const auto& f : o.failures) ck.failures.push_back("round " + std::to_string(round + 1) + ": " + f);
        if (o.failures.empty()) ck.measurements++;
        for (const auto& [key, v] : o.values)
          if (Metric* m = res.metric(key)) m->rounds[env.kind()][static_cast<size_t>(round)] = v;
        std::cerr << "  " << w << " " << env.name() << ":";
        for (const auto& [key, v] : o.values) std::cerr << " " << key << "=" << fmtNum(v);
        if (!o.failures.empty()) std::cerr << "  FAILED: " << o.failures.front();
        std::cerr << "\n";
      }
    }
    std::cerr << "  tearing down\n";
    envs.clear();
  }
}

void bpfPhase(Results& res, const IstioRules* rules) {
  const Config& c = res.cfg;
  std::vector<CaseKind> kinds;
  for (CaseKind k : c.cases)
    if ((isTproxyStyle(k) || k == CaseKind::SluiceSocket) && xdpVariant(k) == XdpVariant::None) kinds.push_back(k);
  if (kinds.empty()) return;
  res.bpfStatsBefore = bpfStatsSysctl();
  auto envs = buildEnvs(kinds, rules, res, false, false);
  // BPF_PROG_TEST_RUN first, without run-time stats (they would add to it).
  for (auto& env : envs) {
    if (gStop) break;
    if (!isSluiceTc(env->kind())) continue;  // the socket programs run per socket call, not per packet
    res.micro[env->kind()] = runMicro(*env, c.microRuns);
    std::cerr << "  test_run micro " << env->name() << " done\n";
  }
  {
    BpfStatsOn on;
    if (!on.ok()) {
      res.errors.push_back("bpf phase: " + on.error());
      return;
    }
    res.bpfStatsHow = on.how();
    for (auto& env : envs) {
      std::vector<CaseProgram> progs = env->programs();
      for (const auto& w : c.workloads) {
        if (gStop) break;
        if (!caseRuns(env->kind(), w)) continue;
        std::vector<ProgRun> before;
        for (const auto& p : progs) before.push_back(progRun(p.fd));
        Outcome o = measure(*env, w, c, c.bpfDuration);
        auto& ck = res.checks[env->kind()];
        for (const auto& f : o.failures) ck.failures.push_back("bpf stats run: " + f);
        for (size_t i = 0; i < progs.size(); i++) {
          ProgRun d = progRun(progs[i].fd) - before[i];
          res.bpf[env->kind()].push_back(ProgSample{progs[i].name, w, d.ns, d.cnt});
        }
        std::cerr << "  bpf stats " << w << " " << env->name() << " done\n";
      }
    }
  }
  res.bpfStatsAfter = bpfStatsSysctl();
}

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) {
  using namespace sluice::bench;
  spdlog::set_level(spdlog::level::warn);
  spdlog::set_default_logger(spdlog::stderr_color_mt("sluice-bench"));
  spdlog::set_level(spdlog::level::warn);
  Results res;
  try {
    parseArgs(argc, argv, res.cfg);
  } catch (const std::exception& e) {
    std::cerr << "sluice-bench: " << e.what() << "\n";
    usage(std::cerr);
    return 2;
  }
  if (::geteuid() != 0) {
    std::cerr << "sluice-bench: needs root (network namespaces, BPF, iptables)\n";
    return 1;
  }
  installSignalHandlers();
  // Before any thread exists: every thread and child inherits it.
  if (::setpriority(PRIO_PROCESS, 0, res.cfg.nice) != 0)
    std::cerr << "sluice-bench: setpriority: " << std::strerror(errno) << "\n";
  if (res.cfg.sliceUs > 0) {
    sluice::Status st = setSlice(res.cfg.nice, res.cfg.sliceUs);
    if (!st.ok()) std::cerr << "sluice-bench: " << st.error().message << " (kernel default slice used)\n";
  }
  sweepStaleNamespaces();
  // The socket mode's node hooks go to a cgroup of the bench's own: they
  // then see only its sockets (no other process pays for them, and their
  // BPF statistics count only the bench's traffic).
  std::optional<sluice::test::CgroupScope> scope;
  if (std::any_of(res.cfg.cases.begin(), res.cfg.cases.end(),
                  [](CaseKind k) { return baseCase(k) == CaseKind::SluiceSocket; })) {
    scope.emplace("bench");
    if (!scope->ok()) {
      std::cerr << "sluice-bench: a cgroup of its own for the socket mode's hooks: " << scope->error() << "\n";
      return 1;
    }
    setSocketHookCgroup(scope->path());
  }
  auto t0 = Clock::now();
  res.machine = machineInfo();
  const Config& c = res.cfg;

  TempDir tmp;
  std::optional<IstioRules> rules;
  bool needRules = c.hasCase(CaseKind::Iptables) || c.hasCase(CaseKind::IptablesLegacy);
  if (needRules) {
    auto r = loadIstioRules(c.rulesDir, tmp);
    if (!r.ok()) {
      std::cerr << "sluice-bench: " << r.error().message << "\n";
      return 1;
    }
    rules = *r;
  }
  const IstioRules* rp = rules ? &*rules : nullptr;

  // Deleted namespaces are freed by a kernel worker later; a phase must not
  // pay for the previous one's clean-up.
  const long netnsBase = netnsObjects();
  auto settle = [&](const char* after) {
    double s = settleNamespaces(netnsBase + 4);
    res.phaseNotes.push_back(std::string("after ") + after + ": waited " + fmtNum(s) +
                             " s for namespace clean-up (net_namespace objects " + std::to_string(netnsObjects()) +
                             ", " + std::to_string(netnsBase) + " at start)");
  };
  if (c.hasPhase("traffic")) {
    trafficPhase(res, rp);
    settle("traffic");
  }
  if (c.hasPhase("bpf") && !gStop) {
    std::cerr << "BPF program statistics\n";
    bpfPhase(res, rp);
    settle("bpf");
  }
  // Scale before enroll: "pod 1" is then timed on a node without hundreds of
  // namespaces (their /proc/sys entries slow the loader's sysctl accesses).
  for (CaseKind k : {CaseKind::SluiceSocket, CaseKind::SluiceTcx}) {
    if (!c.hasPhase("scale") || !c.hasCase(k) || gStop) continue;
    std::cerr << "scale: " << c.scalePods << " pods (" << caseName(k) << ")\n";
    res.scales.push_back(
        runScaleBench(c.scalePods, k == CaseKind::SluiceSocket ? sluice::CaptureMode::Socket : sluice::CaptureMode::Tc));
    settle("scale");
  }
  if (c.hasPhase("enroll") && !gStop) {
    std::cerr << "enroll/remove: " << c.enrollPods << " pods per path\n";
    // The XDP variants enroll exactly as their cases do.
    std::vector<CaseKind> noXdp;
    for (CaseKind k : c.cases)
      if (xdpVariant(k) == XdpVariant::None) noXdp.push_back(k);
    res.enroll = runEnrollBench(c.enrollPods, noXdp, rp);
    settle("enroll");
    if (c.cliPods > 0 && c.hasCase(CaseKind::SluiceTcx) && !gStop) {
      std::cerr << "sluicectl: " << c.cliPods << " pods\n";
      res.cli = runCliBench(c.cliPods, rp);
      settle("sluicectl");
    }
    std::vector<std::string> modes;
    if (c.hasCase(CaseKind::SluiceSocket)) modes.push_back("socket");
    if (c.hasCase(CaseKind::SluiceTcx)) modes.push_back("tcx");
    if (c.hasCase(CaseKind::SluiceLegacy)) modes.push_back("legacy");
    if (!modes.empty() && !gStop) {
      std::cerr << "sluice-cni -> agent -> ZDS ack: " << c.enrollPods << " pods per mode\n";
      res.handoff = runHandOffBench(c.enrollPods, modes);
      settle("hand-off");
    }
  }
  if (c.hasPhase("kube") && !gStop) {
    std::cerr << "kube: " << c.kubePods << " running pods, their namespace labelled ambient at once\n";
    res.kube = runKubeScaleBench(c.kubePods);
    settle("kube");
  }
  if (gStop) res.errors.push_back("interrupted");
  res.seconds = secondsSince(t0);
  evaluateTargets(res);

  printReport(res, std::cout);
  std::cout.flush();
  if (!c.jsonPath.empty()) {
    std::ofstream f(c.jsonPath);
    f << toJson(res);
    if (!f) std::cerr << "sluice-bench: cannot write " << c.jsonPath << "\n";
  }
  if (!c.chartPath.empty()) {
    std::ofstream f(c.chartPath);
    f << toSvg(res);
    if (!f) std::cerr << "sluice-bench: cannot write " << c.chartPath << "\n";
  }
  return res.verified() ? 0 : 1;
}
