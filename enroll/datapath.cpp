#include "enroll/datapath.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "base/pod_stats.h"
#include "enroll/context.h"
#include "enroll/discover.h"
#include "enroll/pins.h"
#include "enroll/plan.h"
#include "enroll/registry.h"
#include "loader/bpffs.h"
#include "loader/cgroup.h"
#include "loader/features.h"
#include "loader/netns.h"
#include "loader/privileges.h"
#include "loader/probe_hook.h"
#include "loader/sock_hooks.h"

namespace sluice {

namespace {

Status requireAbsolute(const std::string& path, const char* what) {
  if (!path.empty() && path[0] != '/')
    return Error::msg(std::string(what) + " path '" + path +
                          "' is relative: give an absolute path (every sluice process must find the same file)",
                      EINVAL);
  return {};
}

// What `pod add` checks before it touches anything.
Status validateSpec(const PodSpec& spec, const std::string& id) {
  SLUICE_TRY(validatePodId(id));
  SLUICE_TRY(validatePodIdentity(spec.identity));
  if (spec.rerouteIfaces.size() > SLUICE_MAX_REROUTE_IFACES)
    return Error::msg("at most " + std::to_string(SLUICE_MAX_REROUTE_IFACES) + " --reroute-iface", EINVAL);
  if (spec.ips.size() > SLUICE_MAX_POD_ADDRS)
    return Error::msg("at most " + std::to_string(SLUICE_MAX_POD_ADDRS) + " --ip", EINVAL);
  SLUICE_TRY(requireAbsolute(spec.netnsPath, "netns"));
  if (spec.nodeNetnsPath) SLUICE_TRY(requireAbsolute(*spec.nodeNetnsPath, "node netns"));
  if (spec.netnsPath.size() >= sizeof(sluice_pod_record::netns_path))
    return Error::msg("netns path is longer than " + std::to_string(sizeof(sluice_pod_record::netns_path) - 1) +
                          " characters",
                      EINVAL);
  if (spec.nodeNetnsPath && spec.nodeNetnsPath->size() >= sizeof(sluice_pod_record::node_netns_path))
    return Error::msg("node netns path is too long", EINVAL);
  return {};
}

// The record `pod add` starts from: what the spec says (discovery adds
// what is found in the pod's netns).
Result<sluice_pod_record> recordFromSpec(const PodSpec& spec, const std::string& id, uint64_t netnsIno, bool socket,
                                         TcMode mode) {
  sluice_pod_record rec{};
  copyString(rec.netns_path, sizeof(rec.netns_path), spec.netnsPath);
  rec.netns_ino = netnsIno;
  rec.enrolled_at_ns = nowNs();
  rec.config.flags = captureFlags(spec.dnsCapture, spec.inboundCapture);
  copyString(rec.config.id, sizeof(rec.config.id), id);
  recordIdentity(rec, spec.identity);
  rec.capture = socket ? SLUICE_CAPTURE_SOCKET : SLUICE_CAPTURE_TC;
  rec.tc_mode = mode == TcMode::Legacy ? SLUICE_TC_LEGACY : SLUICE_TC_TCX;
  rec.fwmark_accept_before = -1;
  for (const auto& ip : spec.ips) {
    auto a = parsePodAddr(ip);
    SLUICE_TRY(a);
    rec.addrs[rec.addr_count++] = *a;
  }
  if (spec.nodeNetnsPath) copyString(rec.node_netns_path, sizeof(rec.node_netns_path), *spec.nodeNetnsPath);
  return rec;
}

void logEnrolled(const std::string& id, const PodInfo& info, bool socket, uint32_t rerouteCount) {
  if (socket)
    spdlog::info("enrolled pod {} (netns {}, socket capture, {} virtual interface(s), {})", id, info.netnsPath,
                 info.interfaces.size(), describeConfig(info));
  else
    spdlog::info("enrolled pod {} (netns {}, {}, {} interface(s), {})", id, info.netnsPath, info.tcMode,
                 info.interfaces.size(), describeConfig(info));
  // Not an error: the proxy may not use SO_REUSEPORT. Said at enrolment,
  // because traffic would otherwise just vanish into a dropped handshake.
  // The socket mode hands connections to reuseport listeners on any kernel,
  // but a reroute interface's traffic is still captured at TC.
  if (auto f = kernelFeatures(); f.ok() && !f->reuseportAssign.present) {
    if (!socket)
      spdlog::warn("pod {}: {}", id, reuseportWarning(*f));
    else if (rerouteCount)
      spdlog::warn("pod {}: its --reroute-iface traffic is captured at TC: {}", id, reuseportWarning(*f));
  }
}

}  // namespace

Result<std::unique_ptr<Datapath>> Datapath::open(const DatapathOptions& given) {
  DatapathOptions options = given;
  auto wanted = encodeSettings(options.settings);
  SLUICE_TRY(wanted);
  // Before anything is created: an unprivileged run must not leave a root
  // directory it owns, where root's pins would later live.
  SLUICE_TRY(checkPrivileges());
  SLUICE_TRY(ensureBpffsRoot(options.bpffsRoot));
  auto lock = StateLock::acquire(options.bpffsRoot);
  SLUICE_TRY(lock);
  auto programs = PodPrograms::load(options.bpffsRoot, options.snatEntries);
  SLUICE_TRY(programs);
  // Whatever else is pinned there (an older build's programs, a load that
  // crashed half way) is no program's only reference: hooks hold theirs.
  if (auto stale = removeStaleProgramPins(options.bpffsRoot); !stale.ok())
    spdlog::warn("{}", stale.error().message);
  auto current = (*programs)->settings.lookup(0);
  bool fresh = !current || current->outbound_port == 0;
  if (!fresh && options.adoptPinnedSettings) {
    options.settings = decodeSettings(*current);
    *wanted = *current;
  }
  if (fresh) {
    SLUICE_TRY((*programs)->settings.update(0, *wanted));
    spdlog::info("wrote settings to {}/{}", options.bpffsRoot, SLUICE_PIN_SETTINGS);
  } else if (std::memcmp(&*current, &*wanted, sizeof(*wanted)) != 0) {
    if (!(*programs)->pods.keys().empty())
      return Error::msg("settings differ from the ones pinned under " + options.bpffsRoot +
                            " while pods are enrolled; remove the pods first",
                        EBUSY);
    SLUICE_TRY((*programs)->settings.update(0, *wanted));
    spdlog::info("replaced settings in {}/{} (no pods enrolled)", options.bpffsRoot, SLUICE_PIN_SETTINGS);
  }
  if (options.skLookupStubsAhead > 0 && (*programs)->socketLoaded())
    SLUICE_TRY((*programs)->keepSkLookupStubs(options.skLookupStubsAhead));
  return std::unique_ptr<Datapath>(new Datapath(options, std::move(*programs)));
}

PodContext Datapath::contextFor(const std::string& id, const sluice_pod_record& rec) {
  PodContext c;
  c.id = id;
  c.rec = rec;
  c.programs = programs_.get();
  c.settings = &options_.settings;
  c.root = options_.bpffsRoot;
  c.linkDir = podLinkDir(options_.bpffsRoot, id);
  c.services.ensureNodeHooks = [this](bool full) { return ensureNodeHooksFor(full); };
  c.services.nodeCgroup = [this] { return nodeCgroup(); };
  c.services.ensureProbeHook = [this](bool full) { return ensureProbeHookFor(full); };
  c.services.staging = [this] { return stagingPrograms(); };
  c.services.reapStale = [this](const std::string& other, const sluice_pod_record& r, const std::string& held) {
    return reapStale(other, r, held);
  };
  return c;
}

Result<std::string> Datapath::podIdForNetns(const std::string& netnsPath) {
  auto ns = openNetns(netnsPath);
  SLUICE_TRY(ns);
  auto cookie = netnsCookie(ns->get());
  SLUICE_TRY(cookie);
  for (const auto& key : programs_->pods.keys()) {
    auto rec = programs_->pods.lookup(key);
    if (rec && rec->netns_cookie == *cookie) return podIdOf(key);
  }
  return Error::msg("netns " + netnsPath + " is not enrolled", ENOENT);
}

Status Datapath::prepareLocked(const PodSpec& spec, const Handoff* hook, Preparation& p) {
  const std::string& id = p.id;
  std::optional<sluice_pod_record>& existing = p.existing;
  auto ns = openNetns(spec.netnsPath);
  SLUICE_TRY(ns);
  auto ino = netnsInode(ns->get());
  SLUICE_TRY(ino);
  auto capture = resolveCapture(spec.capture.value_or(options_.capture));
  SLUICE_TRY(capture);
  const bool socket = *capture == CaptureMode::Socket;
  TcMode mode = spec.tcMode.value_or(options_.tcMode);
  if (mode == TcMode::Auto) {
    auto f = kernelFeatures();
    SLUICE_TRY(f);
    mode = f->autoTcMode();
  }
  auto rec = recordFromSpec(spec, id, *ino, socket, mode);
  SLUICE_TRY(rec);
  existing = programs_->pods.lookup(podKey(id));
  if (existing) {
    // A pod whose netns is gone (no agent swept it) must not block its id.
    auto gone = recordedNetnsGone(*existing);
    SLUICE_TRY(gone);
    if (*gone) {
      SLUICE_TRY(reapStale(id, *existing, "its id"));
      existing.reset();
    }
  }

  p.pod.context = contextFor(id, *rec);
  PodContext& c = p.pod.context;
  c.handoff = hook;
  Result<Discovery> found = Error::msg("not run");
  SLUICE_TRY(runInNetns(ns->get(), [&]() -> Status {
    c.inPodNetns = true;
    found = discoverPod(c, spec, existing);
    c.inPodNetns = false;
    return found.ok() ? Status() : Status(found.error());
  }));
  p.alreadyEnrolled = found->alreadyEnrolled;
  c.heldPodNetns = std::move(*ns);
  p.pod.what.ipv6 = found->ipv6;
  p.pod.what.nodeSide = spec.nodeNetnsPath.has_value();
  p.pod.what.handoff = hook != nullptr;
  return {};
}

Result<Datapath::Preparation> Datapath::prepare(const PodSpec& spec, const Handoff* hook) {
  std::string id = spec.id.empty() ? defaultPodId(spec.netnsPath) : spec.id;
  SLUICE_TRY(validateSpec(spec, id));
  auto lock = StateLock::acquire(options_.bpffsRoot);
  SLUICE_TRY(lock);
  Preparation p{std::move(*lock), id, {}, {}, false};
  SLUICE_TRY(prepareLocked(spec, hook, p));
  return p;
}

Result<PodInfo> Datapath::addPod(const PodSpec& spec, const Handoff* hook) {
  auto p = prepare(spec, hook);
  SLUICE_TRY(p);
  ensurePodGuardFor();
  if (p->alreadyEnrolled) {
    if (p->pod.what.nodeSide && p->existing->host_iface.ifindex == 0)
      SLUICE_TRY(completeNodeSide(p->id, *p->existing, p->pod.context));
    return retryHandoff(p->id, *p->existing, hook);
  }
  PodContext& c = p->pod.context;
  SLUICE_TRY(applyPlan(planFor(c.rec, p->pod.what), c));
  PodInfo info = podInfoFromRecord(p->id, c.rec);
  logEnrolled(p->id, info, c.rec.capture == SLUICE_CAPTURE_SOCKET, c.rec.config.reroute_count);
  return info;
}

Result<PreparedPod> Datapath::preparePod(const PodSpec& spec, const Handoff* hook) {
  auto p = prepare(spec, hook);
  SLUICE_TRY(p);
  if (p->alreadyEnrolled) return Error::msg("pod '" + p->id + "' is enrolled already", EEXIST);
  return std::move(p->pod);
}

Status Datapath::completeNodeSide(const std::string& id, const sluice_pod_record& rec, const PodContext& found) {
  PodContext c = contextFor(id, rec);
  c.podVethIfindex = found.podVethIfindex;
  c.peerIfindex = found.peerIfindex;
  PlanFor what = PlanFor::enrolled(rec);
  what.nodeSide = true;
  Plan nodeSteps;
  for (auto& step : planFor(rec, what))
    if (step->where() == Where::Node) nodeSteps.push_back(std::move(step));
  spdlog::info("pod {} is enrolled without its node side (an enrollment cut short); adding it", id);
  return applyPlan(nodeSteps, c);
}

Result<PodInfo> Datapath::retryHandoff(const std::string& id, const sluice_pod_record& rec, const Handoff* hook) {
  spdlog::info("pod {} is already enrolled with these settings", id);
  PodInfo have = podInfoFromRecord(id, rec);
  if (!hook) return have;
  // A retried enrollment retries the hand-off (the node proxy answers a
  // pod it has with success); a failure leaves the enrollment as it was.
  Status handed = hook->apply(have);
  SLUICE_TRY(setHandoff(id, handed.ok() ? HandoffState::Acked : HandoffState::Failed,
                        handed.ok() ? "" : handed.error().message));
  if (hook->failureIsFatal) SLUICE_TRY(handed);
  auto now = programs_->pods.lookup(podKey(id));
  return now ? podInfoFromRecord(id, *now) : have;
}

Result<CaptureMode> Datapath::resolveCapture(CaptureMode requested) const {
  if (requested == CaptureMode::Tc) return CaptureMode::Tc;
  auto f = kernelFeatures();
  SLUICE_TRY(f);
  std::string why = socketUnavailableReason(*f);
  if (why.empty() && !programs_->socketLoaded()) why = programs_->socketError();
  if (requested == CaptureMode::Socket && !why.empty())
    return Error::msg("socket capture unavailable: " + why + "; use --capture tc", ENOTSUP);
  return why.empty() ? CaptureMode::Socket : CaptureMode::Tc;
}

Result<std::string> Datapath::nodeCgroup() const { return nodeHookCgroup(options_.cgroupPath); }

void Datapath::ensurePodGuardFor() {
  if (podGuardChecked_ || !options_.podGuard) return;
  podGuardChecked_ = true;
  // Not an enrollment's failure: without the guard the pods are as safe as
  // the capture modes make them, and status says what is missing.
  auto guard = ensurePodGuard(options_.bpffsRoot);
  if (!guard.ok())
    spdlog::warn("pod guard not attached: {}; apps holding CAP_NET_RAW can send frames past the proxy",
                 guard.error().message);
  else if (!guard->active)  // the kernel's, not this enrollment's: status says it; the agent warns once
    spdlog::info("pod guard inactive: {}; apps holding CAP_NET_RAW can send frames past the proxy", guard->why);
}

Status Datapath::ensureNodeHooksFor(bool full) {
  auto cg = nodeCgroup();
  SLUICE_TRY(cg);
  auto id = cgroupIdOfPath(*cg);
  SLUICE_TRY(id);
  if (!full && nodeHooksChecked_ && nodeHooksChecked_->first == *cg && nodeHooksChecked_->second == *id &&
      nodeHooksComplete(options_.bpffsRoot, *programs_))
    return {};
  nodeHooksChecked_.reset();
  SLUICE_TRY(ensureNodeHooks(options_.bpffsRoot, *cg, *programs_, false));
  nodeHooksChecked_.emplace(*cg, *id);
  return {};
}

Status Datapath::ensureProbeHookFor(bool full) {
  auto cg = nodeCgroup();
  SLUICE_TRY(cg);
  if (!full && probeHookChecked_ == *cg && probeHookPinned(options_.bpffsRoot)) return {};
  probeHookChecked_.reset();
  SLUICE_TRY(ensureProbeHook(options_.bpffsRoot, *cg, false));
  probeHookChecked_ = *cg;
  return {};
}

Status Datapath::setHandoff(const std::string& id, HandoffState state, const std::string& error) {
  auto rec = programs_->pods.lookup(podKey(id));
  if (!rec) return {};
  recordHandoff(*rec, state, error);
  // BPF_EXIST: a pod removed meanwhile is not brought back.
  Status st = programs_->pods.update(podKey(id), *rec, BPF_EXIST);
  if (!st.ok() && st.error().code == ENOENT) return {};
  return st;
}

Result<Datapath::LockedPod> Datapath::lockedPod(const std::string& id) {
  SLUICE_TRY(validatePodId(id));
  auto lock = StateLock::acquire(options_.bpffsRoot);
  SLUICE_TRY(lock);
  auto rec = programs_->pods.lookup(podKey(id));
  if (!rec) return notEnrolledError(id);
  return LockedPod{std::move(*lock), *rec};
}

Result<PodInfo> Datapath::updatePodSettings(const std::string& id, const CaptureSettings& settings) {
  if (settings.rerouteIfaces.size() > SLUICE_MAX_REROUTE_IFACES)
    return Error::msg("at most " + std::to_string(SLUICE_MAX_REROUTE_IFACES) + " reroute interfaces", EINVAL);
  auto pod = lockedPod(id);
  SLUICE_TRY(pod);
  const sluice_pod_record* rec = &pod->rec;

  PodContext c = contextFor(id, *rec);
  sluice_pod_config& cfg = c.rec.config;
  cfg.flags &= ~(SLUICE_POD_DNS_CAPTURE | SLUICE_POD_INBOUND_CAPTURE);
  cfg.flags |= captureFlags(settings.dnsCapture, settings.inboundCapture);
  cfg.reroute_count = 0;
  std::memset(cfg.reroute_ifindex, 0, sizeof(cfg.reroute_ifindex));
  // Names resolve in the pod's netns, as at enrollment; the programs run
  // only on the interfaces attached then, so only those can reroute.
  if (!settings.rerouteIfaces.empty())
    SLUICE_TRY(inPodNetns(c, [&] { return resolveRerouteIfaces(c, settings.rerouteIfaces, cfg); }));
  if (sameConfig(cfg, rec->config)) return podInfoFromRecord(id, *rec);

  // The record first: should a later write fail (or the process die in
  // between), the sweep finds pod_config differing from the record and
  // writes the record's, so the pod ends up with the settings asked for.
  SLUICE_TRY(programs_->pods.update(podKey(id), c.rec, BPF_EXIST));
  if (Status st = applySettings(planFor(c.rec, PlanFor::enrolled(c.rec)), c, *rec); !st.ok()) {
    (void)programs_->pods.update(podKey(id), *rec, BPF_EXIST);
    return st.error();
  }
  PodInfo before = podInfoFromRecord(id, *rec), after = podInfoFromRecord(id, c.rec);
  spdlog::info("pod {}: settings changed in place ({} -> {})", id, describeConfig(before), describeConfig(after));
  return after;
}

Status Datapath::teardown(const std::string& id, const sluice_pod_record& rec, bool keepReturnPath) {
  PodContext c = contextFor(id, rec);
  PlanFor what = PlanFor::enrolled(rec);
  what.keepReturnPath = keepReturnPath;
  return undoPlan(planFor(rec, what), c);
}

Status Datapath::reapStale(const std::string& id, const sluice_pod_record& rec, const std::string& held) {
  spdlog::warn("reaping pod '{}': its netns {} is gone, and it still held {}", id,
               netnsPathOf(rec), held);
  Status st = teardown(id, rec);
  if (!st.ok()) return Error::msg("could not reap pod '" + id + "' whose netns is gone: " + st.error().message, st.error().code);
  return {};
}

Status Datapath::removePod(const std::string& id) {
  auto pod = lockedPod(id);
  SLUICE_TRY(pod);
  Status st = teardown(id, pod->rec);
  if (st.ok()) spdlog::info("removed pod {}", id);
  return st;
}

Status Datapath::removePodKeepingReturnPath(const std::string& id) {
  auto pod = lockedPod(id);
  SLUICE_TRY(pod);
  Status st = teardown(id, pod->rec, true);
  if (st.ok()) spdlog::info("removed pod {}, its return path left to Istio's node agent", id);
  return st;
}

std::vector<PodInfo> Datapath::listPods() {
  std::vector<PodInfo> out;
  for (const auto& key : programs_->pods.keys()) {
    auto rec = programs_->pods.lookup(key);
    if (rec) out.push_back(podInfoFromRecord(podIdOf(key), *rec));
  }
  std::sort(out.begin(), out.end(), [](const PodInfo& a, const PodInfo& b) { return a.id < b.id; });
  return out;
}

Result<std::vector<PodCounters>> Datapath::stats(const std::optional<std::string>& id) {
  std::vector<PodCounters> out;
  auto pods = listPods();
  if (id && std::none_of(pods.begin(), pods.end(), [&](const PodInfo& p) { return p.id == *id; }))
    return notEnrolledError(*id);
  for (const auto& p : pods) {
    if (id && p.id != *id) continue;
    PodCounters c;
    c.id = p.id;
    c.stats = sumPerCpu(programs_->podStats.lookupPerCpu(p.netnsCookie));
    out.push_back(c);
  }
  return out;
}

Result<PodPrograms*> Datapath::stagingPrograms() {
  if (!staging_) {
    // Its own instance: a tcx hook refuses the program it already runs.
    auto p = PodPrograms::load(options_.bpffsRoot, options_.snatEntries, PodPrograms::Sharing::Private);
    SLUICE_TRY(p);
    staging_ = std::move(*p);
  }
  return staging_.get();
}

Result<PodCheck> Datapath::checkPod(const std::string& id) {
  auto pod = lockedPod(id);
  SLUICE_TRY(pod);
  PodContext c = contextFor(id, pod->rec);
  return checkPlan(planFor(pod->rec, PlanFor::enrolled(pod->rec)), c, false);
}

namespace {

// A sweep's repair of the node's own hooks, reported as the pseudo-pod "(node)".
void reportNodeRepair(ReconcileReport& report, int replaced, int attached, const std::string& what) {
  report.programsReplaced += replaced;
  if (!attached) return;
  PodCheck node;
  node.id = "(node)";
  node.problems.push_back(std::to_string(attached) + " " + what + " missing");
  node.repaired = node.problems;
  report.repaired.push_back(node);
}

}  // namespace

// The probe hook of an older build is switched to this build's program in
// place (no connect misses it), once per Datapath; a missing one is attached.
void Datapath::reconcileProbeHook(const std::vector<sluice_pod_id>& keys, ReconcileReport& report) {
  bool nodeSide = std::any_of(keys.begin(), keys.end(), [&](const sluice_pod_id& k) {
    auto r = programs_->pods.lookup(k);
    return r && r->host_iface.ifindex;
  });
  if (!nodeSide && !probeHookPinned(options_.bpffsRoot)) return;
  auto cg = nodeCgroup();
  // The first sweep compares the links' programs with this build's (a
  // load); later ones only check the pins.
  auto done = cg.ok() ? ensureProbeHook(options_.bpffsRoot, *cg, !probeHookSwept_) : Result<ProbeHookReport>(cg.error());
  if (!done.ok()) {
    report.errors.push_back("node probe hook: " + done.error().message);
    return;
  }
  probeHookSwept_ = true;
  reportNodeRepair(report, done->replaced, done->attached, "node probe hook link(s)");
}

void Datapath::reconcileNodeHooks(const std::vector<sluice_pod_id>& keys, ReconcileReport& report) {
  bool socketPods = std::any_of(keys.begin(), keys.end(), [&](const sluice_pod_id& k) {
    auto r = programs_->pods.lookup(k);
    return r && r->capture == SLUICE_CAPTURE_SOCKET;
  });
  if (!programs_->socketLoaded() || !(socketPods || nodeHooksPinned(options_.bpffsRoot))) return;
  auto cg = nodeCgroup();
  auto done = cg.ok() ? ensureNodeHooks(options_.bpffsRoot, *cg, *programs_, true) : Result<NodeHooksReport>(cg.error());
  if (!done.ok()) {
    report.errors.push_back("socket mode node hooks: " + done.error().message);
    return;
  }
  reportNodeRepair(report, done->replaced, done->attached, "socket mode node hook(s)");
}

ReconcileReport Datapath::reconcile() {
  ReconcileReport report;
  auto lock = StateLock::acquire(options_.bpffsRoot);
  if (!lock.ok()) {
    report.errors.push_back(lock.error().message);
    return report;
  }
  auto keys = programs_->pods.keys();
  report.pods = keys.size();
  // The socket mode's node hooks: re-made when missing, switched to this
  // Datapath's programs in place (how a newer build takes over).
  reconcileNodeHooks(keys, report);
  reconcileProbeHook(keys, report);
  struct DropStaging {
    std::unique_ptr<PodPrograms>& p;
    ~DropStaging() { p.reset(); }
  } dropStaging{staging_};
  for (const auto& key : keys) {
    std::string id = podIdOf(key);
    auto rec = programs_->pods.lookup(key);
    if (!rec) continue;  // removed meanwhile (by another sluice process)
    PodContext ctx = contextFor(id, *rec);
    PodCheck c = checkPlan(planFor(*rec, PlanFor::enrolled(*rec)), ctx, true);
    report.programsReplaced += c.programsReplaced;
    if (c.gone) {
      spdlog::info("pod {}: netns {} is gone; removing the pod", id, netnsPathOf(*rec));
      Status st = teardown(id, *rec);
      if (st.ok())
        report.removed.push_back(id);
      else
        report.errors.push_back("pod " + id + ": " + st.error().message);
      continue;
    }
    if (!c.problems.empty()) {
      for (const auto& p : c.problems)
        if (std::find(c.repaired.begin(), c.repaired.end(), p) == c.repaired.end())
          report.errors.push_back("pod " + id + ": " + p);
      report.repaired.push_back(std::move(c));
    }
  }
  return report;
}

}  // namespace sluice
