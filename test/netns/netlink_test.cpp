// Network namespace, netlink and sysctl helpers against real namespaces.
// Needs root; every test gets a fresh namespace that is deleted afterwards,
// whether the test passes or not.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <linux/fib_rules.h>
#include <netlink/route/rule.h>

#include "base/fd.h"
#include "loader/netlink.h"
#include "loader/netns.h"
#include "loader/sysctl.h"

namespace sluice {
namespace {

constexpr const char* kNetnsDir = "/var/run/netns/";
constexpr const char* kPrefix = "sluice-nl-";

struct CmdResult {
  int status = -1;
  std::string output;
};

// Runs a shell command, capturing stdout+stderr.
CmdResult sh(const std::string& cmd) {
  CmdResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

int countOf(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (auto pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

uint64_t inodeOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return st.st_ino;
}

// Deletes namespaces that an earlier, crashed run of this binary left behind
// (named sluice-nl-<pid>-<n> for a pid that no longer exists).
class StaleNetnsCleanup : public ::testing::Environment {
 public:
  void SetUp() override {
    if (::geteuid() != 0) return;
    DIR* dir = ::opendir(kNetnsDir);
    if (!dir) return;
    std::vector<std::string> stale;
    while (dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name.rfind(kPrefix, 0) != 0) continue;
      pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + std::strlen(kPrefix)));
      if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(name);
    }
    ::closedir(dir);
    for (const auto& name : stale) sh("ip netns del " + name);
  }
};
[[maybe_unused]] auto* const kStaleCleanup =
    ::testing::AddGlobalTestEnvironment(new StaleNetnsCleanup);

// A named network namespace (`ip netns add`), deleted on destruction.
class ScopedNetns {
 public:
  ScopedNetns() : name_(kPrefix + std::to_string(::getpid()) + "-" + std::to_string(counter_++)) {
    auto r = sh("ip netns add " + name_);
    if (r.status != 0) {
      error_ = "ip netns add " + name_ + ": " + r.output;
      return;
    }
    created_ = true;
    auto fd = openNetns(path());
    if (!fd.ok()) {
      error_ = fd.error().message;
      return;
    }
    fd_ = std::move(*fd);
  }
  ~ScopedNetns() {
    fd_.reset();
    if (created_) sh("ip netns del " + name_);
  }
  ScopedNetns(const ScopedNetns&) = delete;
  ScopedNetns& operator=(const ScopedNetns&) = delete;

  bool ok() const { return fd_.valid(); }
  const std::string& error() const { return error_; }
  const std::string& name() const { return name_; }
  std::string path() const { return kNetnsDir + name_; }
  int fd() const { return fd_.get(); }

  Status run(const std::function<Status()>& fn) const { return runInNetns(fd_.get(), fn); }

  /// Runs fn inside the namespace and hands back its result.
  template <typename T>
  Result<T> get(const std::function<Result<T>()>& fn) const {
    std::optional<Result<T>> out;
    Status st = run([&]() -> Status {
      out.emplace(fn());
      return {};
    });
    if (!st.ok()) return st.error();
    return std::move(*out);
  }

  /// `ip -n NAME ARGS`.
  CmdResult ip(const std::string& args) const { return sh("ip -n " + name_ + " " + args); }

 private:
  static inline std::atomic<int> counter_{0};
  std::string name_;
  std::string error_;
  bool created_ = false;
  Fd fd_;
};

class NetnsFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (creates network namespaces)";
    ns_ = std::make_unique<ScopedNetns>();
    ASSERT_TRUE(ns_->ok()) << ns_->error();
  }
  std::unique_ptr<ScopedNetns> ns_;
};

class Netns : public NetnsFixture {};
class Netlink : public NetnsFixture {};
class Sysctl : public NetnsFixture {};

// A temporary regular file, removed on destruction.
class TempFile {
 public:
  TempFile() {
    char tmpl[] = "/tmp/sluice-netns-test-XXXXXX";
    Fd fd(::mkstemp(tmpl));
    if (fd.valid()) path_ = tmpl;
  }
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---- Netns ------------------------------------------------------------------

TEST_F(Netns, OpenMissingPathFails) {
  const std::string path = std::string(kNetnsDir) + "sluice-missing-" + std::to_string(::getpid());
  auto r = openNetns(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ENOENT);
  EXPECT_EQ(r.error().message, "netns " + path + ": No such file or directory");
}

TEST_F(Netns, OpenOtherNamespaceTypeFails) {
  auto r = openNetns("/proc/self/ns/mnt");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "/proc/self/ns/mnt: not a network namespace");
}

