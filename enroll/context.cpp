#include "enroll/context.h"

#include "enroll/registry.h"

namespace sluice {

Result<NetlinkSocket*> PodContext::podNetlink() {
  if (nl_) return &*nl_;
  if (!inPodNetns) return Error::msg("pod " + id + ": netlink asked for outside its netns", EINVAL);
  auto nl = NetlinkSocket::open();
  SLUICE_TRY(nl);
  nl_.emplace(std::move(*nl));
  return &*nl_;
}

Result<const std::vector<LinkInfo>*> PodContext::podInterfaces() {
  if (podLinks) return &*podLinks;
  auto nl = podNetlink();
  SLUICE_TRY(nl);
  auto links = listLinksOn(**nl);
  SLUICE_TRY(links);
  podLinks = std::move(*links);
  return &*podLinks;
}

const LinkInfo* PodContext::podLink(int ifindex, const std::string& name) {
  auto links = podInterfaces();
  if (!links.ok()) return nullptr;
  for (const auto& l : **links)
    if (l.ifindex == ifindex && l.name == name) return &l;
  return nullptr;
}

Status PodContext::saveRecord() { return programs->pods.update(podKey(id), rec); }

}  // namespace sluice
