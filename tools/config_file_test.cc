#include "tools/config_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "tools/bootstrap_cmd.h"
#include "tools/serve_cmds.h"

namespace kvrail::tools {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path) << text;
  return path;
}

// What a parse ended with: "" after --print-config's CLI::Success or a plain return, else the
// error's message.
struct Parsed {
  std::string error;
  std::string printed;  // what --print-config wrote
};

Parsed Parse(CLI::App& app, std::vector<std::string> args) {
  std::vector<const char*> argv = {"kvrail"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  std::ostringstream printed;
  std::streambuf* old = std::cout.rdbuf(printed.rdbuf());
  Parsed parsed;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::Success&) {
  } catch (const CLI::Error& error) {
    parsed.error = error.what();
  }
  std::cout.rdbuf(old);
  parsed.printed = printed.str();
  return parsed;
}

// A command of every kind of option, its flags' values kept here.
struct Toy {
  CLI::App app{"toy"};
  CLI::App* command = app.add_subcommand("toy", "");
  int tp_size = 1;
  double timeout = 5;
  std::string role, host = "127.0.0.1";
  std::vector<std::string> devices;
  bool verify = false, populate = true;
  Toy() {
    command->add_option("--tp-size", tp_size, "TP")->capture_default_str();
    command->add_option("--timeout", timeout, "Seconds")->capture_default_str();
    command->add_option("--role", role, "Role")->check(CLI::IsMember({"prefill", "decode"}));
    command->add_option("--host", host, "Host")->capture_default_str();
    command->add_option("--devices", devices, "Devices")->delimiter(',');
    command->add_flag("--verify", verify, "Verify");
    command->add_flag("--populate,!--no-populate", populate, "Populate")->capture_default_str();
    AddConfigFile(command, std::cout);
  }
};

