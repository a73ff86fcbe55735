#include "enroll/context.h"
#include "enroll/pins.h"
#include "enroll/registry.h"
#include "enroll/steps/steps.h"

namespace sluice {
namespace {

// sluice's program on one TC hook of one interface, first in line: a tcx
// link pinned in the pod's directory, or (legacy) a clsact filter.
class TcHookStep final : public Step {
 public:
  TcHookStep(TcIface iface, TcHook hook, ProgramFd program, bool ownsClsact)
      : iface_(iface), hook_(hook), program_(program), ownsClsact_(ownsClsact) {}

  std::string what() const override {
    std::string on = iface_.kind == TcIface::Host ? "the host-side veth"
                     : iface_.kind == TcIface::Lo ? "lo"
                                                  : "pod interface " + std::to_string(iface_.slot);
    return std::string("TC ") + tcHookName(hook_) + " hook on " + on;
  }
  Where where() const override { return iface_.kind == TcIface::Host ? Where::Node : Where::Pod; }

  Status apply(PodContext& c) override {
    Target t = target(c);
    if (!t.ifindex) return {};  // no host-side veth found: nothing to hook
    const int fd = (c.programs->*program_)();
    if (!legacy(c)) {
      Status st = attachTcx(t.ifindex, hook_, fd, t.pin);
      if (!st.ok() && st.error().code == EEXIST && tcxAttached(t.pin)) return {};  // applied already
      return st;
    }
    auto created = attachLegacy(t.ifindex, hook_, fd);
    SLUICE_TRY(created);
    if (*created) *t.createdClsact = 1;
    return {};
  }

  Status undo(PodContext& c) override {
    Target t = target(c);
    if (!t.ifindex) return {};
    if (!legacy(c)) return detachTcx(t.pin);
    return detachLegacy(t.ifindex, hook_, ownsClsact_ && *t.createdClsact);
  }

  // A tcx link is pinned: it goes wherever its netns is. A filter went
  // with its netns.
  Status forget(PodContext& c) override {
    Target t = target(c);
    if (!t.ifindex || legacy(c)) return {};
    return detachTcx(t.pin);
  }

  StepCheck check(PodContext& c) override {
    Target t = target(c);
    if (!t.ifindex) return StepCheck::inPlace();
    if (!present(c, t)) {
      if (iface_.kind == TcIface::Lo) return StepCheck::inPlace();
      return StepCheck::unknown((iface_.kind == TcIface::Host ? "host-side interface " : "interface ") + t.name +
                                " is gone");
    }
    uint32_t have = programIdAt(c, t);
    if (!have) return StepCheck::missing("no program attached at " + t.where);
    if (legacy(c) && legacyAtOldPriority(t.ifindex, hook_))
      return StepCheck::foreign("sluice's filter at " + t.where + " is at the old priority 0x51ce, after others");
    if (!legacy(c)) {
      auto pos = tcxPosition(t.ifindex, hook_, t.pin);
      if (pos.ok() && *pos > 0)
        return StepCheck::foreign(std::to_string(*pos) + " program(s) run before sluice's at " + t.where);
    }
    if (have != programId((c.programs->*program_)())) return StepCheck::foreign();
    return StepCheck::inPlace();
  }

  // sluice's program runs first (loader/tc.h): an earlier build's filter at
  // the old priority, or a program someone put in front of the link, moves
  // it back to the front (with this build's program); then the hook is
  // switched to this build's program in place.
  Result<int> adopt(PodContext& c) override {
    Target t = target(c);
    const int fd = (c.programs->*program_)();
    const uint32_t want = programId(fd);
    uint32_t have = programIdAt(c, t);
    int replaced = 0;
    bool moved = false;
    if (legacy(c) && legacyAtOldPriority(t.ifindex, hook_)) {
      SLUICE_TRY(moveLegacyToFront(t.ifindex, hook_, fd));
      moved = true;
    } else if (!legacy(c)) {
      if (auto pos = tcxPosition(t.ifindex, hook_, t.pin); pos.ok() && *pos > 0) {
        auto staging = c.services.staging();
        SLUICE_TRY(staging);
        SLUICE_TRY(moveTcxToFront(t.ifindex, hook_, fd, ((*staging)->*program_)(), t.pin));
        moved = true;
      }
    }
    if (moved) {
      if (have != want) replaced++;  // the moved hook runs this build's program
      have = programIdAt(c, t);
    }
    if (have != want) {
      Status st = legacy(c) ? replaceLegacyProgram(t.ifindex, hook_, fd) : updateTcx(t.pin, fd);
      if (!st.ok())
        return Error::msg("could not switch " + t.where + " to program " + std::to_string(want) + ": " +
                              st.error().message,
                          st.error().code);
      replaced++;
    }
    return replaced;
  }

 private:
  struct Target {
    int ifindex = 0;
    std::string name;
    std::string where;  ///< "eth0 ingress", "host-side veth1 egress"
    std::string pin;
    uint32_t* createdClsact = nullptr;
  };

  Target target(PodContext& c) const {
    Target t;
    sluice_pod_iface* slot = nullptr;
    if (iface_.kind == TcIface::Lo) {
      t.ifindex = static_cast<int>(c.rec.lo_ifindex);
      t.name = "lo";
      t.createdClsact = &c.rec.lo_created_clsact;
    } else {
      slot = iface_.kind == TcIface::Host ? &c.rec.host_iface : &c.rec.ifaces[iface_.slot];
      t.ifindex = static_cast<int>(slot->ifindex);
      t.name = ifaceName(*slot);
      t.createdClsact = &slot->created_clsact;
    }
    const bool host = iface_.kind == TcIface::Host;
    t.where = (host ? "host-side " : "") + t.name + " " + tcHookName(hook_);
    t.pin = host ? hostPin(c.linkDir, t.name, hook_) : tcxPin(c.linkDir, t.name, hook_);
    return t;
  }

  static bool legacy(const PodContext& c) { return c.rec.tc_mode == SLUICE_TC_LEGACY; }

  uint32_t programIdAt(const PodContext& c, const Target& t) const {
    return legacy(c) ? legacyProgramId(t.ifindex, hook_) : tcxProgramId(t.pin);
  }

  // The interface is still there under its name (the host side: in the
  // node netns the runner entered).
  bool present(PodContext& c, const Target& t) const {
    if (iface_.kind != TcIface::Host) return c.podLink(t.ifindex, t.name) != nullptr;
    auto links = listLinks();
    if (!links.ok()) return true;  // cannot tell: the hook check says the rest
    for (const auto& l : *links)
      if (l.ifindex == t.ifindex && l.name == t.name) return true;
    return false;
  }

  TcIface iface_;
  TcHook hook_;
  ProgramFd program_;
  bool ownsClsact_;
};

}  // namespace

std::unique_ptr<Step> tcHookStep(TcIface iface, TcHook hook, ProgramFd program, bool ownsClsact) {
  return std::make_unique<TcHookStep>(iface, hook, program, ownsClsact);
}

}  // namespace sluice
