// Move-only owner of a file descriptor.
#pragma once

#include <unistd.h>

#include <utility>

namespace sluice {

/// Owns one file descriptor and closes it on destruction. Move-only; -1
/// means "holds nothing".
class Fd {
 public:
  /// An empty Fd (holds nothing).
  Fd() = default;

  /// Takes ownership of @p fd (may be -1).
  explicit Fd(int fd) : fd_(fd) {}

  ~Fd() { reset(); }

  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  /// Takes ownership of @p other's descriptor, leaving @p other empty.
  Fd(Fd&& other) noexcept : fd_(other.release()) {}

  /// Closes the current descriptor, then takes ownership of @p other's.
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }

  /// The descriptor, still owned by this object (-1 when empty).
  int get() const { return fd_; }

  /// True when a descriptor is held.
  bool valid() const { return fd_ >= 0; }

  /// Gives up ownership without closing; returns the descriptor (or -1).
  [[nodiscard]] int release() {
    return std::exchange(fd_, -1);
  }

  /// Closes the held descriptor, if any, and takes ownership of @p fd.
  void reset(int fd = -1) {
    // Never retry close() on EINTR: on Linux the descriptor is already gone
    // and a retry could close one another thread has just been given.
    if (fd_ >= 0 && fd_ != fd) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace sluice