TEST_F(Netns, OpenRegularFileFails) {
  TempFile file;
  ASSERT_FALSE(file.path().empty());
  auto r = openNetns(file.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, file.path() + ": not a network namespace");

  auto dir = openNetns("/tmp");
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.error().message, "/tmp: not a network namespace");
}

TEST_F(Netns, OpenUnreadableFileFailsWithPermissionDenied) {
  TempFile file;
  ASSERT_FALSE(file.path().empty());
  ASSERT_EQ(::chmod(file.path().c_str(), 0600), 0);
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  Fd readEnd(fds[0]);
  Fd writeEnd(fds[1]);
  // Root bypasses file permissions, so drop to nobody in a child process.
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
        ::setresuid(65534, 65534, 65534) != 0) {
      ::_exit(2);
    }
    auto r = openNetns(file.path());
    std::string msg = r.ok() ? "opened" : r.error().message;
    ssize_t ignored = ::write(writeEnd.get(), msg.data(), msg.size());
    (void)ignored;
    ::_exit(0);
  }
  writeEnd.reset();
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = ::read(readEnd.get(), buf, sizeof(buf))) > 0) msg.append(buf, n);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child could not drop privileges";
  EXPECT_EQ(msg, "netns " + file.path() + ": Permission denied");
}

TEST_F(Netns, InodeIdentifiesNamespace) {
  auto fd = openNetns(ns_->path());
  ASSERT_TRUE(fd.ok()) << fd.error().message;
  auto ino = netnsInode(fd->get());
  ASSERT_TRUE(ino.ok()) << ino.error().message;
  EXPECT_EQ(*ino, inodeOf(ns_->path()));
  EXPECT_NE(*ino, inodeOf("/proc/thread-self/ns/net"));

  auto bad = netnsInode(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, EBADF);
}

TEST_F(Netns, RunInNetnsEntersTargetAndLeavesCallerAlone) {
  const uint64_t before = inodeOf("/proc/thread-self/ns/net");
  auto target = netnsInode(ns_->fd());
  ASSERT_TRUE(target.ok());
  uint64_t inside = 0;
  Status st = ns_->run([&]() -> Status {
    // /proc/self would name the main thread; thread-self is this one.
    inside = inodeOf("/proc/thread-self/ns/net");
    return {};
  });
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(inside, *target);
  EXPECT_EQ(inodeOf("/proc/thread-self/ns/net"), before);
}

TEST_F(Netns, RunInNetnsReturnsTaskStatus) {
  Status ok = ns_->run([]() -> Status { return {}; });
  EXPECT_TRUE(ok.ok());
  Status failed = ns_->run([]() -> Status { return Error::msg("boom", EIO); });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().message, "boom");
  EXPECT_EQ(failed.error().code, EIO);
}

TEST_F(Netns, RunInNetnsConvertsExceptions) {
  Status st = ns_->run([]() -> Status { throw std::runtime_error("kaput"); });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message, "exception in network namespace task: kaput");
  Status odd = ns_->run([]() -> Status { throw 42; });
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.error().message, "unknown exception in network namespace task");
}

