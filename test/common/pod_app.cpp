#include "test/common/pod_app.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "loader/cgroup.h"
#include "base/fd.h"

namespace sluice::test {

namespace {

std::atomic<int> gApps{0};

Result<std::string> ownCgroupDir() {
  auto mount = cgroup2Mount();
  SLUICE_TRY(mount);
  std::ifstream self("/proc/self/cgroup");
  std::string rel;
  for (std::string line; std::getline(self, line);)
    if (line.rfind("0::", 0) == 0) rel = line.substr(3);
  return *mount + (rel == "/" ? "" : rel);
}

int capget2(__user_cap_data_struct data[2]) {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  return static_cast<int>(::syscall(SYS_capget, &hdr, data));
}

// In the child: CAP_NET_RAW alone, in every set, for good.
const char* keepNetRawOnly() {
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return "PR_SET_NO_NEW_PRIVS";
  for (int cap = 0; cap <= CAP_LAST_CAP; cap++)
    if (cap != CAP_NET_RAW && ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
      return "PR_CAPBSET_DROP";
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  data[CAP_TO_INDEX(CAP_NET_RAW)].effective = CAP_TO_MASK(CAP_NET_RAW);
  data[CAP_TO_INDEX(CAP_NET_RAW)].permitted = CAP_TO_MASK(CAP_NET_RAW);
  if (::syscall(SYS_capset, &hdr, data) != 0) return "capset";
  return nullptr;
}

void writeAll(int fd, const std::string& s) {
  for (size_t off = 0; off < s.size();) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace

bool hasCapability(int cap) {
  __user_cap_data_struct data[2]{};
  if (capget2(data) != 0) return false;
  return (data[CAP_TO_INDEX(cap)].effective & CAP_TO_MASK(cap)) != 0;
}

Result<PodAppResult> runAsPodApp(const std::string& netnsPath, const std::function<int(std::string& out)>& fn,
                                 std::chrono::milliseconds timeout) {
  Fd ns(::open(netnsPath.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns.valid()) return Error::fromErrno(errno, "open netns " + netnsPath);
  auto parent = ownCgroupDir();
  SLUICE_TRY(parent);
  const std::string cg = *parent + "/app-" + std::to_string(::getpid()) + "-" + std::to_string(gApps++);
  if (::mkdir(cg.c_str(), 0755) != 0) return Error::fromErrno(errno, "mkdir " + cg);
  auto removeCg = [&cg] {
    for (int i = 0; i < 200 && ::rmdir(cg.c_str()) != 0 && errno == EBUSY; i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  int pipeFds[2];
  if (::pipe2(pipeFds, O_CLOEXEC) != 0) {
    int err = errno;
    removeCg();
    return Error::fromErrno(err, "pipe");
  }
  Fd rd(pipeFds[0]), wr(pipeFds[1]);
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    removeCg();
    return Error::fromErrno(err, "fork");
  }
  if (pid == 0) {
    // The child: the set-up, then fn. Set-up failures exit 200+ with the
    // step on the pipe ("setup: ...").
    auto fail = [&](const char* step) {
      writeAll(wr.get(), std::string("setup: ") + step + ": " + std::strerror(errno));
      ::_exit(200);
    };
    {
      std::ofstream procs(cg + "/cgroup.procs");
      procs << ::getpid() << std::flush;
      if (!procs) fail("join cgroup");
    }
    if (::setns(ns.get(), CLONE_NEWNET) != 0) fail("setns");
    if (const char* step = keepNetRawOnly()) fail(step);
    std::string out;
    int rc = fn(out);
    writeAll(wr.get(), out);
    ::_exit(rc & 0xff);
  }
  wr.reset();
  PodAppResult r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(pid, SIGKILL);
      break;
    }
    struct pollfd p {rd.get(), POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    ssize_t got = ::read(rd.get(), buf, sizeof(buf));
    if (got <= 0) break;  // the child closed its end: it is exiting
    r.out.append(buf, static_cast<size_t>(got));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  removeCg();
  if (WIFEXITED(status)) r.exitCode = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) r.exitCode = 128 + WTERMSIG(status);
  if (r.exitCode == 200 && r.out.rfind("setup: ", 0) == 0) return Error::msg("pod app " + r.out, EPERM);
  return r;
}

}  // namespace sluice::test
