#include "test/bench/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace sluice::bench {

std::atomic<bool> gStop{false};

namespace {

extern "C" void onStopSignal(int sig) {
  gStop.store(true);
  // A second signal ends the process at once.
  ::signal(sig, SIG_DFL);
}

std::atomic<int> gNameCounter{0};
constexpr const char* kNetnsPrefix = "sluice-bench-";

}  // namespace

void installSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double percentile(std::vector<double> v, double p) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  if (rank == 0) rank = 1;
  return v[std::min(rank, v.size()) - 1];
}

double percentileInPlace(std::vector<uint32_t>& v, double p) {
  if (v.empty()) return NAN;
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  if (rank == 0) rank = 1;
  rank = std::min(rank, v.size());
  std::nth_element(v.begin(), v.begin() + static_cast<long>(rank - 1), v.end());
  return v[rank - 1];
}

void pinThisThread(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set);
}

int onlineCpus() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string ProcResult::describe(const std::string& what) const {
  std::string s = what + ": ";
  s += timedOut ? "timed out" : "exit " + std::to_string(exitCode);
  std::string out = output;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  if (!out.empty()) s += ": " + out.substr(0, 400);
  return s;
}

ProcResult spawnWait(const std::vector<std::string>& argv, const std::string& stdinPath,
                     std::chrono::milliseconds timeout) {
  std::vector<std::string> env;
  for (char** e = environ; *e; e++) env.emplace_back(*e);
  return spawnWaitEnv(argv, env, stdinPath, timeout);
}

ProcResult spawnWaitEnv(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                        const std::string& stdinPath, std::chrono::milliseconds timeout) {
  ProcResult r;
  if (argv.empty()) return r;
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    r.output = std::string("pipe2: ") + std::strerror(errno);
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, stdinPath.empty() ? "/dev/null" : stdinPath.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_adddup2(&fa, p[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  auto t0 = Clock::now();
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int rc = ::posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(p[1]);
  if (rc != 0) {
    ::close(p[0]);
    r.output = "spawn " + argv[0] + ": " + std::strerror(rc);
    return r;
  }
  auto deadline = t0 + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      r.timedOut = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd pf{p[0], POLLIN, 0};
    int n = ::poll(&pf, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[4096];
    ssize_t got = ::read(p[0], buf, sizeof(buf));
    if (got > 0) {
      if (r.output.size() < 65536) r.output.append(buf, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    break;  // EOF
  }
  ::close(p[0]);
  int st = 0;
  rusage ru{};
  while (::wait4(pid, &st, 0, &ru) < 0 && errno == EINTR) {
  }
  r.seconds = secondsSince(t0);
  r.maxRssKb = ru.ru_maxrss;
  if (WIFEXITED(st)) r.exitCode = WEXITSTATUS(st);
  else if (WIFSIGNALED(st)) r.exitCode = 128 + WTERMSIG(st);
  return r;
}

std::string uniqueNetnsName() {
  return std::string(kNetnsPrefix) + std::to_string(::getpid()) + "-" + std::to_string(gNameCounter++);
}

void sweepStaleNamespaces() {
  DIR* d = ::opendir("/run/netns");
  if (!d) return;
  std::string batch;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(kNetnsPrefix, 0) != 0) continue;
    pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + std::strlen(kNetnsPrefix)));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) batch += "netns del " + name + "\n";
  }
  ::closedir(d);
  if (batch.empty()) return;
  TempDir tmp;
  auto f = tmp.write("sweep.batch", batch);
  if (f.ok()) (void)spawnWait({"ip", "-force", "-batch", *f});
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/sluice-bench-XXXXXX";
  if (::mkdtemp(tmpl)) path_ = tmpl;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  if (DIR* d = ::opendir(path_.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") ::unlink((path_ + "/" + n).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(path_.c_str());
}

Result<std::string> TempDir::write(const std::string& name, const std::string& content) {
  if (path_.empty()) return Error::msg("no temporary directory");
  std::string p = path_ + "/" + name;
  std::ofstream f(p, std::ios::trunc);
  f << content;
  f.close();
  if (!f) return Error::msg("cannot write " + p);
  return p;
}

Result<std::string> readFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return Error::fromErrno(errno ? errno : ENOENT, "open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

namespace {
std::vector<std::string> ksoftirqdStats() {
  std::vector<std::string> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/comm");
    std::string comm;
    std::getline(f, comm);
    if (comm.rfind("ksoftirqd/", 0) == 0) out.push_back(std::string("/proc/") + e->d_name + "/stat");
  }
  ::closedir(d);
  return out;
}
}  // namespace

double cpuSecondsUsed() {
  static const std::vector<std::string> softirqd = ksoftirqdStats();
  static const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  double s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
             static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  for (const auto& path : softirqd) {
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; i++) {
      if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
      if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
    }
    s += static_cast<double>(utime + stime) / tick;
  }
  return s;
}

long netnsObjects() {
  std::ifstream f("/proc/slabinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("net_namespace ", 0) == 0) return std::atol(line.c_str() + 14);
  return -1;
}

double settleNamespaces(long target, std::chrono::seconds limit) {
  auto t0 = Clock::now();
  long last = netnsObjects();
  auto lastDrop = t0;
  while (last >= 0 && last > target && !gStop && Clock::now() - t0 < limit) {
    std::this_thread::sleep_for(100ms);
    long now = netnsObjects();
    if (now < last) lastDrop = Clock::now();
    last = now;
    if (Clock::now() - lastDrop > 5s) break;  // stable: others' namespaces (or SLUB's count lags)
  }
  return secondsSince(t0);
}

std::string loadAverage() {
  std::ifstream f("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  f >> a >> b >> c;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %.2f %.2f", a, b, c);
  return buf;
}

long vmRssKb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return 0;
}

std::string fmtNum(double v) {
  if (std::isnan(v)) return "-";
  char buf[64];
  double a = std::fabs(v);
  if (a >= 1000) std::snprintf(buf, sizeof(buf), "%.0f", v);
  else if (a >= 100) std::snprintf(buf, sizeof(buf), "%.1f", v);
  else if (a >= 10) std::snprintf(buf, sizeof(buf), "%.2f", v);
  else if (a >= 1) std::snprintf(buf, sizeof(buf), "%.2f", v);
  else std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

}  // namespace sluice::bench
