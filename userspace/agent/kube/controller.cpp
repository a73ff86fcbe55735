#include "userspace/agent/kube/controller.h"

#include <spdlog/spdlog.h>

#include <cstring>

namespace sluice::kube {

using Clock = std::chrono::steady_clock;

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

std::string describe(const PodSettings& s) {
  return std::string("dns-capture=") + (s.dnsCapture ? "on" : "off") + " inbound-capture=" +
         (s.inboundCapture ? "on" : "off") + (s.rerouteIfaces.empty() ? "" : " reroute=" + join(s.rerouteIfaces));
}

const char* annotationValue(EnrollOutcome o) { return o == EnrollOutcome::Enabled ? kRedirectionEnabled : kRedirectionPending; }

// A static pod's mirror in the API has its own UID; the runtime passes the
// static pod's, which kubelet records in this annotation of the mirror.
constexpr const char* kMirrorAnnotation = "kubernetes.io/config.mirror";

bool isPodWithUid(const Pod& pod, const std::string& uid) {
  if (pod.uid == uid) return true;
  auto it = pod.annotations.find(kMirrorAnnotation);
  return it != pod.annotations.end() && it->second == uid;
}

}  // namespace

PodRef podRef(const Pod& pod) { return {pod.uid, pod.name, pod.namespaceName, pod.serviceAccount, pod.ips}; }

Result<std::unique_ptr<Controller>> Controller::create(Client& client, ControllerOptions options,
                                                       DataplaneCallbacks callbacks) {
  if (options.nodeName.empty())
    return Error::msg("Kubernetes controller: no node name (--node-name, or NODE_NAME from the downward API)", EINVAL);
  if (!callbacks.enroll || !callbacks.updateSettings || !callbacks.unenroll || !callbacks.listEnrolled)
    return Error::msg("Kubernetes controller: enroll, updateSettings, unenroll and listEnrolled must all be set", EINVAL);
  if (options.workers < 1) options.workers = 1;
  return std::unique_ptr<Controller>(new Controller(client, std::move(options), std::move(callbacks)));
}

Controller::Controller(Client& client, ControllerOptions options, DataplaneCallbacks callbacks)
    : client_(client), options_(std::move(options)), callbacks_(std::move(callbacks)), finder_(options_.procRoot) {
  InformerOptions po;
  po.path = podsPath();
  po.fieldSelector = "spec.nodeName=" + options_.nodeName;
  po.name = "pods on " + options_.nodeName;
  po.watchTimeout = options_.watchTimeout;
  po.stallTimeout = options_.stallTimeout;
  po.backoff = options_.informerBackoff;
  InformerOptions no = po;
  no.path = namespacesPath();
  no.fieldSelector.clear();
  no.name = "namespaces";

  auto podChanged = [this](const Pod& p) {
    queue_.add(p.uid);
    notifyCache();
  };
  pods_ = std::make_unique<Informer<Pod>>(
      client_, po,
      InformerHandlers<Pod>{podChanged, [podChanged](const Pod&, const Pod& p) { podChanged(p); }, podChanged,
                            [this] { notifyCache(); }});
  auto nsChanged = [this](const Namespace& n) {
    enqueueNamespace(n.name);
    notifyCache();
  };
  namespaces_ = std::make_unique<Informer<Namespace>>(
      client_, no,
      InformerHandlers<Namespace>{
          nsChanged,
          [this, nsChanged](const Namespace& old, const Namespace& n) {
            if (namespaceSelected(old.labels, options_.rules) != namespaceSelected(n.labels, options_.rules))
              spdlog::info("kube: namespace {} is {} the ambient mesh", n.name,
                           namespaceSelected(n.labels, options_.rules) ? "now in" : "no longer in");
            nsChanged(n);
          },
          nsChanged, [this] { notifyCache(); }});
}

Controller::~Controller() { stop(); }

void Controller::start() {
  if (started_) return;
  started_ = true;
  pods_->start();
  namespaces_->start();
  startThread_ = std::jthread([this](std::stop_token st) { startup(st); });
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { worker(); });
}

void Controller::stop() {
  if (!started_) return;
  started_ = false;
  stopSource_.request_stop();
  if (startThread_.joinable()) {
    startThread_.request_stop();
    startThread_.join();
  }
  queue_.shutdown();
  cv_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
  pods_->stop();
  namespaces_->stop();
}

bool Controller::waitReady(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return ready_; });
}

void Controller::notifyCache() {
  {
    std::lock_guard lock(mu_);
    ++cacheGeneration_;
  }
  cv_.notify_all();
}

