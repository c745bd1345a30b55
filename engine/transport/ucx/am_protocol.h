// kvrail's own active-message write protocol, both ends, as pure code: the UCX backend carries
// writes this way wherever tcp may carry them (ucx_transport.h, "Writes over tcp"), and this
// file holds everything of it that needs no UCX: the message layouts, how a batch is cut into
// messages, the writer's message and flush counting, and the target's state machine (count,
// check, land or refuse, answer flushes). ucx_am.cc moves these messages over UCX; the tests
// (am_protocol_test.cc) run both ends against each other without it.
//
// The protocol. Every message has an AmHeader whose `token` names the writer's connection and
// lane at the target.
//   * kWriteAm: header.a is the destination address; the payload is the bytes (at most one
//     slice, a tcp segment less headers).
//   * kWritesAm: several small writes in one message (a staged relayout, docs/ARCHITECTURE.md
//     "Small rows over tcp"): header.a is their count n; the payload holds n PackedWrites, then
//     each write's bytes in that order.
//   * kRowsAm: rows of one strided write (a head-sliced page, transport.h's Write::rows):
//     header.a is the first row's destination address, header.b the destination stride; the
//     payload is a PackedRows (rows, row length), then the rows' bytes back to back, gathered
//     from the source; the target checks the rows' whole span once and scatters them.
//   * kFlushAm: header.a is the number of write messages the writer sent on this lane so far,
//     header.b the flush's number. The target answers with a kFlushReplyAm once it has handled
//     that many of the token's messages.
//   * kFlushReplyAm: a FlushReply: the flush's number, and the first write refused since the
//     previous answer, if any.
//   * kByeAm: the writer disconnects; the target forgets the token.
//   * kHelloAm: the writer's name (the payload's bytes; UcxOptions::writer_name), its first
//     message on a connection where it has one. A target told to refuse that writer
//     (AmTarget::Refuse) lands none of the token's writes from then on.
// The target lands a write only inside memory registered now (a writer's descriptor may be
// stale): "Bounds before bytes" at the target too. Headers are copied as raw structs: both ends
// are kvrail on one architecture (UCX itself carries no byte order either).
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_AM_PROTOCOL_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_AM_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/transport/transport.h"

