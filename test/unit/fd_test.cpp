#include "base/fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <utility>

#include <gtest/gtest.h>

namespace sluice {
namespace {

bool isOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

int openDevNull() {
  int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  return fd;
}

TEST(Fd, DefaultIsEmpty) {
  Fd fd;
  EXPECT_FALSE(fd.valid());
  EXPECT_EQ(fd.get(), -1);
  Fd negative(-1);
  EXPECT_FALSE(negative.valid());
}

TEST(Fd, DestructorCloses) {
  int raw = openDevNull();
  {
    Fd fd(raw);
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(fd.get(), raw);
  }
  EXPECT_FALSE(isOpen(raw));
}

TEST(Fd, ReleaseGivesUpOwnership) {
  int raw = openDevNull();
  {
    Fd fd(raw);
    EXPECT_EQ(fd.release(), raw);
    EXPECT_FALSE(fd.valid());
    EXPECT_EQ(fd.release(), -1);
  }
  EXPECT_TRUE(isOpen(raw));
  ::close(raw);
}

TEST(Fd, ResetClosesOldAndAdoptsNew) {
  int a = openDevNull();
  int b = openDevNull();
  Fd fd(a);
  fd.reset(b);
  EXPECT_FALSE(isOpen(a));
  EXPECT_TRUE(isOpen(b));
  EXPECT_EQ(fd.get(), b);
  fd.reset();
  EXPECT_FALSE(isOpen(b));
  EXPECT_FALSE(fd.valid());
}

TEST(Fd, ResetToSameDescriptorKeepsItOpen) {
  int a = openDevNull();
  Fd fd(a);
  fd.reset(a);
  EXPECT_TRUE(isOpen(a));
  EXPECT_EQ(fd.get(), a);
}

TEST(Fd, MoveConstructTransfersOwnership) {
  int raw = openDevNull();
  Fd a(raw);
  Fd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_EQ(b.get(), raw);
  EXPECT_TRUE(isOpen(raw));
}

TEST(Fd, MoveAssignClosesTargetsOldDescriptor) {
  int x = openDevNull();
  int y = openDevNull();
  Fd a(x);
  Fd b(y);
  b = std::move(a);
  EXPECT_FALSE(isOpen(y));
  EXPECT_TRUE(isOpen(x));
  EXPECT_EQ(b.get(), x);
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move)
}

TEST(Fd, SelfMoveAssignKeepsDescriptor) {
  int raw = openDevNull();
  Fd a(raw);
  Fd& alias = a;
  a = std::move(alias);
  EXPECT_EQ(a.get(), raw);
  EXPECT_TRUE(isOpen(raw));
}

}  // namespace
}  // namespace sluice
