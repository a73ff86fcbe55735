#include "test/standin/node_proxy.h"

#include <pthread.h>
#include <sys/stat.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "base/fd.h"
#include "userspace/agent/zds/client.h"

namespace sluice {

namespace {

/// A pod as ztunnel tells them apart: by the (st_dev, st_ino) of its netns.
using NetnsId = std::pair<dev_t, ino_t>;

struct Pod {
  zds::WorkloadInfo workload;
  Fd netns;  ///< kept for retries
  NetnsId netnsId{};
  std::unique_ptr<ProxyStandIn> proxy;  ///< null: failed to start, pending retry
};

}  // namespace

StandInConfig NodeProxyConfig::defaultProxyConfig() {
  StandInConfig c;
  c.detectIpv6 = true;
  c.backlog = 128;
  return c;
}

struct NodeProxyStandIn::State {
  explicit State(NodeProxyConfig c) : config(std::move(c)) {}

  NodeProxyConfig config;

  std::mutex mu;  ///< pods and the snapshot bookkeeping
  std::map<std::string, Pod> pods;
  /// Uids named (Add/Keep) by the snapshot being received.
  std::set<std::string> snapshotNames;

  mutable std::mutex eventsMu;
  mutable std::condition_variable eventsCv;
  std::vector<NodeProxyEvent> events;

  std::unique_ptr<zds::Client> client;
  std::thread retry;
  std::condition_variable retryCv;  ///< with mu
  bool stopping = false;
  std::mutex stopMutex;

  void record(NodeProxyEvent e);
  std::string handle(zds::ClientRequest& r);
  void onClientEvent(const zds::ClientEvent& e);
  /// Starts pod's proxy inside its netns (mu held).
  Status startProxy(Pod& pod);
  /// Stops and forgets a pod (mu held).
  void removePod(std::map<std::string, Pod>::iterator it, const std::string& why);
  void retryLoop();
};

void NodeProxyStandIn::State::record(NodeProxyEvent e) {
  if (e.type != "connection") {
    spdlog::info("standin: {} conn={} uid={} pod={}/{} {}", e.type, e.connection, e.uid, e.ns, e.name, e.detail);
  }
  {
    std::lock_guard lock(eventsMu);
    events.push_back(e);
  }
  eventsCv.notify_all();
  if (config.onEvent) config.onEvent(e);
}

Status NodeProxyStandIn::State::startProxy(Pod& pod) {
  StandInConfig c = config.proxy;
  c.netnsPath.clear();
  c.netnsFd = pod.netns.get();
  std::string uid = pod.workload.uid, name = pod.workload.name, ns = pod.workload.ns;
  c.onEvent = [this, uid, name, ns](const ProxyEvent& ev) {
    NodeProxyEvent e;
    e.type = "connection";
    e.uid = uid;
    e.name = name;
    e.ns = ns;
    e.proxy = ev;
    record(std::move(e));
  };
  auto proxy = ProxyStandIn::start(c);
  if (!proxy) return proxy.error();
  pod.proxy = std::move(*proxy);
  return {};
}

void NodeProxyStandIn::State::removePod(std::map<std::string, Pod>::iterator it, const std::string& why) {
  Pod& pod = it->second;
  bool wasRunning = pod.proxy != nullptr;
  // Closes the pod's listeners (and open relays) now.
  pod.proxy.reset();
  if (wasRunning) record({"proxy-stopped", 0, pod.workload.uid, pod.workload.name, pod.workload.ns, why, {}});
  pods.erase(it);
}

std::string NodeProxyStandIn::State::handle(zds::ClientRequest& r) {
  const zds::WorkloadInfo& w = r.request.workload;
  NodeProxyEvent ev;
  ev.type = zds::requestTypeName(r.request.type);
  if (r.request.type == zds::RequestType::SnapshotSent) ev.type = "snapshot";
  ev.connection = r.connection;
  ev.uid = w.uid;
  ev.name = w.name;
  ev.ns = w.ns;

  std::lock_guard lock(mu);
  switch (r.request.type) {
    case zds::RequestType::Add: {
      if (!r.afterSnapshot) snapshotNames.insert(w.uid);
      struct stat st {};
      if (::fstat(r.netns.get(), &st) != 0) {
        ev.detail = std::string("failure to start proxy : fstat of the netns fd: ") + std::strerror(errno);
        break;
      }
      NetnsId id{st.st_dev, st.st_ino};
      auto it = pods.find(w.uid);
      if (it != pods.end()) {
        if (it->second.netnsId == id && it->second.proxy) {
          ev.detail = "";  // the same pod again: nothing to do
          break;
        }
        if (it->second.netnsId != id) {
          // The sandbox was re-created: the old namespace's proxy goes.
          removePod(it, "netns changed");
        } else {
          pods.erase(it);  // pending in this very netns: start over below
        }
      }
      Pod pod;
      pod.workload = w;
      pod.netns = std::move(r.netns);
      pod.netnsId = id;
      Status started = startProxy(pod);
      if (started) {
        record({"proxy-started", 0, w.uid, w.name, w.ns, "", {}});
      } else {
        ev.detail = "failure to start proxy : " + started.error().message;
        record({"proxy-start-failed", 0, w.uid, w.name, w.ns, started.error().message, {}});
        retryCv.notify_all();
      }
      pods.emplace(w.uid, std::move(pod));
      break;
    }
    case zds::RequestType::Keep:
      snapshotNames.insert(w.uid);
      break;
    case zds::RequestType::Del: {
      auto it = pods.find(w.uid);
      if (!r.afterSnapshot) {
        // Before SnapshotSent, a Del takes the uid out of the snapshot (its
        // proxy then stops at SnapshotSent) and cancels a pending retry.
        snapshotNames.erase(w.uid);
        if (it != pods.end() && !it->second.proxy) pods.erase(it);
        break;
      }
      if (it != pods.end()) removePod(it, "deleted");
      break;
    }
    case zds::RequestType::SnapshotSent: {
      size_t stopped = 0;
      for (auto it = pods.begin(); it != pods.end();) {
        auto next = std::next(it);
        if (!snapshotNames.count(it->first)) {
          removePod(it, "not in the snapshot");
          stopped++;
        }
        it = next;
      }
      snapshotNames.clear();
      record({"snapshot", r.connection, "", "", "", "stopped " + std::to_string(stopped) + " proxies not in the snapshot", {}});
      return "";
    }
  }
  record(ev);
  return ev.detail;
}

void NodeProxyStandIn::State::onClientEvent(const zds::ClientEvent& e) {
  if (e.kind == zds::ClientEvent::Kind::Connected) {
    // A new connection brings a new snapshot; ztunnel forgets what it had
    // queued for retry (the snapshot names those pods again).
    std::lock_guard lock(mu);
    snapshotNames.clear();
    for (auto it = pods.begin(); it != pods.end();) {
      it = it->second.proxy ? std::next(it) : pods.erase(it);
    }
  }
  record({zds::clientEventName(e.kind), e.connection, "", "", "", e.detail, {}});
}

void NodeProxyStandIn::State::retryLoop() {
  ::pthread_setname_np(::pthread_self(), "standin-retry");
  std::unique_lock lock(mu);
  for (;;) {
    retryCv.wait(lock, [&] {
      return stopping || std::any_of(pods.begin(), pods.end(), [](const auto& p) { return !p.second.proxy; });
    });
    if (stopping) return;
    if (retryCv.wait_for(lock, config.retryInterval, [&] { return stopping; })) return;
    for (auto& [uid, pod] : pods) {
      if (pod.proxy) continue;
      Status started = startProxy(pod);
      const auto& w = pod.workload;
      if (started) {
        record({"proxy-started", 0, uid, w.name, w.ns, "retry", {}});
      } else {
        record({"proxy-start-failed", 0, uid, w.name, w.ns, started.error().message, {}});
      }
    }
  }
}

NodeProxyStandIn::NodeProxyStandIn(std::unique_ptr<State> state) : state_(std::move(state)) {}

NodeProxyStandIn::~NodeProxyStandIn() { stop(); }

Result<std::unique_ptr<NodeProxyStandIn>> NodeProxyStandIn::start(NodeProxyConfig config) {
  if (config.retryInterval.count() <= 0) return Error::msg("retry interval must be positive", EINVAL);
  auto state = std::make_unique<State>(std::move(config));
  State* st = state.get();
  zds::ClientOptions opts;
  opts.socketPath = st->config.zdsPath;
  opts.initialBackoff = st->config.initialBackoff;
  opts.maxBackoff = st->config.maxBackoff;
  opts.handler = [st](zds::ClientRequest& r) { return st->handle(r); };
  opts.onEvent = [st](const zds::ClientEvent& e) { st->onClientEvent(e); };
  st->retry = std::thread([st] { st->retryLoop(); });
  auto client = zds::Client::start(std::move(opts));
  if (!client) {
    {
      std::lock_guard lock(st->mu);
      st->stopping = true;
    }
    st->retryCv.notify_all();
    st->retry.join();
    return client.error();
  }
  st->client = std::move(*client);
  return std::unique_ptr<NodeProxyStandIn>(new NodeProxyStandIn(std::move(state)));
}

void NodeProxyStandIn::stop() {
  State& s = *state_;
  std::lock_guard stopLock(s.stopMutex);
  if (!s.retry.joinable()) return;
  s.client->stop();
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
  }
  s.retryCv.notify_all();
  s.retry.join();
  std::lock_guard lock(s.mu);
  while (!s.pods.empty()) s.removePod(s.pods.begin(), "stand-in stopping");
}

