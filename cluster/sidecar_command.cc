#include "cluster/sidecar_command.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace kvrail::cluster {

Command SidecarCommandLine(const SidecarCommand& sidecar) {
  Command command;
  std::vector<std::string>& argv = command.argv;
  argv = sidecar.prefix;
  for (const std::string& a : {sidecar.kvrail, std::string("sidecar"), std::string("--role"),
                               sidecar.role, std::string("--engine-endpoint"),
                               sidecar.engine_endpoint, std::string("--host"), sidecar.host}) {
    argv.push_back(a);
  }
  if (sidecar.link == "verbs") {
    argv.push_back("--backend");
    argv.push_back("verbs");
    if (!sidecar.verbs_provider.empty()) {
      argv.push_back("--verbs-provider");
      argv.push_back(sidecar.verbs_provider);
    }
    if (sidecar.verbs_provider == "softverbs" && !sidecar.net_devices.empty()) {
      std::vector<std::string> rails;
      for (absl::string_view device : absl::StrSplit(sidecar.net_devices, ',')) {
        rails.push_back(absl::StrCat("softverbs", rails.size(), "=", device));
      }
      command.env["KVRAIL_SOFTVERBS_RAILS"] = absl::StrJoin(rails, ",");
    }
  } else {
    argv.push_back("--tls");
    argv.push_back(sidecar.link == "shm" ? "sm" : sidecar.link);
    if (!sidecar.net_devices.empty()) {
      argv.push_back("--net-devices");
      argv.push_back(sidecar.net_devices);
    }
  }
  if (!sidecar.bootstrap.empty()) {
    argv.push_back("--bootstrap");
    argv.push_back(sidecar.bootstrap);
  }
  argv.insert(argv.end(), sidecar.args.begin(), sidecar.args.end());
  return command;
}

}  // namespace kvrail::cluster