TEST_F(Netns, RunInNetnsRejectsNonNetnsFd) {
  Fd mnt(::open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(mnt.valid());
  bool called = false;
  Status st = runInNetns(mnt.get(), [&]() -> Status {
    called = true;
    return {};
  });
  ASSERT_FALSE(st.ok());
  EXPECT_FALSE(called);
  EXPECT_EQ(st.error().code, EINVAL);
  EXPECT_EQ(st.error().message, "setns into network namespace (fd " + std::to_string(mnt.get()) +
                                    "): Invalid argument");
}

TEST_F(Netns, CookieIsStableAndPerNamespace) {
  auto host1 = currentNetnsCookie();
  auto host2 = currentNetnsCookie();
  ASSERT_TRUE(host1.ok()) << host1.error().message;
  ASSERT_TRUE(host2.ok());
  EXPECT_EQ(*host1, *host2);

  auto a1 = ns_->get<uint64_t>(currentNetnsCookie);
  auto a2 = ns_->get<uint64_t>(currentNetnsCookie);
  ASSERT_TRUE(a1.ok()) << a1.error().message;
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(*a1, *a2);

  ScopedNetns other;
  ASSERT_TRUE(other.ok()) << other.error();
  auto b = other.get<uint64_t>(currentNetnsCookie);
  ASSERT_TRUE(b.ok()) << b.error().message;

  EXPECT_NE(*host1, *a1);
  EXPECT_NE(*host1, *b);
  EXPECT_NE(*a1, *b);
}

// ---- Netlink ----------------------------------------------------------------

// add twice, delete twice, checking both our view and iproute2's.
void checkRuleLifecycle(const ScopedNetns& ns, int family, const std::string& ipFamily) {
  const PolicyRule rule{family, 0x111, 0xfff, 101, 100};
  const std::string expected = "fwmark 0x111/0xfff lookup 100";
  auto exists = [&] { return ns.get<bool>([&] { return policyRuleExists(rule); }); };

  auto before = exists();
  ASSERT_TRUE(before.ok()) << before.error().message;
  EXPECT_FALSE(*before);

  for (int i = 0; i < 2; ++i) {
    Status st = ns.run([&] { return addPolicyRule(rule); });
    ASSERT_TRUE(st.ok()) << "add #" << i << ": " << st.error().message;
  }
  auto present = exists();
  ASSERT_TRUE(present.ok()) << present.error().message;
  EXPECT_TRUE(*present);
  auto out = ns.ip(ipFamily + " rule");
  ASSERT_EQ(out.status, 0) << out.output;
  EXPECT_EQ(countOf(out.output, expected), 1) << out.output;
  EXPECT_NE(out.output.find("101:"), std::string::npos) << out.output;

  for (int i = 0; i < 2; ++i) {
    Status st = ns.run([&] { return deletePolicyRule(rule); });
    ASSERT_TRUE(st.ok()) << "delete #" << i << ": " << st.error().message;
  }
  auto after = exists();
  ASSERT_TRUE(after.ok()) << after.error().message;
  EXPECT_FALSE(*after);
  out = ns.ip(ipFamily + " rule");
  EXPECT_EQ(countOf(out.output, expected), 0) << out.output;
}

TEST_F(Netlink, PolicyRuleIPv4) { checkRuleLifecycle(*ns_, AF_INET, "-4"); }

TEST_F(Netlink, PolicyRuleIPv6) { checkRuleLifecycle(*ns_, AF_INET6, "-6"); }

TEST_F(Netlink, PolicyRuleMatchesOnlyExactRule) {
  // Same mark and table but another priority, mask or table is a different rule.
  auto r = ns_->ip("rule add prio 102 fwmark 0x111/0xfff lookup 100");
  ASSERT_EQ(r.status, 0) << r.output;
  r = ns_->ip("rule add prio 101 fwmark 0x111/0xff lookup 100");
  ASSERT_EQ(r.status, 0) << r.output;
  r = ns_->ip("rule add prio 101 fwmark 0x111/0xfff lookup 101");
  ASSERT_EQ(r.status, 0) << r.output;
  const PolicyRule rule{AF_INET, 0x111, 0xfff, 101, 100};
  auto exists = ns_->get<bool>([&] { return policyRuleExists(rule); });
  ASSERT_TRUE(exists.ok()) << exists.error().message;
  EXPECT_FALSE(*exists);
  // The IPv6 table is separate.
  auto v6 = ns_->get<bool>([&] {
    return policyRuleExists(PolicyRule{AF_INET6, 0x111, 0xfff, 102, 100});
  });
  ASSERT_TRUE(v6.ok()) << v6.error().message;
  EXPECT_FALSE(*v6);

  // One made by iproute2 counts as present, and is not duplicated.
  r = ns_->ip("rule add prio 101 fwmark 0x111/0xfff lookup 100");
  ASSERT_EQ(r.status, 0) << r.output;
  Status st = ns_->run([&] { return addPolicyRule(rule); });
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto out = ns_->ip("rule");
  EXPECT_EQ(countOf(out.output, "101:\tfrom all fwmark 0x111/0xfff lookup 100"), 1) << out.output;
  // Deleting leaves the neighbours alone.
  st = ns_->run([&] { return deletePolicyRule(rule); });
  ASSERT_TRUE(st.ok()) << st.error().message;
  out = ns_->ip("rule");
  EXPECT_EQ(countOf(out.output, "fwmark 0x111/0xfff lookup 100"), 1) << out.output;
  EXPECT_EQ(countOf(out.output, "fwmark 0x111/0xff lookup 100"), 1) << out.output;
  EXPECT_EQ(countOf(out.output, "fwmark 0x111/0xfff lookup 101"), 1) << out.output;
}

// ensurePolicyRule says whether it added the rule (an enrollment's undo
// deletes only what it added): a near miss (another priority, mask or
// table) does not count as the rule, the same rule does, whoever made it.
TEST_F(Netlink, EnsurePolicyRuleSaysWhetherItAdded) {
  for (const char* other : {"prio 102 fwmark 0x111/0xfff lookup 100", "prio 101 fwmark 0x111/0xff lookup 100",
                            "prio 101 fwmark 0x111/0xfff lookup 101"}) {
    auto r = ns_->ip(std::string("rule add ") + other);
    ASSERT_EQ(r.status, 0) << r.output;
  }
  const PolicyRule rule{AF_INET, 0x111, 0xfff, 101, 100};
  auto ensure = [&] {
    return ns_->get<bool>([&]() -> Result<bool> {
      auto sock = NetlinkSocket::open();
      SLUICE_TRY(sock);
      return ensurePolicyRule(*sock, rule);
    });
  };
  auto first = ensure();
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_TRUE(*first) << "a near miss was taken for the rule";
  auto second = ensure();
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_FALSE(*second) << "the rule was there already";
  auto out = ns_->ip("rule");
  EXPECT_EQ(countOf(out.output, "101:\tfrom all fwmark 0x111/0xfff lookup 100"), 1) << out.output;
  ASSERT_TRUE(ns_->run([&] { return deletePolicyRule(rule); }).ok());
  auto r = ns_->ip("rule add prio 101 fwmark 0x111/0xfff lookup 100");
  ASSERT_EQ(r.status, 0) << r.output;
  auto third = ensure();
  ASSERT_TRUE(third.ok()) << third.error().message;
  EXPECT_FALSE(*third) << "iproute2's rule is the same rule";
}

TEST_F(Netlink, DeletePolicyRuleRemovesDuplicates) {
  // Current iproute2 adds rules with NLM_F_EXCL, so stack two identical ones
  // the way older tools did: through libnl without it.
  const PolicyRule rule{AF_INET, 0x111, 0xfff, 101, 100};
  Status st = ns_->run([&]() -> Status {
    auto sock = NetlinkSocket::open();
    SLUICE_TRY(sock);
    std::unique_ptr<rtnl_rule, void (*)(rtnl_rule*)> r(rtnl_rule_alloc(), rtnl_rule_put);
    rtnl_rule_set_family(r.get(), AF_INET);
    rtnl_rule_set_prio(r.get(), rule.priority);
    rtnl_rule_set_mark(r.get(), rule.mark);
    rtnl_rule_set_mask(r.get(), rule.mask);
    rtnl_rule_set_table(r.get(), rule.table);
    rtnl_rule_set_action(r.get(), FR_ACT_TO_TBL);
    for (int i = 0; i < 2; ++i) {
      SLUICE_TRY(sock->call([&](nl_sock* s) { return rtnl_rule_add(s, r.get(), 0); }, "add dup"));
    }
    return {};
  });
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto out = ns_->ip("rule");
  ASSERT_EQ(countOf(out.output, "fwmark 0x111/0xfff lookup 100"), 2) << out.output;

  st = ns_->run([&] { return addPolicyRule(rule); });
  ASSERT_TRUE(st.ok()) << st.error().message;
  out = ns_->ip("rule");
  EXPECT_EQ(countOf(out.output, "fwmark 0x111/0xfff lookup 100"), 2) << out.output;

  st = ns_->run([&] { return deletePolicyRule(rule); });
  ASSERT_TRUE(st.ok()) << st.error().message;
  out = ns_->ip("rule");
  EXPECT_EQ(countOf(out.output, "fwmark 0x111/0xfff lookup 100"), 0) << out.output;
}

TEST_F(Netlink, KernelErrorWithoutExtendedAck) {
  // Deleting a missing rule: the kernel's own errno, not libnl's NLE code.
  Status st = ns_->run([]() -> Status {
    auto sock = NetlinkSocket::open();
    SLUICE_TRY(sock);
    std::unique_ptr<rtnl_rule, void (*)(rtnl_rule*)> r(rtnl_rule_alloc(), rtnl_rule_put);
    rtnl_rule_set_family(r.get(), AF_INET);
    rtnl_rule_set_prio(r.get(), 4242);
    rtnl_rule_set_table(r.get(), 4242);
    return sock->call([&](nl_sock* s) { return rtnl_rule_delete(s, r.get(), 0); }, "delete rule");
  });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ENOENT);
  EXPECT_EQ(st.error().message.rfind("delete rule: No such file or directory", 0), 0u)
      << st.error().message;
}

