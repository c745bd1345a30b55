// ThreadSanitizer suppressions, compiled into the tests and binaries that link this library
// (TSan reads __tsan_default_suppressions at start-up; other builds never call it). Only
// uninstrumented system libraries belong here: a race in kvrail's own code is fixed, not listed.
//
// libzmq is not built with TSan: its lock-free pipes between the caller and its I/O thread hand
// messages over with atomics TSan cannot see, so every message looks like a race (the I/O
// thread's malloc of the buffer against the caller's parse of it).
//
// libsodium likewise: with CURVE on (docs/SECURITY.md), libzmq's I/O thread decrypts each
// message in place with libsodium (crypto_secretbox_open_detached, unwound no further: libsodium
// has no frame pointers) before the same unseen hand-over.
//
// libcpp-httplib (the bootstrap server) is not built with TSan either: its worker threads share
// function-local statics (Server::parse_request_line's std::set of method names) whose
// initialisation guard is checked inline in the library, out of TSan's sight, so a second worker
// reading the set the first one built looks like a race.
//
// Debian's absl is not built with TSan either (docs/ARCHITECTURE.md, "std::mutex in threaded
// code"): absl::Status's copy takes a reference inline (seen), but the release, an acq_rel
// decrement and the delete of the shared rep when it was the last, is Status::UnrefNonInlined
// in libabsl_status (unseen), so the thread that frees a rep another thread copied and dropped
// looks like it races with that copy. The delete is a tail call from the library, so TSan
// attributes it to the inline Status::Unref that called in (called_from_lib cannot see it):
// the suppression names that function, which does nothing but hand the rep to the library.
//
// libucs (UCX) is not built with TSan either, and frees memory inside a signal handler of its own
// (reported once in ten runs of //control/sidecar:sidecar_test on 2026-12-07, eighth session:
// "signal-unsafe call inside of a signal", libucs.so.0's call of free, delivered while a test
// attached an arena; no frame of the handler is kvrail's).
extern "C" const char* __tsan_default_suppressions() {
  return "race:libzmq.so\n"
         "called_from_lib:libzmq.so.5\n"
         "race:libsodium.so\n"
         "race:libcpp-httplib.so\n"
         "called_from_lib:libcpp-httplib.so.0.11\n"
         "race:absl::*Status::Unref\n"
         "signal:libucs.so\n";
}
