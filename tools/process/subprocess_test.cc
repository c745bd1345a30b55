#include "tools/process/subprocess.h"

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace kvrail::process {
namespace {

TEST(LineField, FindsTheValueOfAKeyedWord) {
  const std::string line = "sidecar ready engine=ipc:///tmp/a.sock cachepd=tcp://127.0.0.1:5000";
  EXPECT_EQ(LineField(line, "engine"), "ipc:///tmp/a.sock");
  EXPECT_EQ(LineField(line, "cachepd"), "tcp://127.0.0.1:5000");
}

TEST(LineField, MatchesWholeKeysOnly) {
  // "engine" is not "engine_id", and a value that contains "key=" is not a key.
  const std::string line = "x engine_id=7 note=engine=no  engine=yes";
  EXPECT_EQ(LineField(line, "engine"), "yes");
  EXPECT_EQ(LineField(line, "engine_id"), "7");
  EXPECT_EQ(LineField(line, "missing"), "");
  EXPECT_EQ(LineField("", "engine"), "");
  EXPECT_EQ(LineField("empty= x", "empty"), "");
}

TEST(Subprocess, ReadsLinesUntilAPrefixThenSeesTheEnd) {
  auto child = Subprocess::Start({"/bin/sh", "-c", "echo starting; echo ready port=7; exec cat"});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<std::string> ready = (*child)->ReadUntil("ready", absl::Seconds(10));
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_EQ(LineField(*ready, "port"), "7");
  ASSERT_TRUE((*child)->WriteStdin("echoed\n"));
  absl::StatusOr<std::string> echoed = (*child)->ReadLine(absl::Seconds(10));
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  EXPECT_EQ(*echoed, "echoed");
  (*child)->CloseStdin();
  EXPECT_EQ((*child)->ReadLine(absl::Seconds(10)).status().code(), absl::StatusCode::kOutOfRange);
  absl::StatusOr<int> code = (*child)->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

TEST(Subprocess, ATimeoutIsDeadlineExceededAndTheDestructorEndsTheChild) {
  auto child = Subprocess::Start({"/bin/sh", "-c", "exec sleep 60"});
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ((*child)->ReadLine(absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*child)->Wait(absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  child->reset();  // kills and reaps; the test would hang 60 s otherwise
}

TEST(Subprocess, AMissingProgramIsAnError) {
  auto child = Subprocess::Start({"/nonexistent/kvrail-no-such-program"});
  if (child.ok()) {
    // posix_spawn may report a failed exec as exit code 127 instead.
    absl::StatusOr<int> code = (*child)->Wait(absl::Seconds(10));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 127);
  }
}

}  // namespace
}  // namespace kvrail::process
