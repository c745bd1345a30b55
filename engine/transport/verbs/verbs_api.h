// The verbs seam: every libibverbs call the verbs backend makes goes through one table of
// function pointers, one per call. LibibverbsApi() is rdma-core's libibverbs; the software
// provider (engine/transport/verbs/softverbs) implements the same table with RC write semantics
// between processes on one host, so the backend's real call sequence (device discovery, PD,
// MR, CQ, QP state changes, chained posts, polling) is what its tests run.
//
// Objects are rdma-core's own structs (ibv_context, ibv_pd, ibv_mr, ibv_cq, ibv_qp,
// ibv_comp_channel), made by whichever provider the table belongs to and passed back only to
// that table. The backend reads only these fields of them: ibv_mr::{addr, length, lkey, rkey},
// ibv_qp::qp_num, ibv_comp_channel::fd. It never calls libibverbs' inline helpers
// (ibv_post_send, ibv_poll_cq, ibv_req_notify_cq), which go through a context's ops table that
// a software provider does not fill: it calls post_send, poll_cq and req_notify_cq here.
//
// Each function keeps its libibverbs contract (return values and errno); the comments say only
// what differs or what the backend relies on.
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_API_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_API_H_

#include <infiniband/verbs.h>

#include <cstdint>

namespace kvrail::transport {

struct VerbsApi {
  // Who answers: "libibverbs" (rdma-core, real devices) or "softverbs" (the software provider,
  // never hardware). Reports and bench tables print it beside every figure.
  const char* provider = "";

  // Discovery.
  ibv_device** (*get_device_list)(int* num_devices) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*close_device)(ibv_context* context) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  int (*query_port)(ibv_context* context, uint8_t port_num, ibv_port_attr* attr) = nullptr;
  // The GID at `index` with its type (IBV_GID_TYPE_IB, _ROCE_V1, _ROCE_V2) and the ifindex of
  // its network device (0 for InfiniBand). An unused index answers ENODATA.
  int (*query_gid_ex)(ibv_context* context, uint32_t port_num, uint32_t gid_index,
                      ibv_gid_entry* entry, uint32_t flags) = nullptr;

  // Protection domains and memory registration.
  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  // GPU memory exported as a dmabuf (CUDA's cuMemGetHandleForAddressRange). Null where the
  // provider offers none (rdma-core before 34, the software provider).
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                           int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;

  // Completion queues and their event channels: a lane's thread sleeps in poll(2) on the
  // channel's fd (and its own wake-up fd), then get_cq_event, ack_cq_events, req_notify_cq and
  // poll_cq until empty.
  ibv_comp_channel* (*create_comp_channel)(ibv_context* context) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel* channel) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  int (*req_notify_cq)(ibv_cq* cq, int solicited_only) = nullptr;
  // Blocks until an event; the backend calls it only after poll(2) said the fd is readable
  // (the channel's fd is non-blocking, so it then fails with EAGAIN at worst).
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) = nullptr;
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents) = nullptr;
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc) = nullptr;

  // Reliable-connected queue pairs.
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  // A chain of work requests, one doorbell.
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) = nullptr;
};

// rdma-core's libibverbs.
const VerbsApi& LibibverbsApi();

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_API_H_
