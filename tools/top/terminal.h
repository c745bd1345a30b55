// The terminal `kvrail top` draws in: the alternate screen with the cursor hidden, keys read
// one at a time without echo, and the screen, cursor and tty modes given back on every way out
// (q, Ctrl-C, SIGTERM, SIGHUP, the destructor). ANSI escapes only, no curses.
#ifndef KVRAIL_TOOLS_TOP_TERMINAL_H_
#define KVRAIL_TOOLS_TOP_TERMINAL_H_

#include <termios.h>

#include <chrono>
#include <string>
#include <vector>

namespace kvrail::top {

class Terminal {
 public:
  enum class Event { kTimeout, kQuit, kResize };

  // Takes over stdout (and stdin when it is a terminal) and installs the handlers of SIGINT,
  // SIGTERM, SIGHUP and SIGWINCH. One at a time per process.
  Terminal();
  ~Terminal();  // Restore()
  Terminal(const Terminal&) = delete;
  Terminal& operator=(const Terminal&) = delete;

  // Columns and rows; 80x24 when stdout is not a terminal.
  int width() const;
  int height() const;

  // Redraws the whole screen in place: each line, then the rest of the screen cleared.
  void Draw(const std::vector<std::string>& lines);

  // Waits up to `timeout` for q (or Q), a signal that ends the view, or a resize.
  Event Wait(std::chrono::milliseconds timeout);

  // Leaves the alternate screen, shows the cursor, restores the tty modes and the signals'
  // previous handlers. Idempotent.
  void Restore();

 private:
  bool restored_ = false;
  bool stdin_raw_ = false;
  termios saved_{};
};

}  // namespace kvrail::top

#endif  // KVRAIL_TOOLS_TOP_TERMINAL_H_
