#include "cluster/process/subprocess.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
  ASSERT_TRUE((*child)->WriteLine("echoed").ok());
  absl::StatusOr<std::string> echoed = (*child)->ReadLine(absl::Seconds(10));
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  EXPECT_EQ(*echoed, "echoed");
  EXPECT_NE((*child)->transcript().find("starting\n"), std::string::npos);
  (*child)->CloseStdin();
  absl::StatusOr<std::string> end = (*child)->ReadLine(absl::Seconds(10));
  EXPECT_EQ(end.status().code(), absl::StatusCode::kOutOfRange) << end.status();
  absl::StatusOr<int> code = (*child)->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

TEST(Subprocess, PassesEnvironmentJoinsStderrAndReadsEverything) {
  SpawnOptions options = SpawnOptions::ContainedTool();
  options.argv = {"sh", "-c", "echo $KVRAIL_TEST_VALUE; echo oops >&2; exit 3"};
  options.env = {{"KVRAIL_TEST_VALUE", "forty-two"}};
  options.stderr_mode = SpawnOptions::Stderr::kToStdout;
  auto child = Subprocess::Start(options);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ((*child)->command(), "sh -c echo $KVRAIL_TEST_VALUE; echo oops >&2; exit 3");
  EXPECT_EQ(*(*child)->ReadAll(absl::Seconds(10)), "forty-two\noops\n");
  EXPECT_EQ(*(*child)->Wait(absl::Seconds(10)), 3);
}

TEST(Subprocess, StderrCanGoToAFile) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/stderr-", ProcessTag());
  auto child = Subprocess::Start({"/bin/sh", "-c", "echo to-the-file >&2"}, {}, path);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(*(*child)->Wait(absl::Seconds(10)), 0);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "to-the-file\n");
  unlink(path.c_str());
}

TEST(Subprocess, ATimeoutIsDeadlineExceededAndStopEndsTheChild) {
  SpawnOptions options = SpawnOptions::ContainedTool();
  options.argv = {"sleep", "60"};
  auto child = Subprocess::Start(options);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ((*child)->ReadLine(absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*child)->Wait(absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  (*child)->Stop(absl::Seconds(5));
  EXPECT_EQ(*(*child)->Wait(absl::Seconds(1)), 128 + SIGTERM);
}

TEST(Subprocess, TheDestructorEndsAContainedChildsWholeGroup) {
  SpawnOptions options = SpawnOptions::ContainedTool();
  // The shell's own child, a grandchild of this process, is in the contained group.
  options.argv = {"sh", "-c", "sleep 60 & echo $!; wait"};
  auto child = Subprocess::Start(options);
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<std::string> line = (*child)->ReadLine(absl::Seconds(10));
  ASSERT_TRUE(line.ok()) << line.status();
  pid_t grandchild = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*line, &grandchild)) << *line;
  ASSERT_EQ(kill(grandchild, 0), 0);
  child->reset();
  // Killed; reaped by init once orphaned (or a zombie of the dead shell for a moment).
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  bool gone = false;
  while (!gone && absl::Now() < deadline) {
    std::ifstream stat(absl::StrCat("/proc/", grandchild, "/stat"));
    std::string text;
    std::getline(stat, text);
    gone = !stat.good() || text.find(") Z") != std::string::npos;
    if (!gone) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(gone) << "pid " << grandchild << " outlived its group";
}

TEST(Subprocess, AMissingProgramIsNotFound) {
  EXPECT_EQ(Subprocess::Start({"/nonexistent/kvrail-no-such-program"}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Subprocess::Start({"kvrail-no-such-program"}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Subprocess::Start(std::vector<std::string>{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Subprocess, WithoutAStdoutPipeReadingIsAnError) {
  SpawnOptions options;
  options.argv = {"true"};
  options.pipe_stdout = false;
  auto child = Subprocess::Start(options);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ((*child)->ReadLine(absl::Seconds(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*(*child)->Wait(absl::Seconds(10)), 0);
}

}  // namespace
}  // namespace kvrail::process
