#include "test/common/agent_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "test/common/topology.h"

extern char** environ;

namespace sluice::test {

namespace {

std::string uniqueTmp(const std::string& what) {
  static std::atomic<int> n{0};
  return "/tmp/sluice-t-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

}  // namespace

Result<pid_t> spawnWithLog(const std::vector<std::string>& argv, const std::string& logPath) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return Error::fromErrno(rc, "spawn " + argv[0]);
  return pid;
}

int waitExit(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

namespace {

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

Result<std::unique_ptr<AgentProcess>> AgentProcess::start(const std::string& bpffsRoot, std::vector<std::string> extra,
                                                          std::string socket, const std::string& netnsPath,
                                                          const std::string& binary,
                                                          const std::vector<std::string>& wrapper) {
  std::unique_ptr<AgentProcess> p(new AgentProcess());
  p->ownsSocketName_ = socket.empty();
  p->socket_ = socket.empty() ? uniqueTmp("agent") + ".sock" : socket;
  p->logPath_ = uniqueTmp("agent") + ".log";
  std::vector<std::string> argv = wrapper;
  if (!netnsPath.empty())
    for (const std::string& a : {std::string("/usr/bin/nsenter"), "--net=" + netnsPath, std::string("--")})
      argv.push_back(a);  // execs: same pid
  for (const std::string& a : {binary.empty() ? builtBinary("sluiced") : binary, std::string("--bpffs"), bpffsRoot, std::string("--socket"),
                               p->socket_, std::string("--metrics-address"), std::string("off"),
                               std::string("--reconcile-interval"), std::string("0"), std::string("--log-level"),
                               std::string("debug")})
    argv.push_back(a);
  // This build's agent leaves the pod guard off, as the test harness does
  // (DatapathOptions::podGuard): an older release does not know the flag.
  if (binary.empty()) argv.insert(argv.end(), {std::string("--pod-guard"), std::string("off")});
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto pid = spawnWithLog(argv, p->logPath_);
  SLUICE_TRY(pid);
  p->pid_ = *pid;
  // Ready when it answers health (it reconciles before listening).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    auto c = agent::Client::connect(p->socket_, std::chrono::seconds(5));
    if (c.ok() && c->health().ok()) return p;
    int st = 0;
    if (::waitpid(p->pid_, &st, WNOHANG) == p->pid_) {
      p->pid_ = -1;
      return Error::msg("sluiced exited during start-up: " + p->log(), ECHILD);
    }
    if (std::chrono::steady_clock::now() > deadline) return Error::msg("sluiced did not answer within 30 s: " + p->log(), ETIMEDOUT);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

AgentProcess::~AgentProcess() {
  if (pid_ > 0) stop(SIGKILL);
  if (ownsSocketName_) ::unlink(socket_.c_str());
  ::unlink(logPath_.c_str());
}

Result<agent::Client> AgentProcess::client() const { return agent::Client::connect(socket_); }

bool waitForKubeSync(const AgentProcess& agent, std::chrono::milliseconds timeout) {
  return eventually([&] {
    auto c = agent.client();
    if (!c.ok()) return false;
    auto h = c->health();
    return h.ok() && h->kubeSynced;
  }, timeout);
}

int AgentProcess::stop(int sig, std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, sig);
  int code = waitExit(pid_, timeout);
  if (code < 0) {
    ::kill(pid_, SIGKILL);
    code = waitExit(pid_, std::chrono::seconds(10));
  }
  pid_ = -1;
  return code;
}

std::string AgentProcess::log() const { return readFile(logPath_); }

uint16_t freeLoopbackPort() {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return 0;
  return ntohs(a.sin_port);
}

AgentRun runAgentExpectingExit(const std::vector<std::string>& args, std::chrono::milliseconds timeout,
                                const std::vector<std::string>& wrapper) {
  AgentRun r;
  std::string logPath = uniqueTmp("agent-run") + ".log";
  std::vector<std::string> argv = wrapper;
  argv.push_back(builtBinary("sluiced"));
  argv.insert(argv.end(), args.begin(), args.end());
  auto pid = spawnWithLog(argv, logPath);
  if (!pid.ok()) {
    r.log = pid.error().message;
    ::unlink(logPath.c_str());  // the child may have opened it before its exec failed
    return r;
  }
  r.exitCode = waitExit(*pid, timeout);
  if (r.exitCode < 0) {
    ::kill(*pid, SIGKILL);
    waitExit(*pid, std::chrono::seconds(5));
  }
  r.log = readFile(logPath);
  ::unlink(logPath.c_str());
  return r;
}

}  // namespace sluice::test
