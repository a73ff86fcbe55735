#include "userspace/agent/kube/workqueue.h"

namespace sluice::kube {

void WorkQueue::addLocked(const std::string& key) {
  if (shutdown_ || dirty_.count(key)) return;
  dirty_.insert(key);
  if (processing_.count(key)) return;  // re-queued by done()
  queue_.push_back(key);
  cv_.notify_one();
}

void WorkQueue::add(const std::string& key) {
  std::lock_guard lock(mu_);
  addLocked(key);
}

void WorkQueue::addAfter(const std::string& key, std::chrono::milliseconds delay) {
  if (delay.count() <= 0) return add(key);
  std::lock_guard lock(mu_);
  if (shutdown_) return;
  auto at = Clock::now() + delay;
  auto it = delayedAt_.find(key);
  if (it != delayedAt_.end()) {
    if (it->second <= at) return;
    for (auto d = delayed_.lower_bound(it->second); d != delayed_.end() && d->first == it->second; ++d)
      if (d->second == key) {
        delayed_.erase(d);
        break;
      }
  }
  delayed_.emplace(at, key);
  delayedAt_[key] = at;
  cv_.notify_all();  // a sleeping get() may need to wake earlier
}

void WorkQueue::promoteDueLocked(Clock::time_point now) {
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    std::string key = delayed_.begin()->second;
    delayed_.erase(delayed_.begin());
    delayedAt_.erase(key);
    addLocked(key);
  }
}

std::optional<std::string> WorkQueue::get() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (shutdown_) return std::nullopt;
    promoteDueLocked(Clock::now());
    if (!queue_.empty()) {
      std::string key = std::move(queue_.front());
      queue_.pop_front();
      dirty_.erase(key);
      processing_.insert(key);
      return key;
    }
    if (delayed_.empty()) cv_.wait(lock);
    else cv_.wait_until(lock, delayed_.begin()->first);
  }
}

void WorkQueue::done(const std::string& key) {
  std::lock_guard lock(mu_);
  processing_.erase(key);
  if (dirty_.count(key) && !shutdown_) {
    queue_.push_back(key);
    cv_.notify_one();
  }
}

void WorkQueue::shutdown() {
  std::lock_guard lock(mu_);
  shutdown_ = true;
  cv_.notify_all();
}

size_t WorkQueue::size() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

size_t WorkQueue::pending() const {
  std::lock_guard lock(mu_);
  std::set<std::string> all(dirty_);
  all.insert(processing_.begin(), processing_.end());
  for (const auto& [k, at] : delayedAt_) all.insert(k);
  return all.size();
}

}  // namespace sluice::kube
