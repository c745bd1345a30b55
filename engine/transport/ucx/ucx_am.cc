#include "engine/transport/ucx/ucx_am.h"

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "engine/transport/landing_copy.h"
#include "engine/transport/ucx/am_protocol.h"
#include "engine/transport/ucx/ucx_context.h"
#include "engine/transport/ucx/ucx_lane.h"

namespace kvrail::transport::ucx_internal {
namespace {

// The writer's name, sent as its first message on a connection (kHelloAm), and the header UCX
// reads with it: both kept until the send completes.
struct OwnedHello {
  am::AmHeader header;
  std::string name;
};

// What SendOwnedAm sends of each kind it owns: the header's bytes, then the payload's.
using Bytes = absl::Span<const char>;
template <typename Header>
std::pair<Bytes, Bytes> Parts(const Header& header) {
  return {Bytes(reinterpret_cast<const char*>(&header), sizeof(Header)), Bytes()};
}
std::pair<Bytes, Bytes> Parts(const OwnedHello& hello) {
  return {Bytes(reinterpret_cast<const char*>(&hello.header), sizeof(hello.header)),
          Bytes(hello.name.data(), hello.name.size())};
}

// Sends an active message of `owned` (allocated with new), which UCX may read until the send
// completes, then frees it: its header, and the payload it names (Parts(*owned)). The outcome
// is not reported: the target's answers, a writer's hello and its goodbye are best effort (a
// peer that is gone needs none of them).
template <typename Owned>
void SendOwnedAm(ucp_ep_h ep, unsigned id, Owned* owned, uint32_t flags = UCP_AM_SEND_FLAG_EAGER) {
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = flags;
  param.cb.send = [](void* request, ucs_status_t, void* user_data) {
    delete static_cast<Owned*>(user_data);
    ucp_request_free(request);
  };
  param.user_data = owned;
  const auto [header, payload] = Parts(*owned);
  ucs_status_ptr_t request =
      ucp_am_send_nbx(ep, id, header.data(), header.size(), payload.data(), payload.size(), &param);
  if (!UCS_PTR_IS_PTR(request)) delete owned;  // done at once, or failed
}

// The writer's endpoint, from which a message's answer goes back; nullptr when the writer did
// not send one (not a kvrail writer).
ucp_ep_h ReplyEndpoint(const ucp_am_recv_param_t* param) {
  return (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
}

// Answers a flush through the writer's reply endpoint; best effort (SendOwnedAm).
class ReplyThrough {
 public:
  explicit ReplyThrough(ucp_ep_h reply_ep) : reply_ep_(reply_ep) {}
  void operator()(const am::FlushReply& reply) const {
    SendOwnedAm(reply_ep_, am::kFlushReplyAm, new am::FlushReply(reply));
  }

 private:
  ucp_ep_h reply_ep_;
};

// The target's side of a flush (am::AmTarget::OnFlush).
ucs_status_t OnFlushAm(void* arg, const void* header, size_t header_length, void* /*data*/,
                       size_t /*length*/, const ucp_am_recv_param_t* param) {
  am::AmHeader flush;
  if (!am::ReadHeader(header, header_length, &flush)) return UCS_OK;
  ucp_ep_h reply_ep = ReplyEndpoint(param);
  if (reply_ep == nullptr) return UCS_OK;
  const ReplyThrough send(reply_ep);
  const am::Reply reply(send);
  static_cast<Lane*>(arg)->target.OnFlush(flush, &reply);
  return UCS_OK;
}

// The writer's side of a flush's answer: the flush completes, with the first failure of its
// lane's batches, else with the refusal the target reports, else OK.
ucs_status_t OnFlushReplyAm(void* arg, const void* header, size_t header_length, void* /*data*/,
                            size_t /*length*/, const ucp_am_recv_param_t* /*param*/) {
  am::FlushReply reply;
  if (!am::ReadHeader(header, header_length, &reply)) return UCS_OK;
  Lane& lane = *static_cast<Lane*>(arg);
  auto found = lane.outbound.find(reply.token);
  if (found == lane.outbound.end()) return UCS_OK;  // disconnected since
  PeerState& peer = *found->second;
  PeerLane& pl = peer.lanes[lane.index];
  if (pl.fence_seq != 0 && reply.seq == pl.fence_seq) {
    pl.fence_answered = true;  // the close's fence (SendCloseFence)
    return UCS_OK;
  }
  for (Op* op : pl.ops) {
    if (op->kind != OpKind::kAmFlush || op->seq != reply.seq) continue;
    lane.FinishFlush(op, am::FlushReplyStatus(reply, peer.id, lane.index));
    break;
  }
  return UCS_OK;
}

// A writer that disconnects says goodbye: the target forgets what it kept for it.
ucs_status_t OnByeAm(void* arg, const void* header, size_t header_length, void* /*data*/,
                     size_t /*length*/, const ucp_am_recv_param_t* /*param*/) {
  am::AmHeader bye;
  if (!am::ReadHeader(header, header_length, &bye)) return UCS_OK;
  static_cast<Lane*>(arg)->target.OnBye(bye);
  return UCS_OK;
}

// A writer's name: the target keeps it with the token, so that it may refuse that writer.
ucs_status_t OnHelloAm(void* arg, const void* header, size_t header_length, void* data,
                       size_t length, const ucp_am_recv_param_t* param) {
  am::AmHeader hello;
  if (!am::ReadHeader(header, header_length, &hello)) return UCS_OK;
  // A rendezvous never comes from a kvrail writer (eager only): no name is taken from one.
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) return UCS_OK;
  static_cast<Lane*>(arg)->target.OnHello(hello, static_cast<const std::byte*>(data), length);
  return UCS_OK;
}

class RegisteredMemory final : public am::AmLanding {
 public:
  RegisteredMemory(const Regions& regions, LandingStores stores)
      : regions_(regions), stores_(stores) {}
  bool Registered(uint64_t address, uint64_t length) const override {
    return regions_.Covering(address, length).has_value();
  }
  void CopyRows(uint64_t address, uint64_t stride, const std::byte* bytes, uint64_t length,
                uint64_t rows) override {
    LandingCopyRows(reinterpret_cast<std::byte*>(static_cast<uintptr_t>(address)), stride, bytes,
                    length, length, rows, stores_);
  }
  void Fence() override { LandingFence(); }

