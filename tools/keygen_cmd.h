// `kvrail keygen`: a CURVE keypair bound to a role and rank (engine/zmq_auth/key_file.h).
#ifndef KVRAIL_TOOLS_KEYGEN_CMD_H_
#define KVRAIL_TOOLS_KEYGEN_CMD_H_

#include <CLI/CLI.hpp>

namespace kvrail::tools {

void AddKeygen(CLI::App& app, int& exit_code);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_KEYGEN_CMD_H_