void Controller::enqueueNamespace(const std::string& ns) {
  for (const auto& p : pods_->list([&](const Pod& p) { return p.namespaceName == ns; })) queue_.add(p.uid);
}

void Controller::loadRegistry() {
  auto registry = callbacks_.listEnrolled();
  std::lock_guard lock(mu_);
  std::map<std::string, State> fresh;
  for (const auto& e : registry) {
    if (e.uid.empty()) continue;  // enrolled by hand: not ours to manage
    State s;
    s.settings = e.settings;
    if (auto it = enrolled_.find(e.uid); it != enrolled_.end()) s.outcome = it->second.outcome;
    fresh[e.uid] = s;
  }
  enrolled_ = std::move(fresh);
}

void Controller::startup(std::stop_token stop) {
  while (!stop.stop_requested() && !(pods_->synced() && namespaces_->synced())) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(10), [&] { return pods_->synced() && namespaces_->synced(); });
  }
  if (stop.stop_requested()) return;
  loadRegistry();
  std::vector<std::string> keys;
  size_t registered;
  {
    std::lock_guard lock(mu_);
    for (const auto& [uid, s] : enrolled_) keys.push_back(uid);
    registered = keys.size();
    counters_.synced = true;
  }
  auto pods = pods_->list();
  for (const auto& p : pods) keys.push_back(p.uid);
  spdlog::info("kube: caches synced ({} pods on {}, {} namespaces); reconciling them with {} enrolled pods",
               pods.size(), options_.nodeName, namespaces_->size(), registered);
  for (const auto& k : keys) queue_.add(k);
  {
    std::lock_guard lock(mu_);
    ready_ = true;
    counters_.reconciled = true;
  }
  cv_.notify_all();
}

void Controller::worker() {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return ready_ || stopSource_.stop_requested(); });
  }
  while (auto key = queue_.get()) {
    bool ok = key->rfind(kStatusKeyPrefix, 0) == 0 ? reconcileStatus(key->substr(std::strlen(kStatusKeyPrefix)))
                                                   : reconcile(*key);
    std::chrono::milliseconds delay{0};
    {
      std::lock_guard lock(mu_);
      ++counters_.reconciles;
      if (ok) {
        retries_.erase(*key);
      } else {
        auto it = retries_.try_emplace(*key, options_.retry).first;
        delay = it->second.next();
      }
    }
    queue_.done(*key);
    if (!ok && !stopSource_.stop_requested()) queue_.addAfter(*key, delay);
  }
}

void Controller::retryWarn(const std::string& key, const std::string& message) {
  // mu_ is held. The first failure of a run and every 20th after it are
  // warnings; the retries between them (every 5 s at most) are debug lines.
  auto it = retries_.find(key);
  uint32_t failures = it == retries_.end() ? 0 : it->second.failures();
  if (failures % 20 == 0) spdlog::warn("{}", message);
  else spdlog::debug("{} (attempt {})", message, failures + 1);
}

Result<NetnsLocation> Controller::locateNetns(const Pod& pod) {
  std::lock_guard lock(scanMu_);
  // One pass over /proc serves every pod looked up shortly after (a
  // namespace labelled at once enrolls all its pods from one scan); a miss
  // on an older scan scans again.
  bool fresh = false;
  auto now = Clock::now();
  if (!scan_ || now - scanAt_ > options_.scanMaxAge) {
    auto s = finder_.scan();
    if (!s) return s.error();
    scan_ = std::move(*s);
    scanAt_ = now;
    fresh = true;
  }
  auto loc = finder_.locate(*scan_, pod.uid, pod.ips);
  if (!loc && !fresh) {
    auto s = finder_.scan();
    if (!s) return s.error();
    scan_ = std::move(*s);
    scanAt_ = Clock::now();
    loc = finder_.locate(*scan_, pod.uid, pod.ips);
  }
  return loc;
}

