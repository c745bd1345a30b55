#include "cluster/process/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

extern char** environ;

namespace kvrail::process {
namespace {

std::string Errno(int error) {
  return absl::StrFormat("%s (errno %d)", std::strerror(error), error);
}

bool IsExecutable(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

absl::StatusOr<std::string> ResolvePath(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (!IsExecutable(name)) return absl::NotFoundError(absl::StrCat(name, ": not an executable"));
    return name;
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (IsExecutable(candidate)) return candidate;
  }
  // Root's tools (ip) live in sbin, often missing from a user's PATH.
  for (const char* dir : {"/usr/sbin", "/sbin"}) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (IsExecutable(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat(name, ": not found in PATH"));
}

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// In the child, between fork and exec (async-signal-safe only): makes `fd` the child's
// `target` descriptor, open across exec.
void MoveTo(int fd, int target) {
  if (fd == target) {
    fcntl(fd, F_SETFD, 0);  // dup2 onto itself would keep O_CLOEXEC
  } else {
    dup2(fd, target);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
    const std::string& stderr_path) {
  SpawnOptions options;
  options.argv = argv;
  options.env.assign(env.begin(), env.end());
  if (!stderr_path.empty()) {
    options.stderr_mode = SpawnOptions::Stderr::kFile;
    options.stderr_path = stderr_path;
  }
  return Start(options);
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("subprocess: empty argv");
  if (options.stderr_mode == SpawnOptions::Stderr::kFile && options.stderr_path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("subprocess ", options.argv[0], ": stderr to a file needs stderr_path"));
  }
  absl::StatusOr<std::string> path = ResolvePath(options.argv[0]);
  if (!path.ok()) return path.status();

  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const absl::string_view key = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(options.env.begin(), options.env.end(),
                                      [&](const auto& kv) { return kv.first == key; });
    if (!replaced) env_strings.emplace_back(entry);
  }
  for (const auto& [k, v] : options.env) env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = options.argv;
  std::vector<char*> argv;
  argv.reserve(argv_strings.size() + 1);
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1}, exec_pipe[2] = {-1, -1};
  int null_fd = -1, err_fd = -1;
  auto close_all = [&] {
    for (int* p : {in_pipe, out_pipe, exec_pipe}) {
      CloseFd(p[0]);
      CloseFd(p[1]);
    }
    CloseFd(null_fd);
    CloseFd(err_fd);
  };
  if ((options.pipe_stdin && pipe2(in_pipe, O_CLOEXEC) != 0) ||
      (options.pipe_stdout && pipe2(out_pipe, O_CLOEXEC) != 0) ||
      pipe2(exec_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    close_all();
    return absl::InternalError(absl::StrCat("subprocess ", *path, ": pipe2: ", Errno(error)));
  }
  null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (options.stderr_mode == SpawnOptions::Stderr::kFile) {
    err_fd = open(options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (err_fd < 0) {
      const int error = errno;
      close_all();
      return absl::InternalError(absl::StrCat("subprocess ", *path, ": opening stderr file ",
                                              options.stderr_path, ": ", Errno(error)));
    }
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close_all();
    return absl::InternalError(absl::StrCat("subprocess ", *path, ": fork: ", Errno(error)));
  }
  if (pid == 0) {
    if (options.contained) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the parent died before prctl
    }
    MoveTo(options.pipe_stdin ? in_pipe[0] : null_fd, 0);
    if (options.pipe_stdout) MoveTo(out_pipe[1], 1);
    switch (options.stderr_mode) {
      case SpawnOptions::Stderr::kInherit:
        break;
      case SpawnOptions::Stderr::kToStdout:
        dup2(1, 2);
        break;
      case SpawnOptions::Stderr::kNull:
        MoveTo(null_fd, 2);
        break;
      case SpawnOptions::Stderr::kFile:
        MoveTo(err_fd, 2);
        break;
    }
    // Signals the parent blocked or ignored stay so across exec: restore the defaults.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    execve(path->c_str(), argv.data(), envp.data());
    const int error = errno;
    (void)!write(exec_pipe[1], &error, sizeof(error));
    _exit(127);
  }
  CloseFd(null_fd);
  CloseFd(err_fd);
  CloseFd(in_pipe[0]);
  CloseFd(out_pipe[1]);
  CloseFd(exec_pipe[1]);
  int exec_error = 0;
  ssize_t n;
  do {
    n = read(exec_pipe[0], &exec_error, sizeof(exec_error));
  } while (n < 0 && errno == EINTR);
  CloseFd(exec_pipe[0]);
  std::unique_ptr<Subprocess> child(new Subprocess);
  child->pid_ = pid;
  child->contained_ = options.contained;
  child->stdin_fd_ = in_pipe[1];
  child->stdout_fd_ = out_pipe[0];
  child->piped_stdout_ = options.pipe_stdout;
  child->command_ = absl::StrJoin(options.argv, " ");
  if (n == static_cast<ssize_t>(sizeof(exec_error))) {
    child->Stop(absl::ZeroDuration());
    return absl::InternalError(absl::StrCat("exec ", *path, ": ", Errno(exec_error)));
  }
  return child;
}

Subprocess::~Subprocess() {
  CloseStdin();
  if (!exit_code_.has_value() && pid_ > 0) {
    Kill(SIGKILL);
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  CloseFd(stdout_fd_);
}

void Subprocess::Kill(int signal) {
  if (exit_code_.has_value() || pid_ <= 0) return;
  if (contained_) kill(-pid_, signal);
  kill(pid_, signal);
}

absl::Status Subprocess::Fill(absl::Time deadline) {
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat(command_, " (pid ", pid_, "): no output in time; so far:\n", transcript_));
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return absl::InternalError(absl::StrCat("poll: ", Errno(errno)));
    if (ready == 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat(command_, ": read: ", Errno(errno)));
    if (n == 0) {
      CloseFd(stdout_fd_);
      return absl::OkStatus();
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    transcript_.append(chunk, static_cast<size_t>(n));
    return absl::OkStatus();
  }
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Duration timeout) {
  if (!piped_stdout_) return absl::FailedPreconditionError(command_ + ": stdout is not a pipe");
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const size_t newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    if (stdout_fd_ < 0) {
      // A last line without its newline still counts.
      if (!buffer_.empty()) return std::exchange(buffer_, std::string());
      return absl::OutOfRangeError(
          absl::StrCat(command_, ": exited (end of its output) before writing a line; it wrote:\n",
                       transcript_));
    }
    absl::Status filled = Fill(deadline);
    if (!filled.ok()) return filled;
  }
}

absl::StatusOr<std::string> Subprocess::ReadUntil(const std::string& prefix,
                                                  absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<std::string> line = ReadLine(deadline - absl::Now());
    if (!line.ok()) return line.status();
    if (absl::StartsWith(*line, prefix)) return line->substr(prefix.size());
  }
}

