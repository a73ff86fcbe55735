#include "userspace/agent/kube/informer.h"

#include <spdlog/spdlog.h>

namespace sluice::kube {

using Clock = std::chrono::steady_clock;

template <typename T>
Informer<T>::Informer(Client& client, InformerOptions options, InformerHandlers<T> handlers)
    : client_(client),
      options_(std::move(options)),
      handlers_(std::move(handlers)),
      backoff_(options_.backoff),
      rng_(std::random_device{}()) {
  if (options_.name.empty()) options_.name = options_.path;
  if (options_.watchTimeout.count() < 1) options_.watchTimeout = std::chrono::seconds(1);
  if (options_.stallTimeout.count() <= 0)
    options_.stallTimeout = std::chrono::duration_cast<std::chrono::milliseconds>(2 * options_.watchTimeout + std::chrono::seconds(30));
}

template <typename T>
Informer<T>::~Informer() {
  stop();
}

template <typename T>
void Informer<T>::start() {
  if (thread_.joinable()) return;
  thread_ = std::jthread([this](std::stop_token st) { run(st); });
}

template <typename T>
void Informer<T>::stop() {
  if (!thread_.joinable()) return;
  thread_.request_stop();
  cv_.notify_all();
  thread_.join();
}

template <typename T>
bool Informer<T>::synced() const {
  std::lock_guard lock(mu_);
  return synced_;
}

template <typename T>
bool Informer<T>::waitSynced(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return synced_; });
}

template <typename T>
std::optional<T> Informer<T>::get(const std::string& key) const {
  std::lock_guard lock(mu_);
  auto it = cache_.find(key);
  if (it == cache_.end()) return std::nullopt;
  return it->second;
}

template <typename T>
std::vector<T> Informer<T>::list() const {
  return list([](const T&) { return true; });
}

template <typename T>
std::vector<T> Informer<T>::list(const std::function<bool(const T&)>& pred) const {
  std::lock_guard lock(mu_);
  std::vector<T> out;
  for (const auto& [k, v] : cache_)
    if (pred(v)) out.push_back(v);
  return out;
}

template <typename T>
size_t Informer<T>::size() const {
  std::lock_guard lock(mu_);
  return cache_.size();
}

template <typename T>
std::string Informer<T>::resourceVersion() const {
  std::lock_guard lock(mu_);
  return resourceVersion_;
}

template <typename T>
InformerStats Informer<T>::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

template <typename T>
bool Informer<T>::sleepFor(std::chrono::milliseconds d, std::stop_token stop) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, stop, d, [] { return false; });
  return !stop.stop_requested();
}

template <typename T>
void Informer<T>::failed(const Error& e, std::chrono::milliseconds delay) {
  {
    std::lock_guard lock(mu_);
    ++stats_.errors;
    stats_.lastError = e.message;
    stats_.connected = false;
  }
  spdlog::warn("kube: {}: {}; retrying in {} ms", options_.name, e.message, delay.count());
}

template <typename T>
Status Informer<T>::relist(std::stop_token stop) {
  std::map<std::string, T> fresh;
  std::string rv;
  ListOptions lo{.fieldSelector = options_.fieldSelector, .limit = options_.pageSize};
  int restarts = 0;
  for (;;) {
    auto page = client_.list(options_.path, lo, stop);
    if (!page) {
      // The snapshot behind a continue token was compacted between pages:
      // start the list again (a few times at most).
      if (isGone(page.error()) && !lo.continueToken.empty() && ++restarts <= 3) {
        spdlog::info("kube: {}: list expired between pages; listing again", options_.name);
        fresh.clear();
        lo.continueToken.clear();
        continue;
      }
      return page.error();
    }
    for (const auto& item : page->items) {
      auto obj = T::fromJson(item);
      if (!obj) {
        spdlog::warn("kube: {}: skipped an object of the list: {}", options_.name, obj.error().message);
        continue;
      }
      std::string key = obj->key();
      fresh.insert_or_assign(std::move(key), std::move(*obj));
    }
    rv = page->resourceVersion;
    if (page->continueToken.empty()) break;
    lo.continueToken = page->continueToken;
  }

  std::vector<std::pair<std::optional<T>, T>> changes;  // (old, new): added/updated
  std::vector<T> removed;
  bool first;
  {
    std::lock_guard lock(mu_);
    for (const auto& [k, obj] : fresh) {
      auto it = cache_.find(k);
      if (it == cache_.end()) changes.emplace_back(std::nullopt, obj);
      else if (it->second.resourceVersion != obj.resourceVersion) changes.emplace_back(it->second, obj);
    }
    for (const auto& [k, obj] : cache_)
      if (!fresh.count(k)) removed.push_back(obj);
    cache_ = std::move(fresh);
    resourceVersion_ = rv;
    ++stats_.lists;
    first = !synced_;
  }
  spdlog::info("kube: {}: listed at resourceVersion {} ({} added or changed, {} gone)", options_.name, rv,
               changes.size(), removed.size());
  for (auto& [old, cur] : changes) {
    if (old) {
      if (handlers_.updated) handlers_.updated(*old, cur);
    } else if (handlers_.added) {
      handlers_.added(cur);
    }
  }
  for (const auto& last : removed)
    if (handlers_.deleted) handlers_.deleted(last);
  if (first) {
    if (handlers_.synced) handlers_.synced();
    {
      std::lock_guard lock(mu_);
      synced_ = true;  // after the callbacks: synced() means they all ran
    }
    cv_.notify_all();
  }
  return {};
}

