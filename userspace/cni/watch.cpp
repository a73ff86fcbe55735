#include "userspace/cni/watch.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "userspace/cni/install.h"

namespace sluice::cni {

namespace {

using Clock = std::chrono::steady_clock;

bool isConfigName(const std::string& name) {
  auto endsWith = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  // Hidden names are temporary files (ours included), never loaded.
  return !name.empty() && name[0] != '.' && (endsWith(".conf") || endsWith(".conflist") || endsWith(".json"));
}

// More restorations than this within kLoopWindow: something keeps undoing
// them (Istio's installer warns the same way, e.g. Cilium's cni.exclusive).
constexpr int kLoopRestores = 5;
constexpr auto kLoopWindow = std::chrono::seconds(10);

// After an event, others of the same change (a writer's create, write,
// rename) are let in before the one check.
constexpr int kSettleMs = 10;

}  // namespace

Result<std::optional<Ensured>> ensureInChain(const std::string& confDir, const std::string& agentSocket,
                                             const ConfMode& mode) {
  auto plan = planChain(confDir, agentSocket, mode);
  if (!plan.ok()) {
    if (plan.error().code != ENOENT) return plan.error();
    // No primary (yet, or any more): nothing to join; an owned copy of a
    // primary that is gone goes with it.
    if (!mode.owned || !mode.chained) return std::optional<Ensured>();
    const std::string owned = confDir + "/" + mode.ownedName;
    if (::unlink(owned.c_str()) != 0) {
      if (errno == ENOENT) return std::optional<Ensured>();
      return Error::fromErrno(errno, "remove " + owned);
    }
    return std::optional<Ensured>(Ensured{owned, "removed " + owned + ": its primary CNI configuration is gone"});
  }
  if (!plan->changes()) return std::optional<Ensured>();
  SLUICE_TRY(writeChain(*plan));
  Ensured e{plan->path, ""};
  if (!mode.chained)
    e.what = "wrote the standalone network config " + plan->path + " back";
  else if (mode.owned)
    e.what = "rewrote " + plan->path + " from " + plan->primary + " (its plugins then sluice-cni)";
  else if (!plan->replaces.empty())
    e.what = "converted " + plan->replaces + " to " + plan->path + " with sluice-cni at the end of the plugin chain";
  else
    e.what = "put sluice-cni back at the end of the plugin chain in " + plan->path;
  return std::optional<Ensured>(std::move(e));
}

Result<std::unique_ptr<ConfWatcher>> ConfWatcher::start(WatchOptions options, Callback onEvent) {
  struct stat st {};
  if (options.confDir.empty() || ::stat(options.confDir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Error::msg("--cni-conf-dir " + options.confDir + " is not a directory", ENOENT);
  std::unique_ptr<ConfWatcher> w(new ConfWatcher(std::move(options), std::move(onEvent)));
  w->inotify_ = Fd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!w->inotify_.valid()) return Error::fromErrno(errno, "inotify_init1");
  w->stop_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!w->stop_.valid()) return Error::fromErrno(errno, "eventfd");
  // Watch first, then check: a rewrite in between is seen either way.
  SLUICE_TRY(w->addWatch());
  w->check(std::nullopt);
  spdlog::info("watching {} to keep sluice-cni in the primary CNI configuration{}", w->options_.confDir,
               !w->options_.mode.chained ? " (unchained: its standalone config)"
               : w->options_.mode.owned  ? " (in its own conflist " + w->options_.mode.ownedName + ")"
                                         : std::string());
  w->thread_ = std::thread([p = w.get()] { p->run(); });
  return w;
}

ConfWatcher::~ConfWatcher() { stop(); }

void ConfWatcher::stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!::write(stop_.get(), &one, sizeof(one));
  thread_.join();
}

