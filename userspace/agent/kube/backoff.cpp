#include "userspace/agent/kube/backoff.h"

#include <algorithm>
#include <cmath>

namespace sluice::kube {

Backoff::Backoff(BackoffOptions options, uint64_t seed) : options_(options), rng_(seed) {
  options_.jitter = std::clamp(options_.jitter, 0.0, 1.0);
  if (options_.factor < 1.0) options_.factor = 1.0;
  if (options_.initial.count() < 0) options_.initial = std::chrono::milliseconds(0);
  if (options_.max < options_.initial) options_.max = options_.initial;
}

std::chrono::milliseconds Backoff::upperBound(uint32_t n) const {
  double d = static_cast<double>(options_.initial.count()) * std::pow(options_.factor, static_cast<double>(n));
  double cap = static_cast<double>(options_.max.count());
  return std::chrono::milliseconds(static_cast<int64_t>(std::min(d, cap)));  // pow's inf clamps too
}

std::chrono::milliseconds Backoff::lowerBound(uint32_t n) const {
  auto up = static_cast<double>(upperBound(n).count());
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(up * (1.0 - options_.jitter))));
}

std::chrono::milliseconds Backoff::next() {
  uint32_t n = failures_;
  if (failures_ < UINT32_MAX) ++failures_;
  auto lo = lowerBound(n).count(), hi = upperBound(n).count();
  if (hi <= lo) return std::chrono::milliseconds(hi);
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  return std::chrono::milliseconds(dist(rng_));
}

}  // namespace sluice::kube