template <typename T>
void Informer<T>::run(std::stop_token stop) {
  bool needList = true;
  while (!stop.stop_requested()) {
    if (needList) {
      auto s = relist(stop);
      if (stop.stop_requested()) break;
      if (!s) {
        auto d = backoff_.next();
        failed(s.error(), d);
        if (!sleepFor(d, stop)) break;
        continue;
      }
      needList = false;
      backoff_.reset();
    }

    // timeoutSeconds in [t, 2t).
    auto t = options_.watchTimeout.count();
    std::uniform_int_distribution<int64_t> spread(t, 2 * t - 1 < t ? t : 2 * t - 1);
    WatchOptions wo{.fieldSelector = options_.fieldSelector,
                    .resourceVersion = resourceVersion(),
                    .allowBookmarks = true,
                    .timeout = std::chrono::seconds(spread(rng_)),
                    .stallTimeout = options_.stallTimeout,
                    .onOpen = [this] {
                      std::lock_guard lock(mu_);
                      stats_.connected = true;
                    }};
    bool gone = false;
    uint64_t events = 0;
    std::optional<Error> eventError;
    {
      std::lock_guard lock(mu_);
      ++stats_.watches;
    }
    auto started = Clock::now();
    auto onEvent = [&](WatchEvent&& ev) -> bool {
      if (ev.type == WatchEventType::Error) {
        Error e = statusError(ev.object, "watch " + options_.path + ": ERROR event");
        if (isGone(e)) gone = true;
        else eventError = e;
        return false;
      }
      ++events;
      if (events == 1) backoff_.reset();  // the server is serving again
      std::string rv = resourceVersionOf(ev.object);
      if (ev.type == WatchEventType::Bookmark) {
        std::lock_guard lock(mu_);
        if (!rv.empty()) resourceVersion_ = rv;
        return true;
      }
      auto obj = T::fromJson(ev.object);
      if (!obj) {
        spdlog::warn("kube: {}: skipped a {} event: {}", options_.name, toString(ev.type), obj.error().message);
        std::lock_guard lock(mu_);
        if (!rv.empty()) resourceVersion_ = rv;
        return true;
      }
      std::optional<T> old;
      {
        std::lock_guard lock(mu_);
        if (!rv.empty()) resourceVersion_ = rv;
        auto it = cache_.find(obj->key());
        if (it != cache_.end()) old = std::move(it->second);
        if (ev.type == WatchEventType::Deleted) {
          if (it != cache_.end()) cache_.erase(it);
        } else {
          cache_.insert_or_assign(obj->key(), *obj);
        }
      }
      if (ev.type == WatchEventType::Deleted) {
        if (handlers_.deleted) handlers_.deleted(*obj);
      } else if (old) {
        if (handlers_.updated) handlers_.updated(*old, *obj);
      } else if (handlers_.added) {
        handlers_.added(*obj);
      }
      return true;
    };
    auto r = client_.watch(options_.path, wo, onEvent, stop);
    {
      std::lock_guard lock(mu_);
      stats_.connected = false;
    }
    if (stop.stop_requested()) break;
    if (gone || (!r && isGone(r.error()))) {
      {
        std::lock_guard lock(mu_);
        ++stats_.gone;
      }
      spdlog::info("kube: {}: resourceVersion {} is gone (410); listing again", options_.name, wo.resourceVersion);
      needList = true;
      continue;
    }
    std::optional<Error> err = eventError;
    if (!r) err = r.error();
    if (!err && events == 0 && Clock::now() - started < std::chrono::seconds(1))
      err = Error::msg("watch " + options_.path + ": the stream ended at once", ECONNRESET);
    if (err) {
      auto d = backoff_.next();
      failed(*err, d);
      if (!sleepFor(d, stop)) break;
    }
  }
}

template class Informer<Pod>;
template class Informer<Namespace>;

}  // namespace sluice::kube