// An enrolled pod the watch no longer has: removed, unless it only was not
// seen yet or the node's pod list is empty (a wrong node name).
bool Controller::reconcileGone(const std::string& uid) {
  {
    // Enrolled by the CNI path from a direct GET while the watch had not
    // delivered the pod: not gone, only not seen yet. Kept for a while
    // (the sweep's resync looks again); gone if the watch never shows it.
    std::lock_guard lock(mu_);
    auto it = unwatched_.find(uid);
    if (it != unwatched_.end() && std::chrono::steady_clock::now() - it->second < kUnwatchedGrace) {
      spdlog::debug("kube: pod {}: enrolled from the API server, not in the watch cache yet; kept", uid);
      return true;
    }
    if (it != unwatched_.end()) unwatched_.erase(it);
  }
  if (pods_->size() == 0) {
    // The agent's own pod runs on this node: an empty list is a wrong
    // node name (or a cluster without this node), not a node whose pods
    // all went away. Removing every pod on that evidence would be wrong.
    std::lock_guard lock(mu_);
    if (!warnedEmptyNode_)
      spdlog::warn("kube: no pod at all is on node {} (the agent's own should be): check --node-name; enrolled pods "
                   "are kept",
                   options_.nodeName);
    warnedEmptyNode_ = true;
    return true;
  }
  auto s = callbacks_.unenroll(uid);
  std::lock_guard lock(mu_);
  if (!s) {
    ++counters_.unenrollFailures;
    retryWarn(uid, fmt::format("kube: pod {} is gone; removing it failed (will retry): {}", uid, s.error().message));
    return false;
  }
  ++counters_.unenrolls;
  enrolled_.erase(uid);
  spdlog::info("kube: removed pod {}: it is gone from the API", uid);
  return true;
}

bool Controller::reconcile(const std::string& uid) {
  std::optional<State> state;
  {
    std::lock_guard lock(mu_);
    if (auto it = enrolled_.find(uid); it != enrolled_.end()) state = it->second;
  }
  auto pod = pods_->get(uid);
  if (!pod) return state ? reconcileGone(uid) : true;

  {
    std::lock_guard lock(mu_);
    unwatched_.erase(uid);
  }
  auto ns = namespaces_->get(pod->namespaceName);
  if (!ns) {
    // Its namespace's event has not arrived yet; that event requeues it.
    spdlog::debug("kube: pod {}: namespace not in the cache yet", pod->fullName());
    return true;
  }
  Decision d = decide(*pod, ns->labels, options_.rules);
  bool ok = true;
  if (d.enroll) {
    if (!state && pod->terminating) {
      // Being deleted: its sandbox goes away (the CNI DEL may already have
      // removed it); never enrolled live now.
      spdlog::debug("kube: pod {}: selected but terminating; not enrolled", pod->fullName());
      queueStatus(*pod, state);
      return true;
    }
    if (!state || state->outcome == EnrollOutcome::Pending) {
      if (pod->ips.empty()) {
        // The kubelet reports the IP after the sandbox (and the CNI ADD) is
        // done; its update requeues the pod.
        spdlog::debug("kube: pod {}: selected, no IP yet", pod->fullName());
        queueStatus(*pod, state);
        return true;
      }
      auto loc = locateNetns(*pod);
      if (!loc) {
        // Not captured here (after a reboot the pod may still say
        // "enabled" from before): the annotation must not claim it is.
        queueStatus(*pod, state);
        std::lock_guard lock(mu_);
        ++counters_.netnsNotFound;
        retryWarn(uid, fmt::format("kube: pod {} is selected ({}) but its network namespace was not found (will retry): {}",
                                   pod->fullName(), d.reason, loc.error().message));
        return false;
      }
      for (const auto& w : d.warnings) spdlog::warn("kube: {}", w);
      auto r = callbacks_.enroll(podRef(*pod), d.settings, *loc);
      std::lock_guard lock(mu_);
      if (!r) {
        ++counters_.enrollFailures;
        retryWarn(uid, fmt::format("kube: enrolling pod {} failed (will retry): {}", pod->fullName(), r.error().message));
        return false;
      }
      ++counters_.enrolls;
      state = State{d.settings, *r};
      enrolled_[uid] = *state;
      spdlog::info("kube: enrolled running pod {} ({}; {}; netns {}){}", pod->fullName(), d.reason,
                   describe(d.settings), loc->path, *r == EnrollOutcome::Pending ? ", hand-off pending" : "");
      if (*r == EnrollOutcome::Pending) ok = false;  // enroll again later for the hand-off
    } else if (state->settings != d.settings) {
      for (const auto& w : d.warnings) spdlog::warn("kube: {}", w);
      auto s = callbacks_.updateSettings(podRef(*pod), d.settings);
      std::lock_guard lock(mu_);
      if (!s) {
        ++counters_.updateFailures;
        // Not in the registry any more (removed behind the controller's
        // back, the sweep): forget it, the retry enrolls it again.
        if (s.error().code == ENOENT) enrolled_.erase(uid);
        retryWarn(uid, fmt::format("kube: new settings for pod {} failed (will retry): {}", pod->fullName(), s.error().message));
        return false;
      }
      ++counters_.updates;
      spdlog::info("kube: pod {}: settings now {} (were {})", pod->fullName(), describe(d.settings),
                   describe(state->settings));
      state->settings = d.settings;
      enrolled_[uid] = *state;
    }
  } else if (state) {
    auto s = callbacks_.unenroll(uid);
    std::lock_guard lock(mu_);
    if (!s) {
      ++counters_.unenrollFailures;
      retryWarn(uid, fmt::format("kube: removing pod {} ({}) failed (will retry): {}", pod->fullName(), d.reason,
                                 s.error().message));
      return false;
    }
    ++counters_.unenrolls;
    enrolled_.erase(uid);
    state.reset();
    spdlog::info("kube: removed pod {}: {}", pod->fullName(), d.reason);
  }
  queueStatus(*pod, state);
  return ok;
}

