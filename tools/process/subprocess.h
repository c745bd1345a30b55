// Child processes for the demo, benchmarks and multi-process tests: spawn with piped stdin and
// stdout, read stdout line by line with a timeout, signal, and reap with a timeout (killing what
// overstays). A child never outlives the Subprocess object: the destructor kills and reaps it.
#ifndef KVRAIL_TOOLS_PROCESS_SUBPROCESS_H_
#define KVRAIL_TOOLS_PROCESS_SUBPROCESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvrail::process {

class Subprocess {
 public:
  // Starts argv[0] (a path; no PATH search unless it has no '/') with `env` added to this
  // process's environment. stderr is inherited, so a child's errors land in the test log.
  // With `stderr_path`, the child's stderr is appended to that file instead.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
      const std::string& stderr_path = "");

  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // The next line of stdout without its '\n', waiting at most `timeout`. DeadlineExceeded on
  // timeout, OutOfRange at end of stream (the child closed stdout or exited).
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);
  // Reads lines until one starts with `prefix`, returning the rest of it.
  absl::StatusOr<std::string> ReadUntil(const std::string& prefix, absl::Duration timeout);
  // Everything read so far (for failure messages).
  const std::string& transcript() const { return transcript_; }

  // Writes `text` to the child's stdin; false when it is closed or the child is gone. (Callers
  // should ignore SIGPIPE.)
  bool WriteStdin(const std::string& text);
  // Closes the child's stdin (a polite "stop" for children that wait on it).
  void CloseStdin();
  void Signal(int signal);

  // Waits for the child to exit: its exit code, or 128 + signal when a signal ended it.
  // DeadlineExceeded when it is still running after `timeout` (then it is left running).
  absl::StatusOr<int> Wait(absl::Duration timeout);

 private:
  Subprocess() = default;

  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  std::string transcript_;
  std::optional<int> exit_code_;
};

// The value of the word "key=value" in a line of space-separated words, as kvrail's processes
// announce themselves ("sidecar ready engine=ipc://... cachepd=tcp://..."); "" when no word has
// that key.
std::string LineField(const std::string& line, const std::string& key);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read, released): for
// servers that take their port as a flag. Another process may take it first; callers retry.
absl::StatusOr<int> FreeLocalPort();

// "<pid>-<8 random hex digits>", fixed for the life of this process: a tag for names in
// host-wide namespaces (/dev/shm, /tmp sockets). The pid alone is not enough: processes in
// different pid namespaces (Bazel's sandboxes) share both and often have the same pid.
const std::string& ProcessTag();

}  // namespace kvrail::process

#endif  // KVRAIL_TOOLS_PROCESS_SUBPROCESS_H_