 private:
  const Regions& regions_;
  const LandingStores stores_;
};

// The target's side of a write message (kWriteAm, kWritesAm or kRowsAm; arg is the Lane): to the
// lane's am::AmTarget, which lands it in the memory registered now.
ucs_status_t OnWriteMessage(unsigned id, void* arg, const void* header, size_t header_length,
                            void* data, size_t length, const ucp_am_recv_param_t* param) {
  am::AmHeader parsed;
  if (!am::ReadHeader(header, header_length, &parsed)) return UCS_OK;
  Lane& lane = *static_cast<Lane*>(arg);
  RegisteredMemory landing(lane.shared->regions, lane.shared->landing_stores);
  // A rendezvous never comes from a kvrail writer (eager only).
  const bool whole = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0;
  const ucp_ep_h reply_ep = ReplyEndpoint(param);
  const ReplyThrough send(reply_ep);
  const am::Reply reply(send);
  const auto* bytes = static_cast<const std::byte*>(data);
  if (id == am::kWritesAm) {
    lane.target.OnWrites(parsed, bytes, length, whole, landing,
                         reply_ep != nullptr ? &reply : nullptr);
  } else if (id == am::kRowsAm) {
    lane.target.OnRows(parsed, bytes, length, whole, landing,
                       reply_ep != nullptr ? &reply : nullptr);
  } else {
    lane.target.OnWrite(parsed, bytes, length, whole, landing,
                        reply_ep != nullptr ? &reply : nullptr);
  }
  return UCS_OK;
}

}  // namespace

absl::Status SetAmHandlers(Lane& lane) {
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
      {am::kWriteAm,
       [](void* arg, const void* header, size_t header_length, void* data, size_t length,
          const ucp_am_recv_param_t* param) {
         return OnWriteMessage(am::kWriteAm, arg, header, header_length, data, length, param);
       }},
      {am::kWritesAm,
       [](void* arg, const void* header, size_t header_length, void* data, size_t length,
          const ucp_am_recv_param_t* param) {
         return OnWriteMessage(am::kWritesAm, arg, header, header_length, data, length, param);
       }},
      {am::kRowsAm,
       [](void* arg, const void* header, size_t header_length, void* data, size_t length,
          const ucp_am_recv_param_t* param) {
         return OnWriteMessage(am::kRowsAm, arg, header, header_length, data, length, param);
       }},
      {am::kFlushAm, OnFlushAm},
      {am::kFlushReplyAm, OnFlushReplyAm},
      {am::kByeAm, OnByeAm},
      {am::kHelloAm, OnHelloAm},
  };
  for (const auto& [id, callback] : handlers) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = callback;
    hp.arg = &lane;
    const ucs_status_t s = ucp_worker_set_am_recv_handler(lane.worker, &hp);
    if (s != UCS_OK) {
      return FromUcs(
          s, absl::StrFormat("ucx: ucp_worker_set_am_recv_handler for lane %d", lane.index));
    }
  }
  return absl::OkStatus();
}

void SendHello(PeerLane& pl, const std::string& name) {
  SendOwnedAm(pl.ep, am::kHelloAm, new OwnedHello{am::AmHeader{.token = pl.writer.token()}, name});
}