std::optional<std::string> Controller::wantedAnnotation(const Pod& pod, const std::optional<State>& state) const {
  std::optional<std::string> want;
  if (state) want = annotationValue(state->outcome);
  std::optional<std::string> have;
  if (auto it = pod.annotations.find(kRedirectionAnnotation); it != pod.annotations.end()) have = it->second;
  if (want == have) return std::nullopt;
  // Not enrolled: remove only the values a node agent writes.
  if (!want && *have != kRedirectionEnabled && *have != kRedirectionPending) return std::nullopt;
  return want.value_or("");
}

void Controller::queueStatus(const Pod& pod, const std::optional<State>& state) {
  // The status patch is a separate item behind the dataplane work already
  // queued: a namespace labelled at once gets all its pods enrolled first,
  // then annotated, instead of every enrollment waiting for an API call.
  if (options_.annotateStatus && wantedAnnotation(pod, state)) queue_.add(kStatusKeyPrefix + pod.uid);
}

bool Controller::reconcileStatus(const std::string& uid) {
  auto pod = pods_->get(uid);
  if (!pod) {
    std::lock_guard lock(mu_);
    lastPatch_.erase(uid);
    return true;
  }
  std::optional<State> state;
  {
    std::lock_guard lock(mu_);
    if (auto it = enrolled_.find(uid); it != enrolled_.end()) state = it->second;
  }
  return reconcileAnnotation(*pod, state);
}

bool Controller::reconcileAnnotation(const Pod& pod, const std::optional<State>& state) {
  if (!options_.annotateStatus) return true;
  auto wanted = wantedAnnotation(pod, state);
  if (!wanted) return true;
  std::optional<std::string> want;
  if (!wanted->empty()) want = *wanted;
  {
    // Already sent for this version of the pod: its watch event is on the way.
    std::lock_guard lock(mu_);
    auto it = lastPatch_.find(pod.uid);
    if (it != lastPatch_.end() && it->second.first == pod.resourceVersion && it->second.second == want) return true;
  }
  auto r = client_.mergePatch(podStatusPath(pod.namespaceName, pod.name), redirectionPatch(want), stopSource_.get_token());
  std::lock_guard lock(mu_);
  if (!r) {
    if (isNotFound(r.error())) return true;  // deleted meanwhile
    ++counters_.patchFailures;
    retryWarn(kStatusKeyPrefix + pod.uid,
              fmt::format("kube: pod {}: status annotation not updated (will retry): {}", pod.fullName(), r.error().message));
    return false;
  }
  ++counters_.patches;
  lastPatch_[pod.uid] = {pod.resourceVersion, want};
  spdlog::debug("kube: pod {}: {} {}", pod.fullName(), kRedirectionAnnotation, want.value_or("removed"));
  return true;
}

