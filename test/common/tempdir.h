// A throw-away directory for tests, removed with its contents by the
// destructor (even when an assertion failed half way).
#pragma once

#include <string>

namespace sluice::test {

class TempDir {
 public:
  /// Creates /tmp/sluice-<tag>-XXXXXX; path() is empty if that failed.
  explicit TempDir(const std::string& tag);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  /// path()/name.
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Writes @p content to @p path (truncating); false on failure.
bool writeTextFile(const std::string& path, const std::string& content);
/// The whole file; "" when it can't be read.
std::string readTextFile(const std::string& path);

}  // namespace sluice::test
