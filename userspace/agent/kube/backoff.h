// Exponential back-off with jitter, bounded: how the informers and the
// controller space out retries after errors so that a node's agent does not
// hammer an API server that is struggling (and 5,000 agents do not retry in
// lockstep after an outage).
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace sluice::kube {

struct BackoffOptions {
  std::chrono::milliseconds initial{200};
  std::chrono::milliseconds max{30000};
  double factor = 2.0;
  /// Fraction of each delay that is random: the delay is drawn uniformly
  /// from [d * (1 - jitter), d], where d = min(max, initial * factor^n).
  /// 0 = no jitter; clamped to [0, 1].
  double jitter = 0.5;
};

/// The delays of consecutive failures. Not thread-safe (one per retry loop).
class Backoff {
 public:
  explicit Backoff(BackoffOptions options = {}, uint64_t seed = std::random_device{}());

  /// The delay before the next attempt; every call counts one more failure.
  /// Always within [lowerBound(n), upperBound(n)] for the n-th call since the
  /// last reset (n from 0), and never above options.max.
  std::chrono::milliseconds next();
  /// Back to the first delay (after a success).
  void reset() { failures_ = 0; }
  /// Failures counted since the last reset.
  uint32_t failures() const { return failures_; }

  /// d(n) = min(max, initial * factor^n): the largest delay of the n-th failure.
  std::chrono::milliseconds upperBound(uint32_t n) const;
  /// The smallest: d(n) * (1 - jitter).
  std::chrono::milliseconds lowerBound(uint32_t n) const;

 private:
  BackoffOptions options_;
  std::mt19937_64 rng_;
  uint32_t failures_ = 0;
};

}  // namespace sluice::kube
