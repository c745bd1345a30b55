#include "tests/e2e/sidecar_peer.h"

#include <cstdlib>
#include <utility>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "control/bootstrap/client.h"

namespace kvrail::e2e {

Bootstrap::Bootstrap() {
  server = process::Subprocess::Start(
               {testing::KvrailBinary(), "bootstrap", "--host", "127.0.0.1", "--port", "0"})
               .value();
  port = process::AwaitAnnouncedPort(*server, "bootstrap ready", absl::Seconds(30)).value();
  address = absl::StrCat("127.0.0.1:", port);
}

bool RegisterFakePrefillRank(const Bootstrap& bootstrap, zmq::socket_t& pull,
                             const layout::Contract& contract) {
  return RegisterFakePrefillRank(bootstrap.port, pull, contract);
}

bool RegisterFakePrefillRank(int bootstrap_port, zmq::socket_t& pull,
                             const layout::Contract& contract) {
  pull.set(zmq::sockopt::rcvtimeo, 20000);
  pull.bind("tcp://127.0.0.1:0");
  const std::string pull_endpoint = pull.get(zmq::sockopt::last_endpoint);
  bootstrap::PrefillRegistration registration;
  registration.endpoint.rank_ip = "127.0.0.1";
  registration.endpoint.rank_port = std::stoi(pull_endpoint.substr(pull_endpoint.rfind(':') + 1));
  registration.contract = contract;
  return bootstrap::BootstrapClient("127.0.0.1", bootstrap_port)
      .RegisterPrefillRank(registration)
      .ok();
}

std::vector<std::string> Receive(zmq::socket_t& pull) {
  std::vector<zmq::message_t> parts;
  std::vector<std::string> frames;
  if (!zmq::recv_multipart(pull, std::back_inserter(parts))) return frames;
  for (auto& part : parts) frames.push_back(part.to_string());
  return frames;
}

}  // namespace kvrail::e2e
