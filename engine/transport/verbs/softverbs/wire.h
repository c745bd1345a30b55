// The softverbs wire: one shared-memory segment per QP, /dev/shm/kvrail-softverbs-<qpn>.
//
// A segment holds the QP's inbound request ring (written by the connected remote requester,
// read by this QP's responder) and its inbound ack ring (written by the remote responder, read
// by this QP's requester). Both are single-producer single-consumer rings indexed by
// std::atomic<uint64_t> head and tail in the segment; lock-free 64-bit atomics are address-free
// on x86-64, so they synchronise processes that map the segment at different addresses.
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_WIRE_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_WIRE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvrail::transport::softverbs::wire {

inline constexpr uint64_t kMagic = 0x6b76726c73667662;  // "kvrlsfvb"
inline constexpr size_t kSlots = 16;                    // Request packets in flight per QP.
inline constexpr size_t kSlotBytes = 128 * 1024;        // Largest payload of one packet.
inline constexpr size_t kAckSlots = 8192;               // More than max_qp_wr (4096).

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics");

// One packet of an RDMA WRITE. A write spans ceil(total_len / kSlotBytes) packets (one when
// empty); every packet repeats the whole write's remote address, length and rkey, so the
// responder checks the whole range before the first byte lands.
struct Packet {
  uint64_t epoch;      // The connection epoch the requester sent it under (see Segment).
  uint64_t msg_seq;    // The requester's message number, 1, 2, ... per connection.
  uint64_t raddr;      // Remote address of the whole write.
  uint64_t total_len;  // Length of the whole write.
  uint64_t offset;     // Of this packet's payload within the write.
  uint64_t len;        // Payload bytes in this packet.
  uint32_t rkey;
  uint32_t src_qpn;
};

// The responder's answer for one whole message: IBV_WC_SUCCESS once every byte landed, or a NAK
// (IBV_WC_REM_ACCESS_ERR) when the write was refused.
struct Ack {
  uint64_t epoch;
  uint64_t msg_seq;
  uint32_t status;
  uint32_t pad;
};

struct Segment {
  std::atomic<uint64_t> magic;  // Stored last (release) when the segment is ready.
  std::atomic<int64_t> pid;     // The owner process, for dead-peer detection.
  std::atomic<uint64_t> qpn;
  std::atomic<uint64_t> pidns;  // The owner's PID namespace (inode): `pid` means nothing outside.
  std::atomic<uint64_t> gid[2][2];  // GID index 0 and 1 of the QP's rail, as two words each.
  // The connection epoch: a requester bumps it when it connects (RTR) and when it is fenced
  // (ERR, RESET, destroy). The responder lands a packet only if the packet's epoch still
  // equals it, checked while `busy` is set (see Responder in softverbs.cc).
  alignas(64) std::atomic<uint64_t> inbound_epoch;
  alignas(64) std::atomic<uint64_t> busy;
  alignas(64) std::atomic<uint64_t> req_head;  // Producer: the remote requester.
  alignas(64) std::atomic<uint64_t> req_tail;  // Consumer: this QP's responder.
  alignas(64) std::atomic<uint64_t> ack_head;  // Producer: the remote responder.
  alignas(64) std::atomic<uint64_t> ack_tail;  // Consumer: this QP's requester.
  alignas(64) Packet packets[kSlots];
  Ack acks[kAckSlots];
  alignas(4096) unsigned char data[kSlots][kSlotBytes];
};

inline constexpr size_t kSegmentBytes = sizeof(Segment);

// "/kvrail-softverbs-<qpn in hex>" (a shm_open name).
std::string ShmName(uint32_t qpn);

// Creates and maps this process's segment under a fresh host-unique 24-bit QP number (O_EXCL
// on the name; a name left by a dead process is removed and reused). Returns nullptr on failure.
Segment* CreateSegment(uint32_t* qpn);
// Maps the segment of `qpn` (another QP, maybe in another process); nullptr if there is none
// or it is not ready.
Segment* MapSegment(uint32_t qpn);
void UnmapSegment(Segment* segment);
void UnlinkSegment(uint32_t qpn);

// True if `pid` is known to be gone (kill(pid, 0) fails with ESRCH).
bool ProcessIsDead(int64_t pid);
// The owner's pid if it lives in this process's PID namespace (so kill() can judge it), else 0.
int64_t OwnerPid(const Segment* segment);
// Removes segments whose owners died without cleaning up (killed, or a sanitizer's _exit),
// judged only for owners in this PID namespace. Done once per process, at the first QP.
void SweepStaleSegments();

}  // namespace kvrail::transport::softverbs::wire

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_WIRE_H_