TEST_F(Netlink, MovedFromSocketFailsCleanly) {
  Status st = ns_->run([]() -> Status {
    auto sock = NetlinkSocket::open();
    SLUICE_TRY(sock);
    NetlinkSocket moved(std::move(*sock));
    EXPECT_NE(moved.get(), nullptr);
    EXPECT_EQ(sock->get(), nullptr);  // NOLINT(bugprone-use-after-move)
    return sock->call([](nl_sock*) { return 0; }, "use moved-from socket");
  });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EBADF);
}

TEST_F(Netlink, RejectsBadArguments) {
  Status st = ns_->run([] { return addPolicyRule(PolicyRule{AF_UNIX, 1, 1, 1, 100}); });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EAFNOSUPPORT);
  // Table 0 would make the kernel pick a table of its own choosing.
  st = ns_->run([] { return addPolicyRule(PolicyRule{AF_INET, 1, 1, 1, 0}); });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EINVAL);
  EXPECT_EQ(st.error().message,
            "add IPv4 rule prio 1 fwmark 0x1/0x1 lookup 0: routing table 0 is not a table");
  st = ns_->run([] { return addLocalDefaultRoute(AF_INET, 0, 1); });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EINVAL);
  auto exists = ns_->get<bool>([] { return localDefaultRouteExists(AF_PACKET, 100); });
  ASSERT_FALSE(exists.ok());
  EXPECT_EQ(exists.error().code, EAFNOSUPPORT);
  auto out = ns_->ip("rule");
  EXPECT_EQ(countOf(out.output, "fwmark"), 0) << out.output;
}

