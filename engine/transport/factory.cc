#include "engine/transport/factory.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/transport/loopback/loopback_transport.h"
#include "engine/transport/ucx/ucx_transport.h"
#include "engine/transport/verbs/softverbs/softverbs.h"
#include "engine/transport/verbs/verbs_transport.h"

namespace kvrail::transport {
namespace {

// The spec's lanes, and the sizes it gives in place of the backend's defaults.
template <typename Options>
Options WithSizes(const TransportSpec& spec, Options options) {
  options.lanes = spec.lanes;
  if (spec.max_write_bytes != 0) options.max_write_bytes = spec.max_write_bytes;
  if (spec.max_inflight_bytes_per_endpoint != 0) {
    options.max_inflight_bytes_per_endpoint = spec.max_inflight_bytes_per_endpoint;
  }
  return options;
}

absl::StatusOr<std::unique_ptr<Transport>> MakeUcx(const TransportSpec& spec) {
  UcxOptions options = WithSizes(spec, UcxOptions{});
  options.tls = spec.tls == "sm" ? "sm,self" : spec.tls;
  if (spec.tls != "sm") options.net_devices = spec.net_devices;
  if (spec.connect_timeout > absl::ZeroDuration()) options.connect_timeout = spec.connect_timeout;
  options.landing_stores = spec.landing_stores;
  options.writer_name = spec.writer_name;
  return UcxTransport::Create(options);
}

absl::StatusOr<std::unique_ptr<Transport>> MakeVerbs(const TransportSpec& spec) {
  if (!spec.tls.empty() || !spec.net_devices.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transport backend \"verbs\": tls \"", spec.tls, "\" and net_devices \"", spec.net_devices,
        "\" are UCX settings; name RDMA devices with rdma_devices instead"));
  }
  if (spec.landing_stores == LandingStores::kStreaming) {
    return absl::InvalidArgumentError(
        "transport backend \"verbs\": landing_stores \"streaming\" is a UCX setting; the verbs "
        "backend's writes land by the device (or the software provider), not by its own copy");
  }
  auto provider = VerbsProviderOf(spec);
  if (!provider.ok()) return provider.status();
  VerbsOptions options = WithSizes(spec, VerbsOptions{});
  options.api = *provider == "softverbs" ? &softverbs::SoftVerbsApi() : &LibibverbsApi();
  options.devices = spec.rdma_devices;
  options.gid_index = spec.gid_index;
  options.rail_affinity = spec.rail_affinity;
  if (spec.connect_timeout > absl::ZeroDuration()) options.connect_timeout = spec.connect_timeout;
  options.writer_name = spec.writer_name;
  return VerbsTransport::Create(options);
}

absl::StatusOr<std::unique_ptr<Transport>> MakeLoopback(const TransportSpec& spec) {
  if (!spec.tls.empty() || !spec.net_devices.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transport backend \"loopback\": tls \"", spec.tls, "\" and net_devices \"",
        spec.net_devices, "\" are UCX settings; loopback copies in this process and takes none"));
  }
  if (spec.landing_stores == LandingStores::kStreaming) {
    return absl::InvalidArgumentError(
        "transport backend \"loopback\": landing_stores \"streaming\" is a UCX setting; "
        "loopback copies in this process with memcpy");
  }
  return LoopbackTransport::Create(WithSizes(spec, LoopbackOptions{}));
}

}  // namespace

std::vector<std::string> KnownBackends() { return {"loopback", "ucx", "verbs"}; }

absl::StatusOr<std::string> VerbsProviderOf(const TransportSpec& spec) {
  std::string provider = spec.verbs_provider;
  std::string source = "verbs provider";
  if (provider.empty()) {
    const char* env = std::getenv("KVRAIL_VERBS_PROVIDER");
    provider = env != nullptr && *env != '\0' ? env : "libibverbs";
    if (env != nullptr && *env != '\0') source = "KVRAIL_VERBS_PROVIDER";
  }
  if (provider != "libibverbs" && provider != "softverbs") {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " \"", provider,
        "\" is unknown: expected libibverbs (RDMA devices) or softverbs (the software provider, "
        "shared memory on this host, never hardware)"));
  }
  return provider;
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const TransportSpec& spec) {
  if (spec.backend == "ucx") return MakeUcx(spec);
  if (spec.backend == "loopback") return MakeLoopback(spec);
  if (spec.backend == "verbs") return MakeVerbs(spec);
  return absl::InvalidArgumentError(
      absl::StrCat("transport backend \"", spec.backend,
                   "\" is unknown; known backends: ", absl::StrJoin(KnownBackends(), ", ")));
}

}  // namespace kvrail::transport
