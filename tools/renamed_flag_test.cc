#include "tools/renamed_flag.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace kvrail::tools {
namespace {

// `kvrail bench kv` with its new --link and the old --transport kept as a renamed flag.
struct BenchKv {
  CLI::App app{"kvrail"};
  CLI::App* bench = app.add_subcommand("bench", "");
  CLI::App* kv = bench->add_subcommand("kv", "");
  std::string link = "tcp";
  bool ran = false;
  BenchKv() {
    kv->add_option("--link", link, "What carries the bytes");
    AddRenamedFlag(kv, "--transport", "--link (a comma list of tcp, shm, netns)");
    kv->callback([this] { ran = true; });
  }
};

// Parses `args`; the exit code kvrail's main returns for it (0, or 2 for any ParseError), and
// what it printed on stderr.
struct Outcome {
  int exit_code = 0;
  std::string err;
};

Outcome Parse(CLI::App& app, std::vector<std::string> args) {
  std::vector<const char*> argv = {"kvrail"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  Outcome outcome;
  testing::internal::CaptureStderr();
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    outcome.exit_code = app.exit(e) == 0 ? 0 : 2;
  }
  outcome.err = testing::internal::GetCapturedStderr();
  return outcome;
}

TEST(RenamedFlagTest, MessageNamesTheCommandPathTheOldFlagAndTheNewOne) {
  BenchKv command;
  EXPECT_EQ(RenamedFlagMessage(*command.kv, "--transport", "--link (tcp or shm)"),
            "kvrail bench kv: --transport was renamed --link (tcp or shm)");
}

TEST(RenamedFlagTest, ItsUseFailsAtOnceWithOneLineAndExitCodeTwo) {
  BenchKv command;
  const Outcome outcome =
      Parse(command.app, {"bench", "kv", "--transport", "tcp", "--link", "shm"});
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_EQ(outcome.err,
            "error: kvrail bench kv: --transport was renamed --link (a comma list of tcp, shm, "
            "netns)\n");
  EXPECT_FALSE(command.ran);
  EXPECT_EQ(command.link, "tcp");  // nothing after the old flag was taken
}

TEST(RenamedFlagTest, TheNewFlagWorksAndTheOldOneIsOutOfHelp) {
  BenchKv command;
  const Outcome outcome = Parse(command.app, {"bench", "kv", "--link", "shm"});
  EXPECT_EQ(outcome.exit_code, 0);
  EXPECT_TRUE(command.ran);
  EXPECT_EQ(command.link, "shm");
  EXPECT_NE(command.kv->help().find("--link"), std::string::npos);
  EXPECT_EQ(command.kv->help().find("--transport"), std::string::npos);
}

}  // namespace
}  // namespace kvrail::tools