Status ConfWatcher::addWatch() {
  // IN_CLOSE_WRITE, not IN_MODIFY: a file being written is read once it is
  // complete. IN_MOVED_TO: atomic writers rename a temporary file over it.
  wd_ = ::inotify_add_watch(inotify_.get(), options_.confDir.c_str(),
                            IN_CLOSE_WRITE | IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_DELETE_SELF |
                                IN_MOVE_SELF | IN_ONLYDIR);
  if (wd_ < 0) return Error::fromErrno(errno, "inotify_add_watch " + options_.confDir);
  return {};
}

void ConfWatcher::check(std::optional<Clock::time_point> changedAt) {
  auto r = ensureInChain(options_.confDir, options_.agentSocket, options_.mode);
  WatchEvent ev;
  if (!r.ok()) {
    ev.message = r.error().message + "; nothing written";
    if (ev.message != lastError_) spdlog::error("CNI configuration: {}", ev.message);
    lastError_ = ev.message;
    onEvent_(ev);
    return;
  }
  lastError_.clear();
  if (!*r) return;
  ev.restored = true;
  ev.file = (*r)->file;
  if (changedAt) ev.delay = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - *changedAt);
  const bool inPlace = (*r)->what.starts_with("put sluice-cni back");
  const std::string after = fmt::format("{:.1f} ms after the change", ev.delay.count() / 1000.0);
  ev.message = (*r)->what + (changedAt ? (inPlace ? " (it was rewritten without it; " : " (") + after + ")"
                                       : std::string(inPlace ? " (it was missing at start)" : " (at start)"));
  spdlog::warn("{}", ev.message);
  auto now = Clock::now();
  if (now - windowStart_ > kLoopWindow) {
    windowStart_ = now;
    restoresInWindow_ = 0;
  }
  if (++restoresInWindow_ == kLoopRestores + 1)
    spdlog::warn("sluice-cni was removed from {} more than {} times within {} s: another component keeps rewriting "
                 "it (a CNI that owns the whole directory, such as Cilium with cni.exclusive=true?)",
                 ev.file, kLoopRestores, std::chrono::duration_cast<std::chrono::seconds>(kLoopWindow).count());
  onEvent_(ev);
}

void ConfWatcher::run() {
  alignas(inotify_event) char buf[16 * (sizeof(inotify_event) + NAME_MAX + 1)];
  for (;;) {
    pollfd fds[2] = {{inotify_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    // The directory itself may vanish (a volume re-mounted); then it is
    // looked for again every second.
    int timeout = wd_ < 0 ? 1000 : static_cast<int>(options_.resync.count());
    int n = ::poll(fds, 2, timeout);
    if (n < 0 && errno != EINTR) {
      spdlog::error("CNI configuration watch: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents) return;
    if (n <= 0) {
      if (wd_ < 0 && addWatch().ok()) spdlog::info("watching {} again", options_.confDir);
      if (wd_ >= 0) check(std::nullopt);
      continue;
    }
    bool relevant = false;
    auto changedAt = Clock::now();
    // Drain this change's burst of events.
    for (bool more = true; more;) {
      ssize_t len = ::read(inotify_.get(), buf, sizeof(buf));
      if (len <= 0) {
        pollfd again = {inotify_.get(), POLLIN, 0};
        more = ::poll(&again, 1, kSettleMs) > 0;
        continue;
      }
      for (char* p = buf; p < buf + len;) {
        auto* e = reinterpret_cast<inotify_event*>(p);
        p += sizeof(inotify_event) + e->len;
        if (e->mask & IN_Q_OVERFLOW) relevant = true;  // events lost: check anyway
        if (e->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF)) {
          if (wd_ >= 0) spdlog::warn("CNI configuration directory {} went away; waiting for it", options_.confDir);
          if (wd_ >= 0 && !(e->mask & IN_IGNORED)) (void)::inotify_rm_watch(inotify_.get(), wd_);
          wd_ = -1;
          continue;
        }
        if (e->len && isConfigName(e->name)) relevant = true;
      }
    }
    if (relevant && wd_ >= 0) check(changedAt);
  }
}

}  // namespace sluice::cni
