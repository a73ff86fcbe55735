#include "istio/command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/fd.h"

extern char** environ;

namespace sluice::istio {
namespace {

std::string findProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  std::string path = ::getenv("PATH") ? ::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";
  size_t at = 0;
  while (at <= path.size()) {
    size_t end = path.find(':', at);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(at, end - at);
    if (!dir.empty()) {
      std::string full = dir + "/" + name;
      if (::access(full.c_str(), X_OK) == 0) return full;
    }
    at = end + 1;
  }
  return "";
}

}  // namespace

Result<CommandOutput> runCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                                 const std::string& input) {
  if (argv.empty()) return Error::msg("runCommand: no program", EINVAL);
  // Written whole before the child reads: it must fit the pipe's buffer.
  if (input.size() > 65536) return Error::msg(argv[0] + ": input of " + std::to_string(input.size()) + " bytes is over 64 KiB", E2BIG);
  const std::string prog = findProgram(argv[0]);
  if (prog.empty()) return Error::msg(argv[0] + ": not installed", ENOENT);
  int outPipe[2], errPipe[2];
  if (::pipe2(outPipe, O_CLOEXEC) != 0) return Error::fromErrno(errno, "pipe");
  Fd outR(outPipe[0]), outW(outPipe[1]);
  if (::pipe2(errPipe, O_CLOEXEC) != 0) return Error::fromErrno(errno, "pipe");
  Fd errR(errPipe[0]), errW(errPipe[1]);
  Fd inR, inW;
  if (!input.empty()) {
    int inPipe[2];
    if (::pipe2(inPipe, O_CLOEXEC) != 0) return Error::fromErrno(errno, "pipe");
    inR = Fd(inPipe[0]);
    inW = Fd(inPipe[1]);
    (void)::fcntl(inW.get(), F_SETPIPE_SZ, 65536);
    ssize_t wrote = ::write(inW.get(), input.data(), input.size());
    if (wrote != static_cast<ssize_t>(input.size())) return Error::fromErrno(wrote < 0 ? errno : EAGAIN, "write " + argv[0] + "'s input");
    inW.reset();  // EOF after the input
  }

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (inR.valid())
    posix_spawn_file_actions_adddup2(&fa, inR.get(), 0);
  else
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, outW.get(), 1);
  posix_spawn_file_actions_adddup2(&fa, errW.get(), 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, prog.c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Error::fromErrno(rc, "run " + argv[0]);
  outW.reset();
  errW.reset();
  inR.reset();

  CommandOutput r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timedOut = false;
  pollfd fds[2] = {{outR.get(), POLLIN, 0}, {errR.get(), POLLIN, 0}};
  int open = 2;
  while (open > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timedOut = true;
      break;
    }
    int n = ::poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[8192];
      ssize_t got = ::read(fds[i].fd, buf, sizeof(buf));
      if (got > 0) {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        fds[i].fd = -1;
        open--;
      }
    }
  }
  if (timedOut) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timedOut) return Error::msg(argv[0] + ": no answer in " + std::to_string(timeout.count()) + " ms", ETIMEDOUT);
  r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace sluice::istio
