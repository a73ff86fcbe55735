#include "enroll/registry.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace sluice {

void copyString(char* dst, size_t cap, const std::string& s) {
  std::memset(dst, 0, cap);
  std::memcpy(dst, s.data(), std::min(s.size(), cap - 1));
}

std::string fromFixed(const char* s, size_t cap) { return std::string(s, strnlen(s, cap)); }

sluice_pod_id podKey(const std::string& id) {
  sluice_pod_id k{};
  copyString(k.id, sizeof(k.id), id);
  return k;
}

Result<sluice_pod_addr> parsePodAddr(const std::string& text) {
  sluice_pod_addr a{};
  if (inet_pton(AF_INET, text.c_str(), a.addr) == 1) {
    a.family = AF_INET;
    return a;
  }
  if (inet_pton(AF_INET6, text.c_str(), a.addr) == 1) {
    a.family = AF_INET6;
    return a;
  }
  return Error::msg("invalid pod address '" + text + "'", EINVAL);
}

std::string formatPodAddr(const sluice_pod_addr& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(a.family, a.addr, buf, sizeof(buf));
  return buf;
}

uint32_t captureFlags(bool dnsCapture, bool inboundCapture) {
  return (dnsCapture ? SLUICE_POD_DNS_CAPTURE : 0) | (inboundCapture ? SLUICE_POD_INBOUND_CAPTURE : 0);
}

bool sameConfig(const sluice_pod_config& a, const sluice_pod_config& b) {
  if (a.flags != b.flags || a.reroute_count != b.reroute_count) return false;
  for (uint32_t i = 0; i < a.reroute_count && i < SLUICE_MAX_REROUTE_IFACES; i++)
    if (a.reroute_ifindex[i] != b.reroute_ifindex[i]) return false;
  return true;
}

void recordIdentity(sluice_pod_record& rec, const PodIdentity& id) {
  copyString(rec.identity.uid, sizeof(rec.identity.uid), id.uid);
  copyString(rec.identity.name, sizeof(rec.identity.name), id.name);
  copyString(rec.identity.ns, sizeof(rec.identity.ns), id.ns);
  copyString(rec.identity.service_account, sizeof(rec.identity.service_account), id.serviceAccount);
}

void recordHandoff(sluice_pod_record& rec, HandoffState state, const std::string& error) {
  rec.handoff.state = state == HandoffState::Acked    ? SLUICE_HANDOFF_ACKED
                      : state == HandoffState::Failed ? SLUICE_HANDOFF_FAILED
                                                      : SLUICE_HANDOFF_NONE;
  copyString(rec.handoff.error, sizeof(rec.handoff.error), error);
  rec.handoff.at_ns = nowNs();
}

PodInfo podInfoFromRecord(const std::string& id, const sluice_pod_record& rec) {
  PodInfo p;
  p.id = id;
  p.netnsPath = netnsPathOf(rec);
  p.netnsCookie = rec.netns_cookie;
  p.capture = rec.capture == SLUICE_CAPTURE_SOCKET ? "socket" : "tc";
  p.tcMode = rec.tc_mode == SLUICE_TC_LEGACY ? "legacy" : "tcx";
  p.dnsCapture = rec.config.flags & SLUICE_POD_DNS_CAPTURE;
  p.inboundCapture = rec.config.flags & SLUICE_POD_INBOUND_CAPTURE;
  p.ipv6Routes = rec.routes & SLUICE_ROUTES_V6;
  p.enrolledAtNs = rec.enrolled_at_ns;
  for (uint32_t i = 0; i < rec.iface_count && i < SLUICE_MAX_POD_IFACES; i++) {
    std::string name = ifaceName(rec.ifaces[i]);
    p.interfaces.push_back(name);
    for (uint32_t r = 0; r < rec.config.reroute_count && r < SLUICE_MAX_REROUTE_IFACES; r++)
      if (rec.config.reroute_ifindex[r] == rec.ifaces[i].ifindex) p.rerouteIfaces.push_back(name);
  }
  if (rec.host_iface.ifindex) p.hostIface = ifaceName(rec.host_iface);
  p.nodeNetnsPath = nodeNetnsPathOf(rec);
  for (uint32_t i = 0; i < rec.addr_count && i < SLUICE_MAX_POD_ADDRS; i++) p.ips.push_back(formatPodAddr(rec.addrs[i]));
  p.identity.uid = fromFixed(rec.identity.uid, sizeof(rec.identity.uid));
  p.identity.name = fromFixed(rec.identity.name, sizeof(rec.identity.name));
  p.identity.ns = fromFixed(rec.identity.ns, sizeof(rec.identity.ns));
  p.identity.serviceAccount = fromFixed(rec.identity.service_account, sizeof(rec.identity.service_account));
  p.handoff = rec.handoff.state == SLUICE_HANDOFF_ACKED    ? HandoffState::Acked
              : rec.handoff.state == SLUICE_HANDOFF_FAILED ? HandoffState::Failed
                                                           : HandoffState::None;
  p.handoffError = fromFixed(rec.handoff.error, sizeof(rec.handoff.error));
  p.handoffAtNs = rec.handoff.at_ns;
  return p;
}

std::string describeConfig(const PodInfo& p) {
  std::string s = std::string("dns-capture ") + (p.dnsCapture ? "on" : "off") + ", inbound-capture " +
                  (p.inboundCapture ? "on" : "off");
  for (const auto& r : p.rerouteIfaces) s += ", reroute-iface " + r;
  return s;
}

std::string describeIdentity(const PodIdentity& id) {
  if (id.empty()) return "no identity";
  return "uid '" + id.uid + "', " + id.ns + "/" + id.name;
}

Error otherSettingsError(const PodInfo& enrolled) {
  return Error::msg("pod '" + enrolled.id + "' is already enrolled with other settings (" + describeConfig(enrolled) +
                        "); remove it first",
                    EEXIST);
}

sluice_pod_sock podSockValue(const sluice_pod_record& rec, const std::vector<sluice_pod_addr>& addrs) {
  sluice_pod_sock v{};
  v.flags = rec.config.flags;
  v.reroute_count = rec.config.reroute_count;
  std::memcpy(v.reroute_ifindex, rec.config.reroute_ifindex, sizeof(v.reroute_ifindex));
  for (const auto& a : addrs) {
    if (a.family == AF_INET && v.v4_count < SLUICE_SOCK_POD_ADDRS)
      std::memcpy(&v.v4[v.v4_count++], a.addr, 4);
    else if (a.family == AF_INET6 && v.v6_count < SLUICE_SOCK_POD_ADDRS)
      std::memcpy(v.v6[v.v6_count++], a.addr, 16);
  }
  return v;
}

uint64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace sluice