namespace kvrail::transport::am {

// Active-message ids on every lane's worker.
enum AmId : unsigned {
  kWriteAm = 1,
  kFlushAm = 2,
  kFlushReplyAm = 3,
  kByeAm = 4,
  kWritesAm = 5,
  kRowsAm = 6,
  kHelloAm = 7,
};

// Why a target refused a write, as a FlushReply says it (0: none was refused).
enum Refusal : uint64_t {
  kRefusedOutside = 1,  // malformed, or not inside memory registered now
  kRefusedWriter = 2,   // the target refuses this writer (AmTarget::Refuse)
};

// The header of every message but a flush's answer; what `a` and `b` mean depends on the id.
struct AmHeader {
  uint64_t token = 0;
  uint64_t a = 0;
  uint64_t b = 0;
};

// A target's answer to a flush: it has handled every message the flush counted; `refused` (0, or
// a Refusal) says whether one of them, since the previous answer, was refused, why, and which.
struct FlushReply {
  uint64_t token = 0;
  uint64_t seq = 0;
  uint64_t refused = 0;
  uint64_t refused_address = 0;
  uint64_t refused_length = 0;
};

// One write of a kWritesAm message: where its bytes go at the target, and how many.
struct PackedWrite {
  uint64_t address = 0;
  uint64_t length = 0;
};

// The head of a kRowsAm's payload: how many rows follow, and each one's length.
struct PackedRows {
  uint64_t rows = 0;
  uint64_t length = 0;
};

static_assert(sizeof(AmHeader) == 24 && sizeof(FlushReply) == 40 && sizeof(PackedWrite) == 16 &&
                  sizeof(PackedRows) == 16,
              "the active-message layouts are kvrail's wire format: they must not change size");

// A received header as `Header`; false when its length is another's. (UCX does not align
// headers, hence the copy.)
template <typename Header>
bool ReadHeader(const void* header, size_t header_length, Header* out) {
  if (header_length != sizeof(Header)) return false;
  std::memcpy(out, header, sizeof(Header));
  return true;
}

// ---------------------------------------------------------------------------------------------
// The writer's side.

// One message of a batch: a kWriteAm carries bytes [offset, offset + length) of row `row` of
// write `first` (row 0 of a one-row write); a kWritesAm carries writes [first, end) whole; a
// kRowsAm carries rows [row, row + length) of write `first`.
struct AmMessage {
  AmId id = kWriteAm;
  size_t first = 0;
  size_t end = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t row = 0;
};

// Cuts a checked batch (every length > 0) into messages of at most `slice` bytes of payload, in
// write order, into `plan` (cleared first; its capacity is kept). Writes of at most slice / 8
// bytes share a kWritesAm with their neighbours, as many as fit one slice with their entries (a
// head-sliced room's rows of a KiB or two would otherwise cost a message, a handler call and a
// flush count each); a run of one goes alone. A strided write goes as kRowsAm messages of as many
// whole rows as fit a slice with their PackedRows, or, where one row does not, row by row as
// kWriteAm slices. Every other write goes as kWriteAm slices.
void PlanMessages(absl::Span<const Write> writes, uint64_t slice, std::vector<AmMessage>* plan);

// How a message's payload leaves the writer. It names pieces of memory: kWritesAm its entry
// table and each write's bytes; kRowsAm its PackedRows and each row, or one run where the
// source rows are contiguous; kWriteAm one. UCX's tcp zero-copy send takes only a few pieces
// (6 in UCX 1.13: `ucx_info -d`, am_zcopy); past that UCP packs the payload into 8 KiB
// bounce buffers or splits it into sends of a few rows each, so a KiB-row message costs a
// syscall per 5 KiB. So a payload of more than kMostGatherPieces pieces is packed contiguous by
// the writer (PackPayload, one copy it would pay in UCX anyway) and sent as one piece of up to
// a slice; a payload of fewer goes as UCX's gather list, read in place.
constexpr size_t kMostGatherPieces = 2;
size_t GatherPieces(const AmMessage& message, absl::Span<const Write> writes);
// Whether the writer packs the message's payload (more than kMostGatherPieces pieces).
bool PackedBeforeSending(const AmMessage& message, absl::Span<const Write> writes);
// A message's payload bytes: entries or PackedRows, then the bytes written.
uint64_t PayloadBytes(const AmMessage& message, absl::Span<const Write> writes);
// Writes the payload of a kWritesAm or kRowsAm message, PayloadBytes of it, to `out`, reading
// the writes' source bytes at their local_offset from `base`: the bytes a gather list of its
// pieces would send.
void PackPayload(const AmMessage& message, absl::Span<const Write> writes, const std::byte* base,
                 std::byte* out);

// How much a plan needs kept still while UCX reads it: one header per message; for each message
// sent as a gather list, its PackedRows and its pieces; for each one packed
// (PackedBeforeSending), its payload's bytes.
struct PlanSizes {
  size_t headers = 0;
  size_t rows = 0;
  size_t gather = 0;
  uint64_t packed_bytes = 0;
};
PlanSizes SizesOf(absl::Span<const AmMessage> plan, absl::Span<const Write> writes);

// What a writer keeps per connection and lane: its token, the write messages sent, the last
// flush's number.
class AmWriter {
 public:
  explicit AmWriter(uint64_t token = 0) : token_(token) {}

  uint64_t token() const { return token_; }
  // The header of a message `message` of a batch (kWriteAm: its destination address; kWritesAm:
  // its count), to be sent next.
  AmHeader WriteHeader(const AmMessage& message, absl::Span<const Write> writes) const;
  // A write message left: the next flush counts it.
  void Sent() { ++sent_; }
  // The next flush's header: every write message sent so far, and its number (1, 2, ...).
  AmHeader NextFlush() { return AmHeader{.token = token_, .a = sent_, .b = ++flushes_}; }
  uint64_t sent() const { return sent_; }