void SendBye(PeerLane& pl) {
  SendOwnedAm(pl.ep, am::kByeAm, new am::AmHeader{.token = pl.writer.token()});
}

void SendCloseFence(PeerLane& pl) {
  auto* header = new am::AmHeader(pl.writer.NextFlush());
  pl.fence_seq = header->b;
  pl.fence_answered = false;
  SendOwnedAm(pl.ep, am::kFlushAm, header, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
}

void IssueAmWrites(Lane& lane, PeerLane& pl, Op* op) {
  am::PlanMessages(op->writes, lane.shared->am_slice_bytes, &op->plan);
  // UCX reads headers, packed payloads and gather lists until each send completes: none may
  // move, so each is reserved whole first.
  const am::PlanSizes sizes = am::SizesOf(op->plan, op->writes);
  op->headers.reserve(sizes.headers);
  if (op->packed.size() < sizes.packed_bytes) op->packed.resize(sizes.packed_bytes);
  op->rows.reserve(sizes.rows);
  op->gather.reserve(sizes.gather);
  size_t packed_used = 0;
  ucp_request_param_t param = RequestParam(op);
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  // Eager: the target gets each message whole inside its progress and never has to ask for it
  // (a rendezvous would make the target send); reply: the target answers flushes through it.
  param.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  ucp_request_param_t gathered = param;
  gathered.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
  gathered.datatype = ucp_dt_make_iov();
  for (const am::AmMessage& message : op->plan) {
    am::AmHeader& header = op->headers.emplace_back(pl.writer.WriteHeader(message, op->writes));
    ucs_status_ptr_t request;
    if (message.id == am::kWriteAm) {
      const Write& w = op->writes[message.first];
      request =
          ucp_am_send_nbx(pl.ep, am::kWriteAm, &header, sizeof(header),
                          op->base + w.local_offset + message.row * w.local_stride + message.offset,
                          message.length, &param);
    } else if (am::PackedBeforeSending(message, op->writes)) {
      // Packed here: one piece, which UCX sends in place.
      std::byte* payload = op->packed.data() + packed_used;
      const uint64_t bytes = am::PayloadBytes(message, op->writes);
      am::PackPayload(message, op->writes, op->base, payload);
      packed_used += bytes;
      request = ucp_am_send_nbx(pl.ep, message.id, &header, sizeof(header), payload, bytes, &param);
      // Sent already (the socket took the bytes: UCX holds the payload no more), as most are:
      // the next message packs into the same bytes, still in this core's cache, instead of
      // walking the batch's whole buffer through memory.
      if (request == nullptr) packed_used -= bytes;
    } else {
      // A rows message whose source rows are contiguous (as a prefill of the larger TP's are),
      // or a single row: its PackedRows, then the rows in place.
      const Write& w = op->writes[message.first];
      const size_t first_iov = op->gather.size();
      am::PackedRows& rows = op->rows.emplace_back(am::PackedRows{message.length, w.length});
      op->gather.push_back({&rows, sizeof(am::PackedRows)});
      const std::byte* first_row = op->base + w.local_offset + message.row * w.local_stride;
      op->gather.push_back({const_cast<std::byte*>(first_row), message.length * w.length});
      request = ucp_am_send_nbx(pl.ep, am::kRowsAm, &header, sizeof(header), &op->gather[first_iov],
                                op->gather.size() - first_iov, &gathered);
    }
    if (UCS_PTR_IS_ERR(request)) {
      op->status =
          PostFailure(request, absl::StrFormat("%s: write %d of %d: ucp_am_send_nbx",
                                               BatchContext(pl.peer->id, lane.index, op->source),
                                               message.first, op->writes.size()));
      return;
    }
    pl.writer.Sent();
    if (request != nullptr) ++op->requests;
  }
}

void SendAmFlush(Lane& lane, PeerLane& pl, Op* op) {
  const am::AmHeader& header = op->headers.emplace_back(pl.writer.NextFlush());
  op->seq = header.b;
  ucp_request_param_t param = RequestParam(op);
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  Lane::Hold(op);
  ucs_status_ptr_t request =
      ucp_am_send_nbx(pl.ep, am::kFlushAm, &header, sizeof(header), nullptr, 0, &param);
  if (UCS_PTR_IS_PTR(request)) ++op->requests;
  if (!lane.Release(op)) return;
  if (UCS_PTR_IS_ERR(request)) {
    lane.FinishFlush(
        op, PostFailure(request, FlushContext(pl.peer->id, lane.index) + ": ucp_am_send_nbx"));
  }
}

// Where an active-message write lands at the target: memory this transport has registered
// now, read on the lane's thread holding its worker mutex.

}  // namespace kvrail::transport::ucx_internal
