// Sets or clears an environment variable for one scope, and puts back what was
// there. For single-threaded test bodies: setenv is not thread-safe.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace ferry::test {

class ScopedEnv {
 public:
  // value nullptr: the variable is unset for the scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace ferry::test
