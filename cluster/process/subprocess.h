// Child processes for the demo, benchmarks and multi-process tests: spawn with piped stdin and
// stdout, read stdout line by line (or whole) with a timeout, signal, stop, and reap with a
// timeout. A child never outlives the Subprocess object: the destructor kills and reaps it
// (its whole process group when `contained`), and a contained child is also killed when the
// thread that started it dies, so an interrupted bench leaves nothing running.
#ifndef KVRAIL_CLUSTER_PROCESS_SUBPROCESS_H_
#define KVRAIL_CLUSTER_PROCESS_SUBPROCESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvrail::process {

struct SpawnOptions {
  // argv[0] is a path, or a name looked up in PATH (then /usr/sbin and /sbin, where root's
  // tools such as `ip` live).
  std::vector<std::string> argv;
  // Set in the child's environment on top of the inherited one.
  std::vector<std::pair<std::string, std::string>> env;
  bool pipe_stdin = true;   // else the child reads /dev/null
  bool pipe_stdout = true;  // else the child's stdout is this process's
  // The child's stderr: this process's, joined to its stdout (the pipe, with pipe_stdout),
  // /dev/null, or appended to `stderr_path`.
  enum class Stderr { kInherit, kToStdout, kNull, kFile };
  Stderr stderr_mode = Stderr::kInherit;
  std::string stderr_path;  // kFile
  // Its own process group, which Stop and the destructor signal whole (`ip netns exec` and
  // shells leave grandchildren), and SIGKILL when the thread that started it exits
  // (PR_SET_PDEATHSIG): for tools that must not outlive an interrupted run.
  bool contained = false;

  // A tool run for its output (ucx_perftest, ip, a measuring child): stdin /dev/null, stdout
  // piped, contained.
  static SpawnOptions ContainedTool() {
    SpawnOptions options;
    options.pipe_stdin = false;
    options.contained = true;
    return options;
  }
};

class Subprocess {
 public:
  // Starts the child. InvalidArgument for an empty argv; NotFound when argv[0] is not an
  // executable (or not found); Internal with errno for a failed pipe, fork or exec.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const SpawnOptions& options);
  // The common case: pipes for stdin and stdout, `env` added to the environment, stderr
  // inherited or, with `stderr_path`, appended to that file.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
      const std::string& stderr_path = "");

  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // The command, for messages: argv joined by spaces.
  const std::string& command() const { return command_; }

  // The next line of stdout without its '\n', waiting at most `timeout`. DeadlineExceeded on
  // timeout, OutOfRange at end of stream (the child closed stdout or exited), FailedPrecondition
  // when stdout is not a pipe.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);
  // Reads lines until one starts with `prefix`, returning the rest of it.
  absl::StatusOr<std::string> ReadUntil(const std::string& prefix, absl::Duration timeout);
  // Everything left on stdout up to end of file. DeadlineExceeded after `timeout`.
  absl::StatusOr<std::string> ReadAll(absl::Duration timeout);
  // Everything read so far (for failure messages).
  const std::string& transcript() const { return transcript_; }

  // Writes `text` to the child's stdin; false when it is closed or the child is gone. (Callers
  // should ignore SIGPIPE.)
  bool WriteStdin(const std::string& text);
  // Writes `line` and a newline; FailedPrecondition without a stdin pipe, Unavailable when the
  // child is gone.
  absl::Status WriteLine(const std::string& line);
  // Closes the child's stdin (a polite "stop" for children that wait on it).
  void CloseStdin();
  void Signal(int signal);

  // Waits for the child to exit: its exit code, or 128 + signal when a signal ended it.
  // DeadlineExceeded when it is still running after `timeout` (then it is left running).
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // SIGTERM (to the group when contained); SIGKILL after `grace`; then reaps it.
  void Stop(absl::Duration grace = absl::Seconds(2));

 private:
  Subprocess() = default;
  // Reads what is available from stdout into buffer_ (and the transcript), waiting up to
  // `deadline`; at end of file closes stdout.
  absl::Status Fill(absl::Time deadline);
  void Kill(int signal);

  pid_t pid_ = -1;
  bool contained_ = false;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  bool piped_stdout_ = false;
  std::string buffer_;
  std::string transcript_;
  std::string command_;
  std::optional<int> exit_code_;
};

// The value of the word "key=value" in a line of space-separated words, as kvrail's processes
// announce themselves ("sidecar ready engine=ipc://... cachepd=tcp://..."); "" when no word has
// that key.
std::string LineField(const std::string& line, const std::string& key);

// Waits for `child`'s "<ready> ... port=N" line on stdout (a server started with --port 0
// announces the port it bound, as `kvrail bootstrap` does) and returns N. Whatever the child
// printed before it is skipped. InvalidArgument when the line has no port=N word.
absl::StatusOr<int> AwaitAnnouncedPort(Subprocess& child, const std::string& ready,
                                       absl::Duration timeout);

// "<pid>-<8 random hex digits>", fixed for the life of this process: a tag for names in
// host-wide namespaces (/dev/shm, /tmp sockets). The pid alone is not enough: processes in
// different pid namespaces (Bazel's sandboxes) share both and often have the same pid.
const std::string& ProcessTag();

}  // namespace kvrail::process

#endif  // KVRAIL_CLUSTER_PROCESS_SUBPROCESS_H_
