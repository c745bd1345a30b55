// The Transport contract (engine/transport/transport_conformance.h), run on the loopback backend.
#include <memory>

#include "engine/transport/loopback/loopback_transport.h"
#include "engine/transport/transport_conformance.h"
#include "gtest/gtest.h"

namespace kvrail::transport {
namespace {

INSTANTIATE_TEST_SUITE_P(
    Loopback, TransportConformanceTest,
    testing::Values(TransportFactory{
        "loopback",
        []() -> std::unique_ptr<Transport> {
          return LoopbackTransport::Create({.lanes = 4, .max_write_bytes = 16 << 20}).value();
        }}),
    TransportFactoryName);

}  // namespace
}  // namespace kvrail::transport