std::vector<NodeProxyEvent> NodeProxyStandIn::events() const {
  std::lock_guard lock(state_->eventsMu);
  return state_->events;
}

bool NodeProxyStandIn::waitFor(const std::function<bool(const NodeProxyEvent&)>& match,
                               std::chrono::milliseconds timeout) const {
  std::unique_lock lock(state_->eventsMu);
  return state_->eventsCv.wait_for(lock, timeout, [&] {
    return std::any_of(state_->events.begin(), state_->events.end(), match);
  });
}

bool NodeProxyStandIn::waitForEvent(const std::string& type, const std::string& uid,
                                    std::chrono::milliseconds timeout) const {
  return waitFor([&](const NodeProxyEvent& e) { return e.type == type && (uid.empty() || e.uid == uid); }, timeout);
}

void NodeProxyStandIn::clearEvents() {
  std::lock_guard lock(state_->eventsMu);
  state_->events.clear();
}

size_t NodeProxyStandIn::relayed(const std::string& uid, const std::string& listener) const {
  size_t n = 0;
  for (const auto& e : events())
    if (e.type == "connection" && e.uid == uid && e.proxy.listener == listener && e.proxy.detail == "upstream ok") n++;
  return n;
}

std::vector<std::string> NodeProxyStandIn::runningPods() const {
  std::lock_guard lock(state_->mu);
  std::vector<std::string> out;
  for (const auto& [uid, pod] : state_->pods)
    if (pod.proxy) out.push_back(uid);
  return out;
}

std::vector<std::string> NodeProxyStandIn::pendingPods() const {
  std::lock_guard lock(state_->mu);
  std::vector<std::string> out;
  for (const auto& [uid, pod] : state_->pods)
    if (!pod.proxy) out.push_back(uid);
  return out;
}

bool NodeProxyStandIn::connected() const { return state_->client && state_->client->connected(); }

}  // namespace sluice
