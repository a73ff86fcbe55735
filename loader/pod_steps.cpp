#include "loader/pod_steps.h"

namespace sluice {

Status applySteps(const std::vector<PodStep>& steps) {
  for (size_t i = 0; i < steps.size(); i++) {
    Status st = steps[i].apply();
    if (st.ok()) continue;
    for (size_t j = i; j-- > 0;) (void)steps[j].undo();
    return Error::msg(steps[i].what + ": " + st.error().message, st.error().code);
  }
  return {};
}

Status undoSteps(const std::vector<PodStep>& steps) {
  Status first;
  for (size_t j = steps.size(); j-- > 0;) {
    Status st = steps[j].undo();
    if (!st.ok() && first.ok()) first = Error::msg(steps[j].what + ": " + st.error().message, st.error().code);
  }
  return first;
}

std::vector<std::string> stepsNotInPlace(const std::vector<PodStep>& steps) {
  std::vector<std::string> out;
  for (const auto& s : steps) {
    auto in = s.inPlace();
    if (!in.ok())
      out.push_back(s.what + " (cannot tell: " + in.error().message + ")");
    else if (!*in)
      out.push_back(s.what);
  }
  return out;
}

}  // namespace sluice
