#include "test/common/cgroup_pod.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <netlink/addr.h>
#include <netlink/route/addr.h>
#include <sched.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "loader/netlink.h"
#include "loader/netns.h"

namespace sluice::test {

namespace fs = std::filesystem;

namespace {

bool isFs(const std::string& path, long magic) {
  struct statfs st {};
  return ::statfs(path.c_str(), &st) == 0 && st.f_type == magic;
}

// A v1 hierarchy mounted at /sys/fs/cgroup/NAME.
bool isV1(const std::string& path) { return isFs(path, CGROUP_SUPER_MAGIC); }

Status writePid(const std::string& dir, pid_t pid) {
  std::ofstream f(dir + "/cgroup.procs");
  f << pid << "\n";
  f.flush();
  if (!f) return Error::msg("move " + std::to_string(pid) + " into " + dir + ": write failed", EIO);
  return {};
}

// Removes a cgroup tree depth first: processes still in it are killed (they
// are this test's), then each directory is rmdir-ed (the control files go
// with it; a dying process may keep it busy for a moment).
void removeCgroupTree(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec)) removeCgroupTree(e.path());
  std::ifstream procs(dir + "/cgroup.procs");
  for (pid_t pid; procs >> pid;) ::kill(pid, SIGKILL);
  for (int i = 0; i < 200 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

Status addAddressOnLo(const std::string& netnsPath, const std::string& ip) {
  auto nsfd = openNetns(netnsPath);
  SLUICE_TRY(nsfd);
  return runInNetns(nsfd->get(), [&]() -> Status {
    auto sock = NetlinkSocket::open();
    SLUICE_TRY(sock);
    nl_addr* local = nullptr;
    std::string cidr = ip + (ip.find(':') == std::string::npos ? "/32" : "/128");
    if (nl_addr_parse(cidr.c_str(), AF_UNSPEC, &local) < 0) return Error::msg("bad address " + ip, EINVAL);
    rtnl_addr* addr = rtnl_addr_alloc();
    rtnl_addr_set_ifindex(addr, 1);  // lo is always ifindex 1 in a new netns
    rtnl_addr_set_local(addr, local);
    Status s = sock->call([&](nl_sock* sk) { return rtnl_addr_add(sk, addr, 0); }, "add " + cidr + " on lo");
    rtnl_addr_put(addr);
    nl_addr_put(local);
    return s;
  });
}

std::string podDir(const TestPodProcessOptions& o) {
  if (o.driver == CgroupDriver::Cgroupfs)
    return "kubepods/" + (o.qos.empty() ? "" : o.qos + "/") + "pod" + o.uid + "/" + o.container;
  std::string uid = o.uid;
  std::replace(uid.begin(), uid.end(), '-', '_');
  std::string level = o.qos.empty() ? "kubepods" : "kubepods-" + o.qos;
  return "kubepods.slice/" + (o.qos.empty() ? "" : level + ".slice/") + level + "-pod" + uid + ".slice/cri-containerd-" +
         o.container + ".scope";
}

// Parents left by a test process that crashed (sluice-kube-<pid>-<n> with
// that pid gone): removed once per process.
void sweepStaleParents() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* base : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/systemd"}) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(base, ec)) {
        std::string name = e.path().filename();
        if (name.rfind("sluice-kube-", 0) != 0) continue;
        pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + std::strlen("sluice-kube-")));
        if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) removeCgroupTree(e.path());
      }
    }
  });
}

}  // namespace

