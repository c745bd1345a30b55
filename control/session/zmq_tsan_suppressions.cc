// ThreadSanitizer suppressions for binaries that use the ZeroMQ channel under --config=tsan.
//
// Debian's libzmq is not built with TSan. It hands each message from the caller's thread to
// its I/O thread (and back) through its own lock-free pipes, whose atomics TSan cannot see, so
// every buffer ZeroMQ allocates or copies on one side and frees or reads on the other shows up
// as a race whose stacks run through libzmq. Such reports say nothing about kvrail's own
// locking: the channel serialises all use of a socket behind its mutexes, and the race detector
// still checks everything outside libzmq. `called_from_lib` makes TSan ignore the memory
// functions libzmq calls (its copies and allocations), `race` the reports whose stacks show a
// libzmq frame (libstdc++ calls made from ZeroMQ's I/O thread cannot always be unwound). The
// hook is read by the TSan runtime at start-up and is unused in other builds.
extern "C" const char* __tsan_default_suppressions() {  // NOLINT(bugprone-reserved-identifier)
  return "called_from_lib:libzmq.so\n"
         "race:libzmq.so\n";
}
