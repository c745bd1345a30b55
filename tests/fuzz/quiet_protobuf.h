// For the harnesses that parse protobuf messages: most fuzzed inputs are not UTF-8 where proto3
// wants it, and protobuf logs each such refusal, which is noise here and costs more than the
// parse.
#ifndef KVRAIL_TESTS_FUZZ_QUIET_PROTOBUF_H_
#define KVRAIL_TESTS_FUZZ_QUIET_PROTOBUF_H_

#include <google/protobuf/stubs/logging.h>

namespace kvrail::fuzz {

// Turns protobuf's logging off for the rest of the process; cheap to call on every input.
inline void QuietProtobuf() {
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
}

}  // namespace kvrail::fuzz

#endif  // KVRAIL_TESTS_FUZZ_QUIET_PROTOBUF_H_