void checkLocalRouteLifecycle(const ScopedNetns& ns, int family, const std::string& ipFamily) {
  auto exists = [&](uint32_t table) {
    return ns.get<bool>([&] { return localDefaultRouteExists(family, table); });
  };
  const std::string show = ipFamily + " route show table 100 type local";

  auto before = exists(100);
  ASSERT_TRUE(before.ok()) << before.error().message;
  EXPECT_FALSE(*before);

  for (int i = 0; i < 2; ++i) {
    Status st = ns.run([&] { return addLocalDefaultRoute(family, 100, 1); });
    ASSERT_TRUE(st.ok()) << "add #" << i << ": " << st.error().message;
  }
  auto present = exists(100);
  ASSERT_TRUE(present.ok()) << present.error().message;
  EXPECT_TRUE(*present);
  auto elsewhere = exists(101);
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.error().message;
  EXPECT_FALSE(*elsewhere);

  auto out = ns.ip(show);
  ASSERT_EQ(out.status, 0) << out.output;
  EXPECT_EQ(countOf(out.output, "default dev lo"), 1) << out.output;
  // IPv6 has no route scopes; iproute2 prints them for IPv4 only.
  if (family == AF_INET) {
    EXPECT_NE(out.output.find("scope host"), std::string::npos) << out.output;
  }
  // The other family's table 100 is untouched (iproute2 may also say the
  // table does not exist there).
  auto otherFamily = ns.ip(std::string(ipFamily == "-4" ? "-6" : "-4") + " route show table 100");
  EXPECT_EQ(countOf(otherFamily.output, "default"), 0) << otherFamily.output;

  for (int i = 0; i < 2; ++i) {
    Status st = ns.run([&] { return deleteLocalDefaultRoute(family, 100, 1); });
    ASSERT_TRUE(st.ok()) << "delete #" << i << ": " << st.error().message;
  }
  auto after = exists(100);
  ASSERT_TRUE(after.ok()) << after.error().message;
  EXPECT_FALSE(*after);
  out = ns.ip(show);
  EXPECT_EQ(countOf(out.output, "default"), 0) << out.output;
}

TEST_F(Netlink, LocalDefaultRouteIPv4) {
  ASSERT_EQ(ns_->ip("link set dev lo up").status, 0);
  checkLocalRouteLifecycle(*ns_, AF_INET, "-4");
}

TEST_F(Netlink, LocalDefaultRouteIPv6) {
  ASSERT_EQ(ns_->ip("link set dev lo up").status, 0);
  checkLocalRouteLifecycle(*ns_, AF_INET6, "-6");
}

TEST_F(Netlink, LocalDefaultRouteIPv4WorksWithLoopbackDown) {
  Status st = ns_->run([] { return addLocalDefaultRoute(AF_INET, 100, 1); });
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto exists = ns_->get<bool>([] { return localDefaultRouteExists(AF_INET, 100); });
  ASSERT_TRUE(exists.ok()) << exists.error().message;
  EXPECT_TRUE(*exists);
}

TEST_F(Netlink, LocalDefaultRouteIPv6NeedsLoopbackUp) {
  // The kernel refuses IPv6 routes through a down device, and says so in an
  // extended ack that libnl alone would drop.
  Status st = ns_->run([] { return addLocalDefaultRoute(AF_INET6, 100, 1); });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ENETDOWN);
  EXPECT_EQ(st.error().message,
            "replace IPv6 route local ::/0 dev #1 table 100: Network is down "
            "(Nexthop device is not up)");
}

