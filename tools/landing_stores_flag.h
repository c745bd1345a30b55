// --landing-stores plain|streaming, on every command that makes a UCX transport (the sidecar,
// `bench raw` and its target): the names are landing_copy.h's, and the flag parses straight
// into the setting, so that a name the transport does not know is a usage error, never a
// default put in its place.
#ifndef KVRAIL_TOOLS_LANDING_STORES_FLAG_H_
#define KVRAIL_TOOLS_LANDING_STORES_FLAG_H_

#include <CLI/CLI.hpp>
#include <string>

#include "engine/transport/landing_copy.h"

namespace kvrail::tools {

// Adds --landing-stores to `command`, writing the kind named into `*stores` (whose value is the
// default shown in --help). A name not in kAllLandingStores fails the parse, listing them.
CLI::Option* AddLandingStoresFlag(CLI::App* command, transport::LandingStores* stores,
                                  const std::string& help);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_LANDING_STORES_FLAG_H_
