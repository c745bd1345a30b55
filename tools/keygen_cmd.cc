#include "tools/keygen_cmd.h"

#include <cstdio>
#include <string>

#include "engine/zmq_auth/key_file.h"

namespace kvrail::tools {

void AddKeygen(CLI::App& app, int& exit_code) {
  static std::string role, name, out;
  static int rank = 0;
  CLI::App* sub = app.add_subcommand(
      "keygen", "Make a CURVE keypair for one peer: OUT/NAME.key (secret, 0600) and OUT/NAME.pub");
  sub->add_option("--role", role, "Whose key: prefill, decode or engine")
      ->required()
      ->check(CLI::IsMember({"prefill", "decode", "engine"}));
  sub->add_option("--rank", rank,
                  "prefill: its status rank (pp_rank * tp_size + tp_rank); decode: its tp_rank; "
                  "engine: its sidecar's rank")
      ->required();
  sub->add_option("--name", name, "File name and User-Id name (default <role>-<rank>)");
  sub->add_option("--out", out, "Directory to write into")
      ->required()
      ->check(CLI::ExistingDirectory);
  sub->callback([&exit_code] {
    absl::StatusOr<zmq_auth::KeyFile> key =
        zmq_auth::GenerateKeyFile({*zmq_auth::ParseRole(role), rank, name});
    absl::StatusOr<std::string> path =
        key.ok() ? zmq_auth::WriteKeyFiles(out, *key) : absl::StatusOr<std::string>(key.status());
    if (!path.ok()) {
      std::fprintf(stderr, "kvrail keygen: %s\n", std::string(path.status().message()).c_str());
      exit_code = 1;
      return;
    }
    std::printf("%s %s\n", path->c_str(), zmq_auth::UserId(key->identity).c_str());
    exit_code = 0;
  });
}

}  // namespace kvrail::tools
