// Pod UIDs out of cgroup paths (userspace/agent/kube/netns_finder.h), as
// kubelet names them with the cgroupfs and the systemd driver; the examples
// are the ones Istio's node agent documents and tests.
#include <gtest/gtest.h>

#include "userspace/agent/kube/netns_finder.h"

namespace sluice::kube {
namespace {

TEST(KubeCgroup, PodUidFromKubeletsNamings) {
  struct Case {
    const char* path;
    const char* uid;  // nullptr: no pod
  };
  const Case cases[] = {
      // cgroupfs driver, QoS classes and the guaranteed (no class) level.
      {"/kubepods/burstable/pod2c48913c-b29f-11e7-9350-020968147796/9bca8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961",
       "2c48913c-b29f-11e7-9350-020968147796"},
      {"/kubepods/besteffort/poddaa5c7ee-3484-4533-af39-3591564fd03e/aff34703e5e1", "daa5c7ee-3484-4533-af39-3591564fd03e"},
      {"/kubepods/pod0d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10/c1", "0d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10"},
      // Nested under another cgroup root (docker-in-docker, kind, a test parent).
      {"/docker/8d461fa5765781bcf5f7eb192f101bc3103d4b932e26236f43feecfa20664f96/kubepods/besteffort/poddaa5c7ee-3484-4533-af39-3591564fd03e/aff34703e5e1f89443e9a1bffcc80f43f74d4808a2dd22c8f88c08547b323934",
       "daa5c7ee-3484-4533-af39-3591564fd03e"},
      {"/../../pod2c48913c-b29f-11e7-9350-020968147796/9bca8d63d5fa", "2c48913c-b29f-11e7-9350-020968147796"},
      // systemd driver: '_' in the UID, .slice/.scope units.
      {"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2c48913c_b29f_11e7_9350_020968147796.slice/docker-9bca8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961.scope",
       "2c48913c-b29f-11e7-9350-020968147796"},
      {"/kubepods.slice/kubepods-pod0d5b0f3e_1b0e_4e0e_9d0c_3f1b2a6e7c10.slice/cri-containerd-abc123.scope",
       "0d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10"},
      {"/kubepods-besteffort-pod72f7f152_440c_66ac_9084_e0fc1d8a910c.slice:cri-containerd:b2a102854b4969b2ce98dc329c86b4fb2b06e4ad2cc8da9d8a7578c9cd2004a2",
       "72f7f152-440c-66ac-9084-e0fc1d8a910c"},
      // Separators are optional.
      {"/kubepods/pod0d5b0f3e1b0e4e0e9d0c3f1b2a6e7c10/c1", "0d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10"},
      // Not a pod's container.
      {"/", nullptr},
      {"/user.slice/user-0.slice/session-3.scope", nullptr},
      {"/kubepods/burstable/pod2c48913c-b29f-11e7-9350-020968147796", nullptr},  // the pod level, no container
      {"/kubepods/burstable/pod2c48913c-b29f-11e7-9350-020968147796/", nullptr},
      {"/kubepods/burstable/pod2c48913c-b29f-11e7-9350-02096814779/c1", nullptr},  // 11 digits
      {"/kubepods/burstable/pod2c48913c-b29f-11e7-9350-020968147796x/c1", nullptr},
      {"/kubepods/burstable/xpod2c48913c-b29f-11e7-9350-020968147796/c1", nullptr},
      {"0::/../crio-45490e76e0878aaa4d9808f7d2eefba37f093c3efbba9838b6d8ab804d9bd814.scope", nullptr},  // no UID in it
      {"/kubepods/burstable/pod2c48913c-b29f-11e7-9350-020968147796/a//b", nullptr},
  };
  for (const auto& c : cases) {
    auto uid = podUidFromCgroupPath(c.path);
    if (c.uid) {
      ASSERT_TRUE(uid.has_value()) << c.path;
      EXPECT_EQ(*uid, c.uid) << c.path;
    } else {
      EXPECT_FALSE(uid.has_value()) << c.path << " -> " << uid.value_or("");
    }
  }
}

TEST(KubeCgroup, PodUidFromAProcCgroupFile) {
  // Hybrid v1/v2 as on this machine kind: every hierarchy names the pod.
  auto hybrid = podUidFromCgroupFile(
      "9:name=systemd:/kubepods.slice/kubepods-pod0d5b0f3e_1b0e_4e0e_9d0c_3f1b2a6e7c10.slice/cri-containerd-c1.scope\n"
      "8:pids:/kubepods/pod0d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10/c1\n"
      "4:memory:/\n"
      "0::/kubepods/pod0d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10/c1\n");
  ASSERT_TRUE(hybrid.ok()) << hybrid.error().message;
  EXPECT_EQ(hybrid->value_or(""), "0d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10");

  auto none = podUidFromCgroupFile("0::/init.scope\n1:cpu:/\n");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  auto two = podUidFromCgroupFile(
      "1:pids:/kubepods/pod0d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10/c1\n0::/kubepods/pod1d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10/c1\n");
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.error().message,
            "cgroups name two pods (0d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10, 1d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10)");

  auto bad = podUidFromCgroupFile("garbage\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "cgroup line \"garbage\" is not ID:controllers:path");
}

}  // namespace
}  // namespace sluice::kube
