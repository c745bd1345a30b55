// ThreadSanitizer suppressions, compiled into the tests that link this library (TSan reads
// __tsan_default_suppressions at start-up; other builds never call it).
//
// libzmq is not built with TSan: its lock-free pipes between the caller and its I/O thread hand
// messages over with atomics TSan cannot see, so every message looks like a race.
extern "C" const char* __tsan_default_suppressions() {
  return "race:libzmq.so\n"
         "called_from_lib:libzmq.so.5\n";
}
