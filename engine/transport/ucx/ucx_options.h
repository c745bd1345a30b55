// What a UcxTransport is made with (ucx_transport.h), and the UCX environment that gives another
// UCX program (ucx_perftest) the same tuning.
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_OPTIONS_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_OPTIONS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "engine/transport/landing_copy.h"

namespace kvrail::transport {

struct UcxOptions {
  int lanes = 2;
  // Written to UCX's TLS setting as given ("sm,self", "tcp", ...); empty keeps UCX's default
  // (or the UCX_TLS environment variable).
  std::string tls;
  // Written to UCX's NET_DEVICES setting as given ("lo" for tcp on loopback); empty keeps the
  // default.
  std::string net_devices;
  uint64_t max_write_bytes = uint64_t{16} << 20;
  // The scheduler's bound on bytes posted and not yet complete per peer and lane
  // (Capabilities::max_inflight_bytes_per_endpoint). 0 chooses by `tls`
  // (InflightBytesPerEndpoint): 1 MiB over shared memory only, 4 MiB over tcp (and shared
  // memory) only, else 64 MiB.
  uint64_t max_inflight_bytes_per_endpoint = 0;
  // UCX's tcp segment sizes in bytes (UCX_TCP_TX_SEG_SIZE, UCX_TCP_RX_SEG_SIZE). UCX's own
  // defaults (8 KiB and 64 KiB) cut every put into 8 KiB sends, each one send(2) and a trip
  // through the peer's progress; 64 KiB and 256 KiB moved 2.5x the bytes per second on this
  // machine's loopback and veth (bench/raw/README.md). The rx segment is what one recv(2) may
  // read of a connection: 1 MiB instead of 256 KiB cut the decode's CPU per GiB by a quarter
  // (whole pages) to a third or more (head-sliced rows from 2 and 4 writers), about 3 MB more
  // per sidecar (docs/decisions/0004). 0 keeps UCX's default; UCX_TCP_TX_SEG_SIZE
  // or UCX_TCP_RX_SEG_SIZE in the environment wins over these. Create rejects a tx segment
  // outside [1 KiB, 16 MiB] and an rx segment smaller than the tx one (a peer's rx segment must
  // hold this side's tx segment: give both ends the same options).
  uint64_t tcp_tx_seg_bytes = uint64_t{64} << 10;
  uint64_t tcp_rx_seg_bytes = uint64_t{1} << 20;
  // How often UCX checks that its peers are alive (UCX_KEEPALIVE_INTERVAL; also tcp's keepalive
  // idle time and probe interval, UCX_TCP_KEEPIDLE and UCX_TCP_KEEPINTVL, in whole seconds). A
  // peer process that died fails its endpoints within about this over shared memory (its next
  // flush fails sooner where the writer watches its process: ucx_transport.h, "Peer failure");
  // over tcp its kernel usually resets the connection at once, and keepalive catches a host or
  // link that vanished. UCX's defaults are 20 s and 10 s; zero keeps them; the
  // operator's environment wins. Create rejects a negative interval.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // How long Connect waits for UCX's wireup with every lane of the peer; then it fails with
  // DeadlineExceeded naming the peer. Create rejects a timeout that is not positive.
  absl::Duration connect_timeout = absl::Seconds(5);
  // How the lanes' own copies store the bytes where they land (a store into a peer's mapped
  // segment over shared memory, a target's copy out of a write message over tcp): auto
  // (streaming for rows that land or are read apart, plain for the rest), plain (memcpy) or
  // streaming (non-temporal) stores (engine/transport/landing_copy.h).
  LandingStores landing_stores = LandingStores::kAuto;
  // What this transport calls itself to its peers as a writer (TransportSpec::writer_name):
  // sent on each connection where tcp may carry the writes, so that a peer can refuse it
  // (Transport::RefuseWriter). Empty: nothing is sent.
  std::string writer_name;
};

// Whether `tls` names shared-memory transports only ("sm,self", "posix", ...): no byte of a
// write leaves this host's memory.
bool SharedMemoryOnly(const std::string& tls);
// Whether `tls` names tcp and, at most, shared-memory transports ("tcp", "tcp,sm,self").
bool TcpOnly(const std::string& tls);

// The in-flight bound a transport of `options` advises its scheduler: the one given, else by
// link. A deep queue buys no bandwidth where the link is shared memory (a lane stores what it
// reaches) or loopback and veth tcp, and costs: measured (BENCHMARKS.md, "Strided copies"),
// - over shared memory, 1 MiB per peer and lane keeps the transfers of one prefill rank to
//   several decode ranks (a smaller TP's head-sliced rows, read from the same source pages)
//   within reach of each other in the cache: 2:4 rooms 24-27 % and 1:2 rooms 6-16 % faster than
//   at 64 MiB, whole pages no slower;
// - over tcp, 4 MiB (about a 400 Gb/s link's bandwidth-delay product at an 80 us round trip)
//   spares UCX's pending queue 64 MiB of sends waiting on a full socket: 4:2 rooms over
//   loopback 1.3-1.8 times as fast on half the prefill's CPU per GiB, the other TP pairs and
//   whole pages within noise.
// Elsewhere (UCX's choice of transports: RDMA where it finds it) 64 MiB keeps the link busy
// without the collapse that unbounded puts bring.
uint64_t InflightBytesPerEndpoint(const UcxOptions& options);

// The UCX environment that gives another UCX program (ucx_perftest) the settings `options`
// gives a UcxTransport beyond TLS and NET_DEVICES: {"UCX_TCP_TX_SEG_SIZE", "65536"}, ...
std::vector<std::pair<std::string, std::string>> UcxTuningEnvironment(const UcxOptions& options);

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_OPTIONS_H_
