#pragma once
// loom::Error: the one exception type (OutOfMemory a kind of it); its message names the
// file/key/value and what would be valid.
#include <exception>
#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Memory ran out (the host's or a device's allocator): the message says which and how much; the
// command that ran out adds what to change (a training run: cli/memory_advice.h).
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// Throws loom::Error(message) when `condition` is false. The message is built only then, so a
// check on a hot path costs one branch, and a message that reads data the condition guards
// (a key that may be missing) is safe.
#define LOOM_CHECK(condition, ...)                                    \
  do {                                                                \
    if (!(condition)) [[unlikely]] throw ::loom::Error(__VA_ARGS__); \
  } while (0)

// The message of a captured exception (for reporting another thread's or rank's failure).
inline std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace loom
