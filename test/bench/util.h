// Small helpers of sluice-bench: clocks and statistics, CPU pinning,
// child processes timed with their peak RSS, throw-away names and files,
// and the stop flag set by SIGINT / SIGTERM.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice::bench {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// Set by SIGINT / SIGTERM: every loop stops early and the RAII owners clean
/// up on the way out. A second signal terminates at once.
extern std::atomic<bool> gStop;
void installSignalHandlers();

inline double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
inline double toMs(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

/// Median (mean of the two middle values for an even count); NaN when empty.
double median(std::vector<double> v);
/// Nearest-rank percentile, p in [0, 100]; NaN when empty.
double percentile(std::vector<double> v, double p);
/// Same for nanosecond samples, sorting in place (large vectors).
double percentileInPlace(std::vector<uint32_t>& v, double p);

/// Pins the calling thread to @p cpu (no-op for cpu < 0).
void pinThisThread(int cpu);
int onlineCpus();

/// A finished child process.
struct ProcResult {
  int exitCode = -1;     ///< 128+N when killed by signal N, -1 not run
  bool timedOut = false;
  double seconds = 0;    ///< spawn to reaped
  long maxRssKb = 0;     ///< ru_maxrss of the child
  std::string output;    ///< stdout and stderr together
  std::string describe(const std::string& what) const;
};

/// Spawns argv (argv[0] looked up in PATH) with stdin from @p stdinPath
/// (/dev/null when empty) and waits. The child inherits the calling thread's
/// namespaces: call it inside runInNetns to run a command in a pod.
ProcResult spawnWait(const std::vector<std::string>& argv, const std::string& stdinPath = {},
                     std::chrono::milliseconds timeout = 60s);
/// The same with exactly @p env as the child's environment ("K=V" each).
ProcResult spawnWaitEnv(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                        const std::string& stdinPath = {}, std::chrono::milliseconds timeout = 60s);

/// "sluice-bench-<pid>-<n>": names of the namespaces this process makes
/// (swept by later runs once the pid is gone).
std::string uniqueNetnsName();
/// Deletes sluice-bench-* namespaces whose process is gone.
void sweepStaleNamespaces();

/// A private directory under /tmp, removed with its files.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  /// Writes a file in the directory; returns its path.
  Result<std::string> write(const std::string& name, const std::string& content);

 private:
  std::string path_;
};

Result<std::string> readFile(const std::string& path);
/// CPU seconds used so far by this process (all threads, user + system)
/// plus the ksoftirqd threads (network work the kernel deferred there).
double cpuSecondsUsed();
/// Network namespaces the kernel holds (active net_namespace slab objects,
/// deleted ones included until their asynchronous cleanup ran); -1 unknown.
long netnsObjects();
/// Waits (at most @p limit) until the kernel has cleaned up deleted
/// namespaces: the count is down to @p target or has stopped falling.
/// Returns the seconds waited.
double settleNamespaces(long target, std::chrono::seconds limit = 60s);
/// /proc/loadavg's first three fields.
std::string loadAverage();
/// VmRSS of this process in KiB (0 when unknown).
long vmRssKb();
/// Formats a number with a sensible number of digits ("12345", "12.3", "0.123").
std::string fmtNum(double v);

}  // namespace sluice::bench
