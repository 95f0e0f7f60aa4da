// Minimal leveled logging to stderr. Thread-safe: each message is formatted
// in its own buffer and written with one call.
//
//   PT_LOG(INFO) << "trained " << n << " steps";
//
// The minimum level comes from the PIPETRAIN_LOG_LEVEL environment variable
// (DEBUG, INFO, WARNING, ERROR; default INFO).
#ifndef PIPETRAIN_COMMON_LOGGING_H_
#define PIPETRAIN_COMMON_LOGGING_H_

#include <sstream>

namespace pipetrain {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// True when messages of `level` are printed.
bool LogEnabled(LogLevel level);

// Collects one message and writes it on destruction.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;

  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

namespace logging_internal {
// Lets the macro below discard a stream expression.
struct Voidify {
  void operator&(std::ostream&) {}
};
}  // namespace logging_internal

}  // namespace pipetrain

#define PT_LOG_LEVEL_DEBUG ::pipetrain::LogLevel::kDebug
#define PT_LOG_LEVEL_INFO ::pipetrain::LogLevel::kInfo
#define PT_LOG_LEVEL_WARNING ::pipetrain::LogLevel::kWarning
#define PT_LOG_LEVEL_ERROR ::pipetrain::LogLevel::kError

#define PT_LOG(level)                                                         \
  !::pipetrain::LogEnabled(PT_LOG_LEVEL_##level)                              \
      ? (void)0                                                               \
      : ::pipetrain::logging_internal::Voidify() &                            \
            ::pipetrain::LogMessage(PT_LOG_LEVEL_##level, __FILE__, __LINE__) \
                .stream()

#endif  // PIPETRAIN_COMMON_LOGGING_H_
