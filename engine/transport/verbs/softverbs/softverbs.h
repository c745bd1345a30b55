// softverbs: a software verbs provider. It implements the VerbsApi table (verbs_api.h) with
// reliable-connected (RC) RDMA-WRITE semantics between processes on one host, so the verbs
// backend can be tested where there is no RDMA NIC. It is never hardware and never reported as
// bandwidth (VerbsApi::provider is "softverbs").
//
// The wire is shared memory: every QP owns a segment /dev/shm/kvrail-softverbs-<qpn> (wire.h)
// holding its inbound request ring and its inbound ack ring. A per-process "NIC" thread moves
// posted WRs onto the connected QP's request ring, lands the requests other QPs put on this
// process's rings (checking the rkey, the access flags, the PD and the whole range first) and
// turns acks into completions, in order per QP.
//
// What a completion means, as on RC: IBV_WC_SUCCESS says every byte of the write is in the
// remote memory. An error completion moves the QP to IBV_QPS_ERR and flushes every later WR with
// IBV_WC_WR_FLUSH_ERR (a flushed or failed WR always completes, signalled or not).
//
// Fencing: once modify_qp(IBV_QPS_ERR or IBV_QPS_RESET) or destroy_qp returns on a requester,
// no packet that QP sent before lands at the responder any more. Packets still in the remote
// ring are dropped (the requester bumps the connection epoch in the remote segment; the
// responder compares it before each copy), and the call waits up to 200 ms for a copy the
// responder had already started. The one exception: if the responder process is stopped in the
// middle of a copy for longer than those 200 ms, that one packet (at most 128 KiB) may finish
// landing when it resumes. A write may also have landed partly (earlier packets) when it is
// fenced, as on a real NIC.
//
// Timeouts: a WR not acked within the QP's retry budget, 4.096 us x 2^timeout x
// (retry_cnt + 1) with a floor of 50 ms (so sanitizer builds are not flaky), completes with
// IBV_WC_RETRY_EXC_ERR. timeout 0 means "infinite" as in the InfiniBand specification; a dead
// peer process (kill(pid, 0) fails with ESRCH; judged only for a peer in this PID namespace)
// is reported as IBV_WC_RETRY_EXC_ERR within about 10 ms.
//
// Rails: a device is a "rail" bound to a netdev. A rail is down (port IBV_PORT_DOWN, nothing
// sent or received, like a cut cable) while a kRailDown fault holds it or while its netdev is not
// IFF_UP|IFF_RUNNING in the calling process's network namespace (checked at most every 10 ms).
//
// Port speed: width and per-lane speed encode Rail::gbps: up to 25 Gb/s one lane (active_width 1 =
// 1X), above that four lanes (active_width 2 = 4X); the per-lane speed is the smallest of SDR 2.5
// (1), DDR 5 (2), QDR 10 (4), FDR 14 (16), EDR 25 (32), HDR 50 (64), NDR 100 (128) that is at least
// the per-lane rate (100 Gb/s: 4X EDR; 200 Gb/s: 4X HDR; 400 Gb/s: 4X NDR).
//
// Processes: any number of processes on the host may use softverbs at once (QP numbers are
// unique host-wide). Segments are unlinked by destroy_qp and at exit; those of killed
// processes are removed by the next process's first create_qp (same PID namespace) or when
// their QP number comes up again. As with libibverbs, a child forked without exec must not use the
// parent's objects or call softverbs (the parent's NIC thread does not exist in it); exec first.
//
// ThreadSanitizer: the responder's copy into a registered region stands for DMA and is hidden
// from TSan (applications learn of it out of band, perhaps from another process).
//
// CQ overrun: a completion that finds its CQ full (cqe entries) is discarded and the CQ enters
// an error state: poll_cq then fails (-1), like a CQ that reported IBV_EVENT_CQ_ERR. Size CQs
// for every WR that can complete at once (flushes included).
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_SOFTVERBS_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_SOFTVERBS_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/transport/verbs/verbs_api.h"

namespace kvrail::transport::softverbs {

// The table ("softverbs" as VerbsApi::provider). reg_dmabuf_mr is null: there is no dmabuf.
const VerbsApi& SoftVerbsApi();

// One device of this process: `device` is the name get_device_name answers, `netdev` the network
// device whose state and IPv4 address the rail takes (GID index 1), `gbps` its port speed.
struct Rail {
  std::string device;
  std::string netdev = "lo";
  int gbps = 100;
};

// The devices get_device_list shows in this process. Read at first use from the environment
// variable KVRAIL_SOFTVERBS_RAILS ("softverbs0=lo,softverbs1=veth0:200", device=netdev[:gbps]);
// without it, one device "softverbs0" on "lo". SetRails replaces them (for tests), before or
// between uses; contexts already open keep the rail they were opened on.
void SetRails(std::vector<Rail> rails);

// The rails as KVRAIL_SOFTVERBS_RAILS spells them; malformed entries are skipped.
std::vector<Rail> ParseRails(const std::string& spec);

// Faults injected on this process's side of the wire.
enum class FaultKind {
  // The next `count` WRs that start transmitting (on `qp_num`, or any QP of this process when
  // it is 0; count <= 0: every one until ClearFaults) are not sent: each completes with
  // `status`, having written nothing, and its QP goes to IBV_QPS_ERR as on RC, so later WRs
  // flush with IBV_WC_WR_FLUSH_ERR.
  kErrorCompletion,
  // At once: the QP `qp_num` (or every QP of this process when 0) is forced to IBV_QPS_ERR,
  // fenced as by modify_qp, and its outstanding WRs flush with IBV_WC_WR_FLUSH_ERR.
  kQpError,
  // The completions of the next `count` writes that land (on `qp_num` or any QP; count <= 0:
  // every write until ClearFaults) are held back at least `delay` after their ack arrives.
  kDelayCompletions,
  // The rail `device` sends and receives nothing while `down` (a cut cable): requests time out
  // with IBV_WC_RETRY_EXC_ERR after the QP's retry budget; its port reads IBV_PORT_DOWN.
  // down = false brings it back.
  kRailDown,
};

struct Fault {
  FaultKind kind = FaultKind::kErrorCompletion;
  uint32_t qp_num = 0;                           // 0: any QP of this process.
  int count = 1;                                 // kErrorCompletion, kDelayCompletions.
  ibv_wc_status status = IBV_WC_REM_ACCESS_ERR;  // kErrorCompletion.
  absl::Duration delay;                          // kDelayCompletions.
  std::string device;                            // kRailDown.
  bool down = true;                              // kRailDown.
};

void InjectFault(const Fault& fault);
// Drops every pending fault and brings every rail a fault took down back up.
void ClearFaults();

// The shared-memory segment name of a QP (for tests that clean up after a killed peer).
std::string SegmentName(uint32_t qp_num);

}  // namespace kvrail::transport::softverbs

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_SOFTVERBS_H_
