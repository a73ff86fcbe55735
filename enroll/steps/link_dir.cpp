#include <sys/stat.h>

#include <cerrno>

#include "enroll/context.h"
#include "enroll/pins.h"
#include "enroll/steps/steps.h"
#include "loader/bpffs.h"

namespace sluice {
namespace {

class LinkDirStep final : public Step {
 public:
  std::string what() const override { return "pin directory"; }
  Where where() const override { return Where::Host; }
  Status apply(PodContext& c) override {
    for (const std::string& dir : {linksRoot(c.root), c.linkDir})
      if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Error::fromErrno(errno, "mkdir " + dir);
    return {};
  }
  Status undo(PodContext& c) override { return removeTree(c.linkDir); }
  StepCheck check(PodContext& c) override {
    struct stat st {};
    // A tc pod attached with clsact by an older build never had one.
    bool wanted = c.rec.capture == SLUICE_CAPTURE_SOCKET || c.rec.tc_mode != SLUICE_TC_LEGACY;
    if (!wanted || ::stat(c.linkDir.c_str(), &st) == 0) return StepCheck::inPlace();
    return StepCheck::missing("pin directory " + c.linkDir + " is missing");
  }
};

}  // namespace

std::unique_ptr<Step> linkDirStep() { return std::make_unique<LinkDirStep>(); }

}  // namespace sluice
