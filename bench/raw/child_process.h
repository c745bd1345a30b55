// A child process of the bench (the target, ucx_perftest, `ip`), with optional pipes to its
// stdin and from its stdout. The child runs in its own process group and is killed (SIGKILL)
// when the process that spawned it dies, so an interrupted bench leaves nothing running.
#ifndef KVRAIL_BENCH_RAW_CHILD_PROCESS_H_
#define KVRAIL_BENCH_RAW_CHILD_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvrail::bench {

struct ChildSpec {
  // argv[0] is a path, or a name looked up in PATH.
  std::vector<std::string> argv;
  // Set in the child's environment on top of the inherited one.
  std::vector<std::pair<std::string, std::string>> env;
  bool pipe_stdin = false;   // else the child reads /dev/null
  bool pipe_stdout = false;  // else the child's stdout is this process's
  // The child's stderr joins its stdout pipe (with pipe_stdout), goes to /dev/null, or is this
  // process's stderr.
  enum class Stderr { kInherit, kToStdout, kNull };
  Stderr stderr_mode = Stderr::kInherit;
};

class ChildProcess {
 public:
  // Starts the child. NotFound when argv[0] is not found; Internal with errno for a failed
  // fork or exec.
  static absl::StatusOr<ChildProcess> Spawn(const ChildSpec& spec);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Kills the child's process group (SIGKILL) and reaps it, if it is still running.
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  // The command, for messages: argv joined by spaces.
  const std::string& command() const { return command_; }

  // Writes `line` and a newline to the child's stdin. Unavailable when the child is gone.
  absl::Status WriteLine(const std::string& line);
  // Closes the child's stdin (it sees end of file).
  void CloseStdin();
  // The next line of the child's stdout, without its newline. DeadlineExceeded after
  // `timeout`; Unavailable at end of file.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);
  // Everything left on the child's stdout up to end of file. DeadlineExceeded after `timeout`.
  absl::StatusOr<std::string> ReadAll(absl::Duration timeout);

  // Waits for the child to exit: its exit code, or 128 + the signal that ended it.
  // DeadlineExceeded after `timeout` (the child keeps running).
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // SIGTERM to the child's process group; SIGKILL after `grace`; then reaps it.
  void Stop(absl::Duration grace = absl::Seconds(2));

 private:
  ChildProcess() = default;
  void Reset();
  // Reads what is available from stdout into buffer_, waiting up to `deadline`; false at
  // deadline, and sets eof_ at end of file.
  absl::Status Fill(absl::Time deadline);

  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = 0;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  bool eof_ = false;
  std::string buffer_;
  std::string command_;
};

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_RAW_CHILD_PROCESS_H_
