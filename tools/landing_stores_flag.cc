#include "tools/landing_stores_flag.h"

#include <vector>

namespace kvrail::tools {

CLI::Option* AddLandingStoresFlag(CLI::App* command, transport::LandingStores* stores,
                                  const std::string& help) {
  std::vector<std::string> names;
  for (transport::LandingStores kind : transport::kAllLandingStores) {
    names.emplace_back(transport::LandingStoresName(kind));
  }
  return command
      ->add_option_function<std::string>(
          "--landing-stores",
          [stores](const std::string& name) { *stores = *transport::LandingStoresNamed(name); },
          help)
      ->check(CLI::IsMember(names))
      ->default_str(transport::LandingStoresName(*stores));
}

}  // namespace kvrail::tools
