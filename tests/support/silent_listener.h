// A TCP socket on 127.0.0.1 that listens, lets the kernel accept, and never speaks: what a port
// looks like to a peer when a program that is not the one it expects holds it (a dead sidecar's
// port taken by another program), or when the process behind it is stopped.
#ifndef KVRAIL_TESTS_SUPPORT_SILENT_LISTENER_H_
#define KVRAIL_TESTS_SUPPORT_SILENT_LISTENER_H_

namespace kvrail::test_support {

class SilentListener {
 public:
  // `port` 0: an ephemeral one. SO_REUSEADDR, as servers set it, so a port whose last owner
  // left connections in TIME_WAIT can be taken.
  explicit SilentListener(int port = 0);
  ~SilentListener();
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;

  bool bound() const { return port_ != 0; }  // false when the bind or listen failed
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace kvrail::test_support

#endif  // KVRAIL_TESTS_SUPPORT_SILENT_LISTENER_H_