Result<PodAnswer> Controller::podDecision(const PodQuery& q, std::stop_token stop) {
  const std::string who = q.namespaceName + "/" + q.name + (q.uid.empty() ? "" : " (uid " + q.uid + ")");
  auto fromCache = [&]() -> std::optional<Result<PodAnswer>> {
    if (!pods_->synced() || !namespaces_->synced()) return std::nullopt;
    std::optional<Pod> pod;
    if (!q.uid.empty()) {
      pod = pods_->get(q.uid);
      if (pod && (pod->namespaceName != q.namespaceName || pod->name != q.name))
        return Result<PodAnswer>(Error::msg("pod " + who + ": that UID belongs to pod " + pod->fullName(), EINVAL));
      if (!pod) {
        auto found = pods_->list([&](const Pod& p) {
          return p.namespaceName == q.namespaceName && p.name == q.name && isPodWithUid(p, q.uid);
        });
        if (found.size() == 1) pod = found.front();
      }
    } else {
      auto found = pods_->list([&](const Pod& p) { return p.namespaceName == q.namespaceName && p.name == q.name; });
      if (found.size() == 1) pod = found.front();
    }
    if (!pod) return std::nullopt;
    auto ns = namespaces_->get(pod->namespaceName);
    if (!ns) return std::nullopt;
    Decision d = decide(*pod, ns->labels, options_.rules);
    return Result<PodAnswer>(PodAnswer{d.enroll, d.reason, podRef(*pod), d.settings, d.warnings, true});
  };

  auto deadline = Clock::now() + options_.cniWait;
  for (;;) {
    uint64_t gen;
    {
      std::lock_guard lock(mu_);
      gen = cacheGeneration_;
    }
    if (auto a = fromCache()) return std::move(*a);
    if (stop.stop_requested() || stopSource_.stop_requested()) return Error::msg("pod " + who + ": cancelled", ECANCELED);
    std::unique_lock lock(mu_);
    // Woken by every informer event; gives up at the deadline.
    if (!cv_.wait_until(lock, deadline, [&] { return cacheGeneration_ != gen || stopSource_.stop_requested(); })) break;
  }
  auto a = answerFromApi(q, stop);
  if (!a) {
    Error e = a.error();
    e.message = "pod " + who + ": not in the watch cache after " + std::to_string(options_.cniWait.count()) + " ms; " +
                e.message;
    return e;
  }
  return a;
}

Result<PodAnswer> Controller::answerFromApi(const PodQuery& q, std::stop_token stop) {
  {
    std::lock_guard lock(mu_);
    ++counters_.directLookups;
  }
  auto pj = client_.get(podPath(q.namespaceName, q.name), stop);
  if (!pj) return pj.error();
  auto pod = Pod::fromJson(*pj);
  if (!pod) return pod.error();
  if (!q.uid.empty() && !isPodWithUid(*pod, q.uid))
    return Error::msg("pod " + q.namespaceName + "/" + q.name + " has UID " + pod->uid + ", not " + q.uid +
                          " (deleted and created again?)",
                      ESTALE);
  {
    // It exists: until the watch shows it, its absence from the cache does
    // not mean it was deleted (reconcile).
    std::lock_guard lock(mu_);
    auto now = std::chrono::steady_clock::now();
    std::erase_if(unwatched_, [&](const auto& e) { return now - e.second >= kUnwatchedGrace; });
    unwatched_[pod->uid] = now;
  }
  if (pod->nodeName != options_.nodeName)
    spdlog::warn("kube: pod {} is on node \"{}\" but this agent watches node \"{}\": check --node-name", pod->fullName(),
                 pod->nodeName, options_.nodeName);
  std::map<std::string, std::string> nsLabels;
  if (auto ns = namespaces_->get(pod->namespaceName)) {
    nsLabels = ns->labels;
  } else {
    auto nj = client_.get(namespacePath(pod->namespaceName), stop);
    if (!nj) return nj.error();
    auto parsed = Namespace::fromJson(*nj);
    if (!parsed) return parsed.error();
    nsLabels = parsed->labels;
  }
  Decision d = decide(*pod, nsLabels, options_.rules);
  return PodAnswer{d.enroll, d.reason, podRef(*pod), d.settings, d.warnings, false};
}

void Controller::enrolled(const std::string& uid, const PodSettings& settings, EnrollOutcome outcome) {
  if (uid.empty()) return;
  {
    std::lock_guard lock(mu_);
    enrolled_[uid] = State{settings, outcome};
  }
  queue_.add(uid);
}

void Controller::removed(const std::string& uid) {
  if (uid.empty()) return;
  {
    std::lock_guard lock(mu_);
    enrolled_.erase(uid);
  }
  queue_.add(uid);
}

void Controller::resync() {
  {
    std::lock_guard lock(mu_);
    if (!ready_) return;  // the start-up reconciliation reads the registry itself
  }
  loadRegistry();
  std::vector<std::string> keys;
  {
    std::lock_guard lock(mu_);
    for (const auto& [uid, s] : enrolled_) keys.push_back(uid);
  }
  for (const auto& p : pods_->list()) keys.push_back(p.uid);
  for (const auto& k : keys) queue_.add(k);
}

ControllerStats Controller::stats() const {
  ControllerStats s;
  {
    std::lock_guard lock(mu_);
    s = counters_;
    s.enrolled = enrolled_.size();
  }
  s.queued = queue_.pending();
  s.pods = pods_->stats();
  s.namespaces = namespaces_->stats();
  return s;
}

}  // namespace sluice::kube
