#include "enroll/runner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>

#include "enroll/discover.h"
#include "enroll/registry.h"
#include "loader/netns.h"

namespace sluice {

namespace {

// Runs @p fn where steps of @p where work: in the pod's netns (its cookie
// checked, unless the record has none yet), in the node netns, or here.
// nullopt: that netns is gone.
std::optional<Status> inGroup(PodContext& c, Where where, const std::function<Status()>& fn) {
  if (where == Where::Host) return fn();
  const bool pod = where == Where::Pod;
  uint64_t want = pod ? c.rec.netns_cookie : c.rec.node_netns_cookie;
  Fd opened;
  if (pod && c.heldPodNetns.valid()) {
    want = 0;  // the fd discovery read the cookie through
  } else {
    std::string path = pod ? netnsPathOf(c.rec) : nodeNetnsPathOf(c.rec);
    if (!pod && path.empty()) path = "/proc/self/ns/net";
    auto ns = openNetns(path);
    if (!ns.ok()) {
      if (ns.error().code == ENOENT) return std::nullopt;
      return Error::msg((pod ? "" : "node ") + ns.error().message, ns.error().code);
    }
    opened = std::move(*ns);
  }
  const int nsfd = opened.valid() ? opened.get() : c.heldPodNetns.get();
  bool gone = false;
  Status st = runInNetns(nsfd, [&]() -> Status {
    if (want) {
      auto cookie = currentNetnsCookie();
      SLUICE_TRY(cookie);
      if (*cookie != want) {
        gone = true;
        return {};
      }
    }
    if (!pod) return fn();
    c.inPodNetns = true;
    c.podNetnsFd = nsfd;
    Status r = fn();
    c.inPodNetns = false;
    c.podNetnsFd = -1;
    c.podLinks.reset();  // listed again at the next entry
    return r;
  });
  if (gone) return std::nullopt;
  return st;
}

// The end of the group that starts at @p begin.
size_t groupEnd(const Plan& plan, size_t begin) {
  size_t end = begin + 1;
  while (end < plan.size() && plan[end]->where() == plan[begin]->where()) end++;
  return end;
}

Error named(const Step& s, const Error& e) {
  if (!s.namesItsErrors()) return e;
  return Error::msg(s.what() + ": " + e.message, e.code);
}

// Undoes steps [0, end) in reverse, group by group.
Status undoUpTo(const Plan& plan, size_t end, PodContext& c) {
  Status first;
  auto keep = [&](const Status& s) {
    if (!s.ok() && first.ok()) first = s;
    if (!s.ok()) c.undoFailed = true;
  };
  // Groups from the last: [b, e) with e == end first.
  std::vector<std::pair<size_t, size_t>> groups;
  for (size_t b = 0; b < end;) {
    size_t e = std::min(groupEnd(plan, b), end);
    groups.emplace_back(b, e);
    b = e;
  }
  for (auto g = groups.rbegin(); g != groups.rend(); ++g) {
    auto [b, e] = *g;
    auto undoAll = [&](bool netnsGone) -> Status {
      for (size_t i = e; i-- > b;) {
        Status st = netnsGone ? plan[i]->forget(c) : plan[i]->undo(c);
        if (!st.ok()) keep(named(*plan[i], st.error()));
      }
      return {};
    };
    auto ran = inGroup(c, plan[b]->where(), [&] { return undoAll(false); });
    if (!ran) {
      if (plan[b]->where() == Where::Pod)
        spdlog::info("pod {}: netns {} is gone; its attachments went with it", c.id, netnsPathOf(c.rec));
      undoAll(true);
    } else if (!ran->ok()) {
      keep(*ran);
      undoAll(true);  // what outlives the netns still goes
    }
  }
  return first;
}

}  // namespace

Status inPodNetns(PodContext& c, const std::function<Status()>& fn) {
  auto ran = inGroup(c, Where::Pod, fn);
  if (!ran) return Error::msg("pod '" + c.id + "': " + netnsPathOf(c.rec) + " is gone or names another netns now", ESTALE);
  return *ran;
}

Status applyPlan(const Plan& plan, PodContext& c) {
  size_t applied = 0;
  Status failed;
  for (size_t b = 0; b < plan.size() && failed.ok();) {
    size_t e = groupEnd(plan, b);
    auto ran = inGroup(c, plan[b]->where(), [&]() -> Status {
      for (; applied < e; applied++) {
        Status st = plan[applied]->apply(c);
        if (!st.ok()) return named(*plan[applied], st.error());
      }
      return {};
    });
    if (!ran && plan[b]->where() == Where::Node)
      failed = Error::msg("node netns " + nodeNetnsPathOf(c.rec) + " is gone", ENOENT);
    else if (!ran)
      failed = Error::msg("pod " + c.id + ": its netns went away while it was enrolled", ENOENT);
    else if (!ran->ok()) failed = *ran;
    b = e;
  }
  if (failed.ok()) failed = c.saveRecord();
  if (failed.ok()) return {};
  (void)undoUpTo(plan, applied, c);
  return failed;
}

Status undoPlan(const Plan& plan, PodContext& c) { return undoUpTo(plan, plan.size(), c); }

namespace {

// One step's check, and with @p repair its mending, into @p out.
void checkStep(Step& step, PodContext& c, bool repair, PodCheck& out) {
  StepCheck found = step.check(c);
  auto note = [&](const std::string& p) {
    if (std::find(out.problems.begin(), out.problems.end(), p) == out.problems.end()) out.problems.push_back(p);
  };
  for (const auto& p : found.problems) note(p);
  if (!repair || found.state == StepState::InPlace || found.state == StepState::Unknown) return;
  Status st;
  if (found.state == StepState::Missing) {
    st = step.apply(c);
  } else {
    auto n = step.adopt(c);
    if (n.ok()) out.programsReplaced += *n;
    else st = n.error();
  }
  if (st.ok()) {
    for (const auto& p : found.problems) {
      out.repaired.push_back(p);
      spdlog::info("pod {}: repaired: {}", c.id, p);
    }
    return;
  }
  if (found.problems.empty()) {
    out.problems.push_back(st.error().message);
    return;
  }
  for (const auto& p : found.problems) {
    auto it = std::find(out.problems.begin(), out.problems.end(), p);
    if (it != out.problems.end()) *it += " (repair failed: " + st.error().message + ")";
    spdlog::warn("pod {}: could not repair {}: {}", c.id, p, st.error().message);
  }
}

}  // namespace

PodCheck checkPlan(const Plan& plan, PodContext& c, bool repair) {
  PodCheck out;
  out.id = c.id;
  // A pod whose netns is gone is only that: nothing is checked, nothing mended.
  auto gone = recordedNetnsGone(c.rec);
  if (!gone.ok() || *gone) {
    out.gone = gone.ok();
    if (!gone.ok()) out.problems.push_back(gone.error().message);
    return out;
  }
  for (size_t b = 0; b < plan.size();) {
    const size_t e = groupEnd(plan, b);
    const Where where = plan[b]->where();
    auto ran = inGroup(c, where, [&]() -> Status {
      if (where == Where::Pod && c.rec.capture == SLUICE_CAPTURE_SOCKET) (void)findSockAddrs(c);
      for (size_t i = b; i < e; i++) checkStep(*plan[i], c, repair, out);
      return {};
    });
    b = e;
    if (ran && !ran->ok()) {
      out.problems.push_back(ran->error().message);
    } else if (!ran && where == Where::Pod) {
      out.gone = true;  // went away just now
      return out;
    } else if (!ran) {
      out.problems.push_back("node netns of host-side " + ifaceName(c.rec.host_iface) + " is another one now");
    }
  }
  return out;
}

Status applySettings(const Plan& plan, PodContext& c, const sluice_pod_record& before) {
  std::vector<Step*> following;
  for (const auto& s : plan)
    if (s->followsSettings()) following.push_back(s.get());
  for (size_t i = 0; i < following.size(); i++) {
    Status st = following[i]->apply(c);
    if (st.ok()) continue;
    sluice_pod_record wanted = c.rec;
    c.rec = before;
    for (size_t j = 0; j < i; j++) (void)following[j]->apply(c);
    c.rec = wanted;
    return named(*following[i], st.error());
  }
  return {};
}

}  // namespace sluice
