#include "tools/top/terminal.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>

namespace kvrail::top {
namespace {

constexpr char kEnter[] = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J";  // alternate screen, no cursor
constexpr char kLeave[] = "\x1b[?25h\x1b[?1049l";               // cursor back, main screen
constexpr char kQuitByte = 'q';
constexpr char kResizeByte = 'r';
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH};

// The self-pipe the signal handlers write to (only async-signal-safe calls there).
int signal_pipe[2] = {-1, -1};
struct sigaction saved_actions[sizeof(kSignals) / sizeof(kSignals[0])];

void OnSignal(int signal_number) {
  const int saved_errno = errno;
  const char byte = signal_number == SIGWINCH ? kResizeByte : kQuitByte;
  [[maybe_unused]] ssize_t written = write(signal_pipe[1], &byte, 1);
  errno = saved_errno;
}

void WriteAll(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(STDOUT_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stdout gone: nothing to draw on
    done += static_cast<size_t>(n);
  }
}

winsize Size() {
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) != 0 || size.ws_col == 0 || size.ws_row == 0) {
    size.ws_col = 80;
    size.ws_row = 24;
  }
  return size;
}

}  // namespace

Terminal::Terminal() {
  if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) signal_pipe[0] = signal_pipe[1] = -1;
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    sigaction(kSignals[i], &action, &saved_actions[i]);
  }
  if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_) == 0) {
    termios raw = saved_;
    // Keys arrive one at a time and are not echoed; ISIG stays, so Ctrl-C is SIGINT.
    raw.c_lflag &= ~(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    stdin_raw_ = tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) == 0;
  }
  WriteAll(kEnter);
}

Terminal::~Terminal() { Restore(); }

void Terminal::Restore() {
  if (restored_) return;
  restored_ = true;
  WriteAll(kLeave);
  if (stdin_raw_) tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_);
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    sigaction(kSignals[i], &saved_actions[i], nullptr);
  }
  for (int& fd : signal_pipe) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

int Terminal::width() const { return Size().ws_col; }
int Terminal::height() const { return Size().ws_row; }

void Terminal::Draw(const std::vector<std::string>& lines) {
  std::string screen = "\x1b[H";
  for (size_t i = 0; i < lines.size(); ++i) {
    screen += lines[i];
    screen += "\x1b[K";  // the rest of the line, from a longer earlier frame
    if (i + 1 < lines.size()) screen += "\r\n";  // no newline after the last: no scroll
  }
  screen += "\x1b[J";  // the rest of the screen
  WriteAll(screen);
}

Terminal::Event Terminal::Wait(std::chrono::milliseconds timeout) {
  pollfd fds[2] = {{signal_pipe[0], POLLIN, 0}, {stdin_raw_ ? STDIN_FILENO : -1, POLLIN, 0}};
  int ready = poll(fds, 2, static_cast<int>(std::max<int64_t>(timeout.count(), 0)));
  if (ready <= 0) return Event::kTimeout;  // a signal's EINTR is read from the pipe next time
  char byte = 0;
  if ((fds[0].revents & POLLIN) && read(signal_pipe[0], &byte, 1) == 1) {
    return byte == kResizeByte ? Event::kResize : Event::kQuit;
  }
  if (fds[1].revents & (POLLHUP | POLLERR)) return Event::kQuit;  // the terminal went away
  if ((fds[1].revents & POLLIN) && read(STDIN_FILENO, &byte, 1) == 1) {
    if (byte == 'q' || byte == 'Q') return Event::kQuit;
  }
  return Event::kTimeout;
}

}  // namespace kvrail::top