TEST(ConfigFileTest, EveryKindOfKeySetsItsFlag) {
  const std::string path =
      WriteFile("kinds.toml",
                "tp-size = 4\ntimeout = 2.5\nrole = \"decode\"\nhost = '10.0.0.1'\n"
                "devices = [\"mlx5_0\", \"mlx5_1\"]\nverify = true\npopulate = false\n");
  Toy toy;
  EXPECT_EQ(Parse(toy.app, {"toy", "--config", path}).error, "");
  EXPECT_EQ(toy.tp_size, 4);
  EXPECT_EQ(toy.timeout, 2.5);
  EXPECT_EQ(toy.role, "decode");
  EXPECT_EQ(toy.host, "10.0.0.1");
  EXPECT_EQ(toy.devices, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
  EXPECT_TRUE(toy.verify);
  EXPECT_FALSE(toy.populate);
}

TEST(ConfigFileTest, FlagsWinOverTheFile) {
  const std::string path =
      WriteFile("win.toml", "tp-size = 4\nrole = \"decode\"\nverify = false\n");
  Toy toy;
  EXPECT_EQ(Parse(toy.app, {"toy", "--tp-size", "8", "--verify", "--config", path}).error, "");
  EXPECT_EQ(toy.tp_size, 8);
  EXPECT_TRUE(toy.verify);
  EXPECT_EQ(toy.role, "decode");
}

TEST(ConfigFileTest, UnknownKeyNamesTheKeyTheFileAndTheLine) {
  const std::string path = WriteFile("unknown.toml", "tp-size = 4\n\nbogus = 1\n");
  Toy toy;
  const std::string error = Parse(toy.app, {"toy", "--config", path}).error;
  EXPECT_NE(error.find(path + ":3:1: unknown key 'bogus'"), std::string::npos) << error;
  EXPECT_NE(error.find("no --bogus flag"), std::string::npos) << error;
}

TEST(ConfigFileTest, WrongTypeNamesTheKeyAndTheType) {
  Toy toy;
  std::string error =
      Parse(toy.app, {"toy", "--config", WriteFile("type.toml", "tp-size = \"four\"\n")}).error;
  EXPECT_NE(error.find(":1:1: key 'tp-size' wants an integer"), std::string::npos) << error;
  EXPECT_NE(error.find("not a string"), std::string::npos) << error;

  Toy toy2;
  error = Parse(toy2.app, {"toy", "--config", WriteFile("flag.toml", "verify = 1\n")}).error;
  EXPECT_NE(error.find("key 'verify' wants a boolean"), std::string::npos) << error;

  Toy toy3;
  error = Parse(toy3.app, {"toy", "--config", WriteFile("list.toml", "role = [\"a\"]\n")}).error;
  EXPECT_NE(error.find("key 'role' takes one value, not an array"), std::string::npos) << error;
}

TEST(ConfigFileTest, TomlSyntaxErrorsCarryLineAndColumn) {
  Toy toy;
  const std::string path = WriteFile("syntax.toml", "tp-size = 4\nrole = \"decode\n");
  const std::string error = Parse(toy.app, {"toy", "--config", path}).error;
  EXPECT_EQ(error.rfind(path + ":2:", 0), 0u) << error;
}

TEST(ConfigFileTest, TablesAreRefused) {
  Toy toy;
  const std::string error =
      Parse(toy.app, {"toy", "--config", WriteFile("table.toml", "[toy]\ntp-size = 4\n")}).error;
  EXPECT_NE(error.find("key 'toy' is a table"), std::string::npos) << error;
}

TEST(ConfigFileTest, ValidatorsStillRunOnTheFilesValues) {
  Toy toy;
  const std::string error =
      Parse(toy.app, {"toy", "--config", WriteFile("member.toml", "role = \"both\"\n")}).error;
  EXPECT_NE(error.find("--role"), std::string::npos) << error;
}

TEST(ConfigFileTest, PrintedConfigReadsBackTheSame) {
  Toy first;
  const Parsed printed =
      Parse(first.app, {"toy", "--tp-size", "2", "--role", "prefill", "--devices", "a,b",
                        "--no-populate", "--timeout", "0.1", "--print-config"});
  ASSERT_EQ(printed.error, "");
  EXPECT_NE(printed.printed.find("tp-size = 2\n"), std::string::npos) << printed.printed;
  EXPECT_NE(printed.printed.find("populate = false\n"), std::string::npos) << printed.printed;
  EXPECT_NE(printed.printed.find("# verify = true"), std::string::npos) << printed.printed;
  Toy second;
  const std::string path = WriteFile("printed.toml", printed.printed);
  const Parsed again = Parse(second.app, {"toy", "--config", path, "--print-config"});
  ASSERT_EQ(again.error, "");
  EXPECT_EQ(again.printed, printed.printed);
  EXPECT_EQ(second.timeout, 0.1);
}

// A value a flag accepts, from its type and validators alone, so that flags other people add to
// the commands are tried too without anyone listing them here.
std::string SampleValue(const CLI::Option& option) {
  if (option.get_expected_min() == 0) return "true";
  const std::string type = option.get_type_name();
  const std::string base = type.substr(0, type.find_first_of(": "));
  const bool number = base == "INT" || base == "UINT" || base == "FLOAT";
  std::string value;
  if (!option.get_default_str().empty()) {
    value = option.get_default_str();
  } else if (type.find(":{") != std::string::npos) {
    const size_t begin = type.find(":{") + 2;
    value = type.substr(begin, type.find_first_of(",}", begin) - begin);
  } else if (type.find("FILE") != std::string::npos) {
    value = WriteFile("sample.file", "token\n");
  } else if (type.find("DIR") != std::string::npos) {
    value = TempPath("");
  } else if (type.find('[') != std::string::npos) {
    const size_t begin = type.find('[') + 1;
    value = type.substr(begin, type.find(' ', begin) - begin);
  } else {
    value = number ? "1" : "x";
  }
  const std::string scalar = number ? value : "\"" + value + "\"";
  return option.get_items_expected_max() > 1 ? "[" + scalar + "]" : scalar;
}

using AddCommand = std::function<void(CLI::App&, int&)>;

void ExpectEveryFlagIsAKey(const std::string& name, const AddCommand& add) {
  std::vector<std::string> keys;
  {
    CLI::App app;
    int exit_code = 0;
    add(app, exit_code);
    for (const CLI::Option* option : app.get_subcommand(name)->get_options()) {
      // Hidden options are renamed flags (renamed_flag.h): their keys fail, naming the new one.
      if (option->get_configurable() && !option->get_lnames().empty() &&
          !option->get_group().empty()) {
        keys.push_back(option->get_lnames().front());
      }
    }
  }
  ASSERT_GT(keys.size(), 5u);
  for (const std::string& key : keys) {
    CLI::App app;
    int exit_code = 0;
    add(app, exit_code);
    CLI::App* command = app.get_subcommand(name);
    const std::string line = key + " = " + SampleValue(*command->get_option("--" + key)) + "\n";
    const std::string path = WriteFile(name + "-" + key + ".toml", line);
    const Parsed parsed = Parse(app, {name, "--config", path, "--print-config"});
    EXPECT_EQ(parsed.error, "") << line;
    EXPECT_EQ(command->get_option("--" + key)->count(), 1u) << line;
    EXPECT_NE(parsed.printed.find("\n" + key + " = "), std::string::npos) << line;
  }
}

TEST(ConfigFileTest, EveryFlagOfTheSidecarIsAKey) { ExpectEveryFlagIsAKey("sidecar", AddSidecar); }

TEST(ConfigFileTest, EveryFlagOfTheBootstrapIsAKey) {
  ExpectEveryFlagIsAKey("bootstrap", AddBootstrap);
}

TEST(ConfigFileTest, SidecarsPrintedConfigReadsBackTheSame) {
  CLI::App first;
  int exit_code = 0;
  AddSidecar(first, exit_code);
  const Parsed printed = Parse(
      first, {"sidecar", "--role", "decode", "--engine-endpoint", "ipc:///tmp/x", "--tp-size", "2",
              "--rdma-devices", "mlx5_0,mlx5_1", "--no-populate-arena", "--print-config"});
  ASSERT_EQ(printed.error, "");
  CLI::App second;
  AddSidecar(second, exit_code);
  const std::string path = WriteFile("sidecar.toml", printed.printed);
  const Parsed again = Parse(second, {"sidecar", "--config", path, "--print-config"});
  ASSERT_EQ(again.error, "");
  EXPECT_EQ(again.printed, printed.printed);
  EXPECT_NE(again.printed.find("rdma-devices = ['mlx5_0', 'mlx5_1']"), std::string::npos);
}

TEST(ConfigFileTest, SidecarFlagsWinOverItsFile) {
  CLI::App app;
  int exit_code = 0;
  AddSidecar(app, exit_code);
  const std::string path = WriteFile("sidecar-win.toml", "role = \"decode\"\ntp-size = 2\n");
  const Parsed parsed =
      Parse(app, {"sidecar", "--config", path, "--tp-size", "4", "--print-config"});
  ASSERT_EQ(parsed.error, "");
  EXPECT_NE(parsed.printed.find("\ntp-size = 4\n"), std::string::npos) << parsed.printed;
  EXPECT_NE(parsed.printed.find("\nrole = 'decode'\n"), std::string::npos) << parsed.printed;
}

TEST(ConfigFileTest, TheSidecarsRenamedTransportKeyFailsNamingBackendAndIsNeverPrinted) {
  CLI::App app;
  int exit_code = 0;
  AddSidecar(app, exit_code);
  const Parsed printed = Parse(app, {"sidecar", "--role", "decode", "--print-config"});
  ASSERT_EQ(printed.error, "");
  EXPECT_NE(printed.printed.find("\nbackend = 'ucx'\n"), std::string::npos) << printed.printed;
  EXPECT_EQ(printed.printed.find("\ntransport ="), std::string::npos) << printed.printed;
  EXPECT_EQ(printed.printed.find("# transport ="), std::string::npos) << printed.printed;

  CLI::App old;
  AddSidecar(old, exit_code);
  const std::string path = WriteFile("sidecar-old.toml", "transport = \"verbs\"\n");
  testing::internal::CaptureStderr();
  const Parsed parsed = Parse(old, {"sidecar", "--config", path, "--print-config"});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(parsed.error, "Runtime error");  // CLI::RuntimeError: exit 2, nothing more printed
  EXPECT_EQ(err, "error: kvrail sidecar: --transport was renamed --backend (ucx or verbs)\n");
}

}  // namespace
}  // namespace kvrail::tools