TestCgroupRoot::TestCgroupRoot() {
  sweepStaleParents();
  static std::atomic<int> n{0};
  name_ = "sluice-kube-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
  // Hybrid (v2 at unified/) or pure v2 (at the top).
  std::string v2base = isFs("/sys/fs/cgroup/unified", CGROUP2_SUPER_MAGIC) ? "/sys/fs/cgroup/unified"
                       : isFs("/sys/fs/cgroup", CGROUP2_SUPER_MAGIC)      ? "/sys/fs/cgroup"
                                                                           : "";
  if (v2base.empty()) {
    error_ = "no cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified";
    unavailable_ = true;
    return;
  }
  auto make = [&](const std::string& base) -> std::string {
    std::string dir = base + "/" + name_;
    if (::mkdir(dir.c_str(), 0755) != 0) {
      error_ = "mkdir " + dir + ": " + std::strerror(errno);
      return "";
    }
    return dir;
  };
  v2_ = make(v2base);
  if (isV1("/sys/fs/cgroup/pids")) pids_ = make("/sys/fs/cgroup/pids");
  if (isV1("/sys/fs/cgroup/systemd")) systemd_ = make("/sys/fs/cgroup/systemd");
}

TestCgroupRoot::~TestCgroupRoot() {
  for (const auto& d : {v2_, pids_, systemd_})
    if (!d.empty()) removeCgroupTree(d);
}

std::vector<std::string> TestCgroupRoot::parents(CgroupDriver driver) const {
  std::vector<std::string> out{v2_};
  const std::string& v1 = driver == CgroupDriver::Cgroupfs ? pids_ : systemd_;
  if (!v1.empty()) out.push_back(v1);
  return out;
}

std::string randomPodUid() {
  static std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int len : {8, 4, 4, 4, 12}) {
    if (!s.empty()) s.push_back('-');
    for (int i = 0; i < len; ++i) s.push_back(hex[rng() % 16]);
  }
  return s;
}

Result<std::unique_ptr<TestPodProcess>> TestPodProcess::start(const TestCgroupRoot& root, const TestPodProcessOptions& o) {
  if (!root.ok()) return Error::msg(root.error(), ENOENT);
  Fd joinFd;
  if (!o.joinNetns.empty()) {
    auto fd = openNetns(o.joinNetns);
    SLUICE_TRY(fd);
    joinFd = std::move(*fd);
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return Error::fromErrno(errno, "pipe");
  Fd rd(p[0]), wr(p[1]);
  std::unique_ptr<TestPodProcess> proc(new TestPodProcess());
  pid_t pid = ::fork();
  if (pid < 0) return Error::fromErrno(errno, "fork");
  if (pid == 0) {
    // The child of a multi-threaded test: async-signal-safe calls only.
    // It dies with the test (even a crashed one) and keeps none of its
    // output pipes open.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int devnull = ::open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
    }
    if (joinFd.valid()) {
      if (::setns(joinFd.get(), CLONE_NEWNET) != 0) ::_exit(1);
    } else if (o.newNetns && ::unshare(CLONE_NEWNET) != 0) {
      ::_exit(1);
    }
    char c = 1;
    if (::write(wr.get(), &c, 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  proc->pid_ = pid;
  wr.reset();
  char c = 0;
  if (::read(rd.get(), &c, 1) != 1) return Error::msg("pod process " + std::to_string(pid) + " failed to set up its netns", ECHILD);
  for (const auto& parent : root.parents(o.driver)) {
    std::string dir = parent + "/" + podDir(o);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return Error::msg("mkdir " + dir + ": " + ec.message(), ec.value());
    SLUICE_TRY(writePid(dir, pid));
  }
  if (o.newNetns && o.joinNetns.empty())
    for (const auto& ip : o.ips) SLUICE_TRY(addAddressOnLo(proc->netnsPath(), ip));
  return proc;
}

TestPodProcess::~TestPodProcess() { kill(); }

void TestPodProcess::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

std::string TestPodProcess::netnsPath() const { return "/proc/" + std::to_string(pid_) + "/ns/net"; }

std::pair<uint64_t, uint64_t> TestPodProcess::netnsId() const {
  struct stat st {};
  ::stat(netnsPath().c_str(), &st);
  return {st.st_dev, st.st_ino};
}

}  // namespace sluice::test
