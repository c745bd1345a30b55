// The kvrail command: one binary, one subcommand per job (docs/ARCHITECTURE.md, "Processes").
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "absl/status/statusor.h"
#include "engine/base/error.h"
#include "tools/bench_cmd.h"
#include "tools/bootstrap_cmd.h"
#include "tools/doctor_cmd.h"
#include "tools/inspect.h"
#include "tools/keygen_cmd.h"
#include "tools/plan_cmd.h"
#include "tools/serve_cmds.h"
#include "tools/soak/soak_cmd.h"
#include "tools/top/top_cmd.h"

namespace {

// Exit codes: 0 success, 1 the input was rejected (one "error: ..." line on stderr),
// 2 the command line was wrong.
constexpr int kExitRejected = 1;

std::string ReadStdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

int PrintResult(const absl::StatusOr<std::string>& result) {
  if (!result.ok()) {
    std::fprintf(stderr, "error: %s\n", kvrail::DescribeError(result.status()).c_str());
    return kExitRejected;
  }
  std::fputs(result->c_str(), stdout);
  if (!result->empty() && result->back() != '\n') std::fputc('\n', stdout);
  return 0;
}

void AddInspect(CLI::App& app, int& exit_code) {
  CLI::App* inspect = app.add_subcommand(
      "inspect", "Decode a contract, manifest or CachePD frames and print them as JSON");
  inspect->require_subcommand(1);
  static kvrail::tools::InspectOptions options;

  struct Kind {
    const char* name;
    const char* help;
  };
  const Kind kinds[] = {
      {"contract",
       "A contract of either CachePD revision as JSON text on stdin; prints its canonical wire "
       "(CACHEPD §4.2, §12.1)"},
      {"manifest", "A manifest as JSON text on stdin; prints its canonical wire (CACHEPD §5.1)"},
      {"registration", "The 8 registration frames as hex (CACHEPD §3.2)"},
      {"preallocation", "The 3 pre-allocation frames as hex (CACHEPD §3.3)"},
      {"status", "The 5 status frames (or 6 or 7, CACHEPD §12.9) as hex (CACHEPD §3.4)"},
  };
  for (const Kind& kind : kinds) {
    CLI::App* sub = inspect->add_subcommand(kind.name, kind.help);
    const std::string name = kind.name;
    if (name == "contract") {
      sub->add_option("--peer", options.peer_contract_path,
                      "The decode side's contract: also run the pair check (CACHEPD §4.5)");
      sub->add_option("--as", options.contract_form,
                      "Print the canonical wire in this CachePD revision's form: snapshot or "
                      "2026-09 (default: the form it came in; CACHEPD §12.1)")
          ->check(CLI::IsMember({"snapshot", "2026-09"}));
    } else if (name == "manifest") {
      sub->add_option("--contract", options.contract_path,
                      "Validate against this contract (CACHEPD §5.3)");
    } else {
      sub->add_option("frames", options.hex_frames,
                      "Frames as hex, one argument per frame; without them, one frame per "
                      "line on stdin (an empty line is an empty frame)");
      if (name == "status") {
        sub->add_flag("--lenient", options.lenient_status,
                      "Parse as the reference decode does (Python int() rules)");
      }
    }
    sub->callback([name, &exit_code]() {
      options.kind = name;
      const bool needs_stdin = options.hex_frames.empty();
      exit_code = PrintResult(kvrail::tools::Inspect(options, needs_stdin ? ReadStdin() : ""));
    });
  }
}

void AddPlan(CLI::App& app, int& exit_code) {
  static kvrail::tools::PlanOptions options;
  CLI::App* plan = app.add_subcommand(
      "plan", "Print the route between a prefill and a decode deployment (CACHEPD §6)");
  plan->add_option("--prefill-contract", options.prefill_contract_path,
                   "The prefill rank's contract (JSON)")
      ->required();
  plan->add_option("--decode-contract", options.decode_contract_path,
                   "The decode rank's contract (JSON)")
      ->required();
  plan->add_option("--prefill-tp", options.prefill_tp, "Prefill attention TP size P")->required();
  plan->add_option("--decode-tp", options.decode_tp, "Decode attention TP size D")->required();
  plan->add_flag("--json", options.json, "Print the schema of planner.json's `result`");
  plan->add_option("--prefill-manifest", options.prefill_manifest_path,
                   "One room's source manifest: also print its resolved copies");
  plan->add_option("--decode-manifest", options.decode_manifest_path,
                   "The same room's destination manifest");
  plan->callback([&exit_code]() { exit_code = PrintResult(kvrail::tools::RunPlan(options)); });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvrail: KV-cache transfer engine for disaggregated LLM serving"};
  app.require_subcommand(1);
  int exit_code = 0;
  AddInspect(app, exit_code);
  AddPlan(app, exit_code);
  kvrail::tools::AddBootstrap(app, exit_code);
  kvrail::tools::AddSidecar(app, exit_code);
  kvrail::tools::AddKeygen(app, exit_code);
  kvrail::tools::AddDoctor(app, exit_code);
  kvrail::tools::AddEngineSim(app, exit_code);
  kvrail::tools::AddContract(app, exit_code);
  kvrail::tools::AddDemo(app, exit_code);
  kvrail::tools::AddBench(app, exit_code);
  kvrail::soak::AddSoak(app, exit_code);
  kvrail::tools::AddTop(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return exit_code;
}
