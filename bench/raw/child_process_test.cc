#include "bench/raw/child_process.h"

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace kvrail::bench {
namespace {

TEST(ChildProcess, TalksLinesOverStdinAndStdout) {
  ChildSpec spec;
  spec.argv = {"sh", "-c", "read a; echo \"got $a\"; read b; echo \"got $b\""};
  spec.pipe_stdin = spec.pipe_stdout = true;
  auto child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(child->WriteLine("one").ok());
  EXPECT_EQ(*child->ReadLine(absl::Seconds(10)), "got one");
  ASSERT_TRUE(child->WriteLine("two").ok());
  EXPECT_EQ(*child->ReadLine(absl::Seconds(10)), "got two");
  EXPECT_EQ(*child->Wait(absl::Seconds(10)), 0);
}

TEST(ChildProcess, PassesEnvironmentAndJoinsStderr) {
  ChildSpec spec;
  spec.argv = {"sh", "-c", "echo $KVRAIL_TEST_VALUE; echo oops >&2; exit 3"};
  spec.env = {{"KVRAIL_TEST_VALUE", "forty-two"}};
  spec.pipe_stdout = true;
  spec.stderr_mode = ChildSpec::Stderr::kToStdout;
  auto child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(*child->ReadAll(absl::Seconds(10)), "forty-two\noops\n");
  EXPECT_EQ(*child->Wait(absl::Seconds(10)), 3);
}

TEST(ChildProcess, ReadTimesOutAndStopEndsTheChild) {
  ChildSpec spec;
  spec.argv = {"sleep", "60"};
  spec.pipe_stdout = true;
  auto child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->ReadLine(absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(child->Wait(absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  child->Stop(absl::Seconds(5));
  EXPECT_EQ(*child->Wait(absl::Seconds(1)), 128 + 15);  // SIGTERM
}

TEST(ChildProcess, AMissingProgramIsNotFound) {
  ChildSpec spec;
  spec.argv = {"kvrail-no-such-program"};
  EXPECT_EQ(ChildProcess::Spawn(spec).status().code(), absl::StatusCode::kNotFound);
}

TEST(ChildProcess, ReadLineAtEndOfOutputIsUnavailable) {
  ChildSpec spec;
  spec.argv = {"true"};
  spec.pipe_stdout = true;
  auto child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->ReadLine(absl::Seconds(10)).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvrail::bench