TEST_F(Netlink, KernelErrnoIsReported) {
  Status st = ns_->run([] { return addLocalDefaultRoute(AF_INET, 100, 4242); });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ENODEV);
  EXPECT_EQ(st.error().message.rfind(
                "replace IPv4 route local 0.0.0.0/0 dev #4242 table 100: No such device", 0),
            0u)
      << st.error().message;
}

TEST_F(Netlink, LocalDefaultRouteReplacesOneMadeByIproute2) {
  ASSERT_EQ(ns_->ip("link set dev lo up").status, 0);
  auto r = ns_->ip("route add local 0.0.0.0/0 dev lo table 100");
  ASSERT_EQ(r.status, 0) << r.output;
  Status st = ns_->run([] { return addLocalDefaultRoute(AF_INET, 100, 1); });
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto out = ns_->ip("-4 route show table 100");
  EXPECT_EQ(countOf(out.output, "default dev lo"), 1) << out.output;
  st = ns_->run([] { return deleteLocalDefaultRoute(AF_INET, 100, 1); });
  ASSERT_TRUE(st.ok()) << st.error().message;
  out = ns_->ip("-4 route show table 100");
  EXPECT_EQ(countOf(out.output, "default"), 0) << out.output;
}

const LinkInfo* findLink(const std::vector<LinkInfo>& links, const std::string& name) {
  for (const auto& l : links) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

TEST_F(Netlink, ListLinksSeesLoopbackAndVeth) {
  // ("ip link add a ..." would take "a" for "address".)
  auto r = ns_->ip("link add name a type veth peer name b");
  ASSERT_EQ(r.status, 0) << r.output;
  r = ns_->ip("link add name br0 type bridge");
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_EQ(ns_->ip("link set dev a up").status, 0);
  auto links = ns_->get<std::vector<LinkInfo>>(listLinks);
  ASSERT_TRUE(links.ok()) << links.error().message;
  ASSERT_EQ(links->size(), 4u);

  const LinkInfo* lo = findLink(*links, "lo");
  ASSERT_NE(lo, nullptr);
  EXPECT_EQ(lo->ifindex, 1);
  EXPECT_TRUE(lo->loopback);
  EXPECT_FALSE(lo->up);  // a fresh namespace's lo is down
  EXPECT_EQ(lo->kind, "");
  EXPECT_EQ(lo->linkIfindex, 0);

  const LinkInfo* a = findLink(*links, "a");
  const LinkInfo* b = findLink(*links, "b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->kind, "veth");
  EXPECT_EQ(b->kind, "veth");
  EXPECT_FALSE(a->loopback);
  EXPECT_TRUE(a->up);
  EXPECT_FALSE(b->up);
  EXPECT_EQ(a->linkIfindex, b->ifindex);
  EXPECT_EQ(b->linkIfindex, a->ifindex);

  const LinkInfo* br = findLink(*links, "br0");
  ASSERT_NE(br, nullptr);
  EXPECT_EQ(br->kind, "bridge");
  EXPECT_EQ(br->linkIfindex, 0);
}

TEST_F(Netlink, ListLinksVethPeerInOtherNamespace) {
  ScopedNetns other;
  ASSERT_TRUE(other.ok()) << other.error();
  // Give the peer a different ifindex than it would get locally.
  ASSERT_EQ(other.ip("link add name br0 type bridge").status, 0);
  ASSERT_EQ(other.ip("link add name br1 type bridge").status, 0);
  auto r = ns_->ip("link add name a type veth peer name b netns " + other.name());
  ASSERT_EQ(r.status, 0) << r.output;

  auto here = ns_->get<std::vector<LinkInfo>>(listLinks);
  auto there = other.get<std::vector<LinkInfo>>(listLinks);
  ASSERT_TRUE(here.ok()) << here.error().message;
  ASSERT_TRUE(there.ok()) << there.error().message;
  const LinkInfo* a = findLink(*here, "a");
  const LinkInfo* b = findLink(*there, "b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(findLink(*here, "b"), nullptr);
  EXPECT_EQ(a->linkIfindex, b->ifindex);
  EXPECT_EQ(b->linkIfindex, a->ifindex);
  EXPECT_NE(a->ifindex, b->ifindex);
}

// The link dump reads each interface's accept_local and whether IPv6 is on
// (the enrollment takes both from it instead of asking again).
TEST_F(Netlink, ListLinksReportsAcceptLocalAndIpv6) {
  auto r = ns_->ip("link add name a type veth peer name b");
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_TRUE(ns_->run([] { return writeSysctl("net/ipv4/conf/a/accept_local", "1"); }).ok());
  auto v6b = ns_->run([] { return writeSysctl("net/ipv6/conf/b/disable_ipv6", "1"); });
  auto links = ns_->get<std::vector<LinkInfo>>(listLinks);
  ASSERT_TRUE(links.ok()) << links.error().message;
  const LinkInfo* a = findLink(*links, "a");
  const LinkInfo* b = findLink(*links, "b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->acceptLocal, 1);
  EXPECT_EQ(b->acceptLocal, 0);
  if (!v6b.ok()) GTEST_SKIP() << "no IPv6 here (" << v6b.error().message << "): the IPv6 half is not checked";
  EXPECT_TRUE(a->ipv6);
  EXPECT_FALSE(b->ipv6);
}

// Every address in the kernel's order, the interface's own one where it has
// a peer; the caller filters (loopback, link-local).
TEST_F(Netlink, ListAddrsReportsEachInterfacesOwnAddresses) {
  auto r = ns_->ip("link add name a type veth peer name b");
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_EQ(ns_->ip("link set dev lo up").status, 0);
  ASSERT_EQ(ns_->ip("addr add 10.77.0.2/24 dev a").status, 0);
  ASSERT_EQ(ns_->ip("addr add 10.78.0.1 peer 10.78.0.9/32 dev b").status, 0);
  const bool v6 = ns_->ip("-6 addr add fd77::2/64 dev a nodad").status == 0;
  auto addrs = ns_->get<std::vector<AddrInfo>>([]() -> Result<std::vector<AddrInfo>> {
    auto sock = NetlinkSocket::open();
    SLUICE_TRY(sock);
    return listAddrsOn(*sock);
  });
  ASSERT_TRUE(addrs.ok()) << addrs.error().message;
  auto text = [](const AddrInfo& x) {
    char buf[INET6_ADDRSTRLEN] = {};
    inet_ntop(x.family, x.addr, buf, sizeof(buf));
    return std::string(buf) + "/" + std::to_string(x.prefixLen);
  };
  auto links = ns_->get<std::vector<LinkInfo>>(listLinks);
  ASSERT_TRUE(links.ok()) << links.error().message;
  std::vector<std::string> seen;
  for (const auto& x : *addrs) {
    const LinkInfo* on = nullptr;
    for (const auto& l : *links)
      if (l.ifindex == x.ifindex) on = &l;
    ASSERT_NE(on, nullptr) << text(x) << " on an unknown interface #" << x.ifindex;
    seen.push_back(on->name + " " + text(x));
  }
  std::vector<std::string> want = {"lo 127.0.0.1/8", "a 10.77.0.2/24", "b 10.78.0.1/32"};
  if (v6) want.insert(want.begin() + 1, "lo ::1/128");
  for (const auto& w : want)
    EXPECT_NE(std::find(seen.begin(), seen.end(), w), seen.end()) << w << " missing; seen: " << ::testing::PrintToString(seen);
  if (v6) {
    EXPECT_NE(std::find(seen.begin(), seen.end(), "a fd77::2/64"), seen.end()) << ::testing::PrintToString(seen);
  }
  EXPECT_EQ(std::find(seen.begin(), seen.end(), "b 10.78.0.9/32"), seen.end()) << "the peer address was taken for b's own";
}

// ---- Sysctl -----------------------------------------------------------------

TEST_F(Sysctl, WriteInNetnsLeavesHostUntouched) {
  const std::string name = "net/ipv4/conf/lo/accept_local";
  auto host = readSysctl(name);
  ASSERT_TRUE(host.ok()) << host.error().message;
  const std::string flipped = *host == "1" ? "0" : "1";

  Status st = ns_->run([&] { return writeSysctl(name, flipped); });
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto inside = ns_->get<std::string>([&] { return readSysctl(name); });
  ASSERT_TRUE(inside.ok()) << inside.error().message;
  EXPECT_EQ(*inside, flipped);

  auto hostAfter = readSysctl(name);
  ASSERT_TRUE(hostAfter.ok()) << hostAfter.error().message;
  EXPECT_EQ(*hostAfter, *host);

  // Interfaces of the namespace show up under its /proc/sys/net only.
  ASSERT_EQ(ns_->ip("link add name sluicetest0 type bridge").status, 0);
  auto perIf = ns_->get<std::string>(
      [] { return readSysctl("net/ipv4/conf/sluicetest0/accept_local"); });
  EXPECT_TRUE(perIf.ok()) << perIf.error().message;
  EXPECT_FALSE(readSysctl("net/ipv4/conf/sluicetest0/accept_local").ok());
}

TEST_F(Sysctl, ValuesAreTrimmed) {
  Status st = ns_->run([] { return writeSysctl("net/ipv4/ip_forward", " 1\n"); });
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto v = ns_->get<std::string>([] { return readSysctl("net/ipv4/ip_forward"); });
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(*v, "1");
  // Inner whitespace of multi-value sysctls is kept.
  auto range = ns_->get<std::string>([] { return readSysctl("net/ipv4/ip_local_port_range"); });
  ASSERT_TRUE(range.ok()) << range.error().message;
  EXPECT_NE(range->find('\t'), std::string::npos);
  EXPECT_NE(range->back(), '\n');
}

TEST_F(Sysctl, MissingSysctlFails) {
  const std::string name = "net/ipv4/conf/sluicenone0/accept_local";
  auto r = ns_->get<std::string>([&] { return readSysctl(name); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ENOENT);
  EXPECT_EQ(r.error().message, "/proc/sys/" + name + ": No such file or directory");
  Status w = ns_->run([&] { return writeSysctl(name, "1"); });
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code, ENOENT);
}

TEST_F(Sysctl, InvalidValueFails) {
  Status st = ns_->run([] { return writeSysctl("net/ipv4/ip_forward", "banana"); });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EINVAL);
  EXPECT_EQ(st.error().message,
            "write \"banana\" to /proc/sys/net/ipv4/ip_forward: Invalid argument");
}

// One open reads and, when it differs, writes: the value before comes back
// when it changed, nothing when it was already so; a bad value or a missing
// file fails as writeSysctl does, and changes nothing.
TEST_F(Sysctl, EnsureWritesOnlyWhatDiffersAndSaysWhatWasThere) {
  const std::string name = "net/ipv4/tcp_fwmark_accept";
  ASSERT_TRUE(ns_->run([&] { return writeSysctl(name, "0"); }).ok());
  auto first = ns_->get<std::optional<std::string>>([&] { return ensureSysctl(name, "1\n"); });
  ASSERT_TRUE(first.ok()) << first.error().message;
  ASSERT_TRUE(first->has_value()) << "it was 0";
  EXPECT_EQ(**first, "0");
  auto now = ns_->get<std::string>([&] { return readSysctl(name); });
  ASSERT_TRUE(now.ok()) << now.error().message;
  EXPECT_EQ(*now, "1");
  auto again = ns_->get<std::optional<std::string>>([&] { return ensureSysctl(name, "1"); });
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_FALSE(again->has_value()) << "already 1, yet reported as changed from " << **again;

  // (A new netns takes ip_forward from the host's, 0 or 1.)
  auto forwardBefore = ns_->get<std::string>([] { return readSysctl("net/ipv4/ip_forward"); });
  ASSERT_TRUE(forwardBefore.ok()) << forwardBefore.error().message;
  auto bad = ns_->get<std::optional<std::string>>([] { return ensureSysctl("net/ipv4/ip_forward", "banana"); });
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, EINVAL);
  EXPECT_EQ(bad.error().message, "write \"banana\" to /proc/sys/net/ipv4/ip_forward: Invalid argument");
  auto forward = ns_->get<std::string>([] { return readSysctl("net/ipv4/ip_forward"); });
  ASSERT_TRUE(forward.ok()) << forward.error().message;
  EXPECT_EQ(*forward, *forwardBefore) << "a refused value changed it";

  const std::string missing = "net/ipv4/conf/sluicenone0/accept_local";
  auto gone = ns_->get<std::optional<std::string>>([&] { return ensureSysctl(missing, "1"); });
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code, ENOENT);
  EXPECT_EQ(gone.error().message, "/proc/sys/" + missing + ": No such file or directory");
  EXPECT_EQ(ensureSysctl("../x", "1").error().code, EINVAL);
}

TEST_F(Sysctl, RejectsNamesOutsideProcSys) {
  for (const std::string name :
       {"", "/net/ipv4/ip_forward", "../../etc/passwd", "net/../../etc/passwd", "net//ipv4",
        "net/ipv4/"}) {
    auto r = readSysctl(name);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.error().code, EINVAL) << name;
    EXPECT_NE(r.error().message.find(name), std::string::npos) << r.error().message;
    EXPECT_FALSE(writeSysctl(name, "1").ok()) << name;
  }
}

}  // namespace
}  // namespace sluice
