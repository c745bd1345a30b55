#include "tools/doctor_cmd.h"

#include <cstdio>
#include <string>

#include "tools/doctor.h"

namespace kvrail::tools {

void AddDoctor(CLI::App& app, int& exit_code) {
  static DoctorOptions options;
  static bool json = false;
  CLI::App* sub = app.add_subcommand(
      "doctor",
      "Preflight report before deploying: UCX transports, RDMA devices, ports and GIDs, CUDA, "
      "NIC and GPU placement, the address a sidecar would advertise, a bootstrap server and a "
      "peer; one line of what to change per problem. Exit 1 when something would stop a "
      "sidecar");
  sub->add_option("--host", options.advertise_host,
                  "The address a sidecar here would advertise (its --host): checked to be one "
                  "of this host's");
  sub->add_option("--bootstrap", options.bootstrap,
                  "host:port of a bootstrap server: checked to answer /health");
  sub->add_option("--peer", options.peer,
                  "A decode sidecar's session id (its handshake ip:port): checked to serve its "
                  "descriptor");
  sub->add_option("--timeout", options.timeout_seconds,
                  "Seconds to wait for the bootstrap server and the peer")
      ->capture_default_str();
  sub->add_flag("--json", json, "Print {\"ok\", \"findings\": [...], \"facts\": {...}}");
  sub->callback([&exit_code] {
    const DoctorFacts facts = Gather(options);
    const std::vector<Finding> findings = Diagnose(facts);
    const std::string out = json ? FormatJson(facts, findings) : FormatText(findings);
    std::fputs(out.c_str(), stdout);
    exit_code = AnyFailed(findings) ? 1 : 0;
  });
}

}  // namespace kvrail::tools
