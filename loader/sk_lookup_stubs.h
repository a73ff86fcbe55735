// The pods' own sk_lookup programs ("stubs"). The kernel does not tell an
// sk_lookup program its network namespace, so each socket-mode pod's netns
// runs a tiny program of its own that names the pod and tail-calls the
// shared one (slot 0 of sk_lookup_prog). A stub reads its pod's netns
// cookie from a one-entry array of its own — read-only to programs, and
// frozen once written, so nothing can later make a linked stub speak for
// another pod — and passes it on through the per-CPU sk_lookup_pod scratch.
// A stub whose cookie is still 0 drops every lookup (fail closed).
//
// Loading a program costs ~0.5 ms (the BPF_PROG_LOAD; its JIT image, not
// the verifier), the bulk of a socket-mode enrollment. A long-running
// process that enrolls pods (the agent) keeps a few stubs loaded ahead,
// refilled by a background thread, so an enrollment only writes and
// freezes the cookie (SkLookupStubPool). Stubs are single-use: a removed
// pod's stub goes with its link.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "base/fd.h"
#include "base/result.h"

namespace sluice {

/// The name of a stub's program and of its cookie array (bpftool shows it).
inline constexpr const char* kSkLookupStubName = "sluice_pod_lk";

/// A loaded stub: the program and its cookie array.
struct SkLookupStub {
  Fd prog;
  Fd cookie;
};

/// Loads a stub for the scratch map @p scratchFd (sk_lookup_pod) and the
/// program array @p progsFd (sk_lookup_prog); its cookie is 0.
Result<SkLookupStub> loadSkLookupStub(int scratchFd, int progsFd);

/// Writes @p netnsCookie into @p stub's array and freezes it.
Status nameSkLookupStub(const SkLookupStub& stub, uint64_t netnsCookie);

/// Stubs loaded ahead by a background thread, up to a depth.
class SkLookupStubPool {
 public:
  /// Duplicates the two map descriptors (the pool outlives no one's fds)
  /// and starts filling up to @p depth stubs.
  static Result<std::unique_ptr<SkLookupStubPool>> start(int scratchFd, int progsFd, size_t depth);
  ~SkLookupStubPool();  ///< stops the thread (waits for one load at most)
  SkLookupStubPool(const SkLookupStubPool&) = delete;
  SkLookupStubPool& operator=(const SkLookupStubPool&) = delete;

  /// A stub naming @p netnsCookie: one loaded ahead when ready (the pool
  /// is refilled behind it), else one loaded now.
  Result<Fd> take(uint64_t netnsCookie);

  /// How many stubs are ready now.
  size_t ready() const;
  /// How many take() calls were served by a stub loaded ahead / loaded then.
  struct Counts {
    uint64_t ahead = 0;
    uint64_t inline_ = 0;
    uint64_t loadErrors = 0;  ///< background loads that failed (then it waits for the next take)
  };
  Counts counts() const;
  /// Waits until @p n stubs are ready (or the pool stopped refilling after
  /// an error); false on time-out. For tests and benchmarks.
  bool waitReady(size_t n, int timeoutMs) const;

 private:
  SkLookupStubPool(Fd scratch, Fd progs, size_t depth);
  void run();

  Fd scratch_, progs_;
  const size_t depth_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // wakes the thread (take, stop) and waiters (a stub is ready)
  std::deque<SkLookupStub> ready_;
  Counts counts_;
  bool stop_ = false;
  bool paused_ = false;  // a background load failed: wait for the next take before trying again
  std::thread thread_;
};

}  // namespace sluice