 private:
  uint64_t token_;
  uint64_t sent_ = 0;
  uint64_t flushes_ = 0;
};

// A flush's outcome from the target's answer: OK, or Unavailable naming the refused write and
// why (and `peer` and `lane`, for the message).
absl::Status FlushReplyStatus(const FlushReply& reply, PeerId peer, int lane);

// ---------------------------------------------------------------------------------------------
// The target's side.

// Where a target's writes land: the backend's registered memory.
class AmLanding {
 public:
  virtual ~AmLanding() = default;
  // Whether [address, address + length) lies inside one region registered now.
  virtual bool Registered(uint64_t address, uint64_t length) const = 0;
  // Copies `rows` rows of `length` bytes, back to back in `bytes`, row r to
  // `address + r * stride`: a span Registered accepted whole. One write is one row.
  virtual void CopyRows(uint64_t address, uint64_t stride, const std::byte* bytes, uint64_t length,
                        uint64_t rows) = 0;
  // Publishes the copies before any flush they complete is answered.
  virtual void Fence() = 0;
};

// Sends a flush's answer back to its writer.
using Reply = absl::FunctionRef<void(const FlushReply&)>;

// One lane's target: what it keeps per writer token. The lane's thread calls it, and so does
// UcxTransport::RefuseWriter, each holding the lane's worker mutex.
class AmTarget {
 public:
  // A kWriteAm of `length` bytes. `whole`: the message arrived whole (eager; a kvrail writer
  // never sends a rendezvous). Lands it when whole and registered, else refuses it; then, when
  // the writer can be answered (`reply` non-null), answers the flushes it completes.
  void OnWrite(const AmHeader& header, const std::byte* data, uint64_t length, bool whole,
               AmLanding& landing, const Reply* reply);
  // A kWritesAm: refused whole when malformed (no entries, more entries than fit, entries whose
  // lengths do not add up to the bytes that follow), else each write landed or refused on its
  // own; then as OnWrite.
  void OnWrites(const AmHeader& header, const std::byte* data, uint64_t length, bool whole,
                AmLanding& landing, const Reply* reply);
  // A kRowsAm: refused whole when malformed (no row, a zero length, rows whose bytes are not what
  // follows its PackedRows, a stride below the row length) or when the rows' span does not lie
  // inside one region registered now, else every row landed; then as OnWrite.
  void OnRows(const AmHeader& header, const std::byte* data, uint64_t length, bool whole,
              AmLanding& landing, const Reply* reply);
  // A kFlushAm: answered at once when every message it counts has been handled, else once they
  // are. A flush whose writer cannot be answered is dropped.
  void OnFlush(const AmHeader& header, const Reply* reply);
  // A kByeAm: the token is forgotten; a named writer's connection is counted as closed (every
  // message it sent before its goodbye was handled).
  void OnBye(const AmHeader& header);
  // A kHelloAm: the token's writer is `name` (the payload's `length` bytes).
  void OnHello(const AmHeader& header, const std::byte* name, uint64_t length);
  // Refuses every write message that comes from now on on the tokens whose writer said it is
  // `writer` so far: none lands, and the flushes that count them say so (kRefusedWriter). A
  // token that says hello later is not refused. Returns how many of that writer's connections
  // can land nothing more here: the tokens it refused, and those that said goodbye.
  size_t Refuse(std::string_view writer);

  // Writers this target keeps state for (tests; the table must not grow without bound).
  size_t writers() const { return inbound_.size(); }

 private:
  struct Inbound {
    uint64_t handled = 0;  // write messages handled (landed or refused)
    // The first write refused since the last answer, and why (a Refusal; 0: none).
    uint64_t refused = 0;
    uint64_t refused_address = 0;
    uint64_t refused_length = 0;
    // Flushes that arrived before all of their writes (count, number).
    std::vector<std::pair<uint64_t, uint64_t>> waiting;
    // The writer's name (OnHello), and whether its writes are refused (Refuse).
    std::string writer;
    bool writer_refused = false;

    void Refuse(uint64_t address, uint64_t length, Refusal why = kRefusedOutside);
  };
  // Answers, in arrival order, the waiting flushes whose messages have all been handled.
  static void AnswerHandled(uint64_t token, Inbound& in, const Reply& reply);

  std::unordered_map<uint64_t, Inbound> inbound_;
  // Per named writer, its connections that said goodbye. Cleared whole past kMostClosedNames
  // names (a decode that outlives many prefill restarts): a count lost only makes a later Refuse
  // answer fewer, which a caller reads as less proven, never more.
  static constexpr size_t kMostClosedNames = 4096;
  std::unordered_map<std::string, size_t> closed_;
};

}  // namespace kvrail::transport::am

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_AM_PROTOCOL_H_