absl::StatusOr<std::string> Subprocess::ReadAll(absl::Duration timeout) {
  if (!piped_stdout_) return absl::FailedPreconditionError(command_ + ": stdout is not a pipe");
  const absl::Time deadline = absl::Now() + timeout;
  while (stdout_fd_ >= 0) {
    absl::Status filled = Fill(deadline);
    if (!filled.ok()) return filled;
  }
  return std::exchange(buffer_, std::string());
}

bool Subprocess::WriteStdin(const std::string& text) {
  size_t written = 0;
  while (stdin_fd_ >= 0 && written < text.size()) {
    const ssize_t n = write(stdin_fd_, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    written += static_cast<size_t>(n);
  }
  return stdin_fd_ >= 0;
}

absl::Status Subprocess::WriteLine(const std::string& line) {
  if (stdin_fd_ < 0) return absl::FailedPreconditionError(command_ + ": stdin is not open");
  if (!WriteStdin(line + "\n")) {
    return absl::UnavailableError(absl::StrCat(command_, ": write to stdin: ", Errno(errno)));
  }
  return absl::OkStatus();
}

void Subprocess::CloseStdin() { CloseFd(stdin_fd_); }

void Subprocess::Signal(int signal) {
  if (!exit_code_.has_value() && pid_ > 0) kill(pid_, signal);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (exit_code_.has_value()) return *exit_code_;
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration nap = absl::Microseconds(200);
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) return absl::InternalError(absl::StrCat("waitpid: ", Errno(errno)));
    if (done == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return *exit_code_;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s (pid %d): still running after %s", command_, pid_, absl::FormatDuration(timeout)));
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(20));
  }
}

void Subprocess::Stop(absl::Duration grace) {
  if (exit_code_.has_value() || pid_ <= 0) return;
  Kill(SIGTERM);
  if (!Wait(grace).ok()) {
    Kill(SIGKILL);
    (void)Wait(absl::Seconds(10));
  }
}

absl::StatusOr<int> AwaitAnnouncedPort(Subprocess& child, const std::string& ready,
                                       absl::Duration timeout) {
  absl::StatusOr<std::string> line = child.ReadUntil(ready, timeout);
  if (!line.ok()) {
    return absl::Status(line.status().code(), absl::StrCat(child.command(), ": no \"", ready,
                                                           "\" line: ", line.status().message()));
  }
  int port = 0;
  if (!absl::SimpleAtoi(LineField(*line, "port"), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(child.command(), ": \"", ready, *line, "\" names no port=1..65535"));
  }
  return port;
}

std::string LineField(const std::string& line, const std::string& key) {
  const std::string prefix = key + "=";
  for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    if (absl::StartsWith(word, prefix)) return std::string(word.substr(prefix.size()));
  }
  return "";
}

const std::string& ProcessTag() {
  static const std::string* tag = [] {
    std::random_device random;
    return new std::string(absl::StrFormat("%d-%08x", getpid(), random()));
  }();
  return *tag;
}

}  // namespace kvrail::process
