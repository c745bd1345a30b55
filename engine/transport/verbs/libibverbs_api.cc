// LibibverbsApi: the seam's table filled with rdma-core's libibverbs (engine/transport/verbs/
// verbs_api.h). The inline helpers of verbs.h (ibv_post_send, ibv_poll_cq, ibv_req_notify_cq,
// ibv_query_gid_ex) are wrapped in functions so that they have addresses.
#include <dlfcn.h>

#include "engine/transport/verbs/verbs_api.h"

namespace kvrail::transport {
namespace {

int QueryGidEx(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
               uint32_t flags) {
  return ibv_query_gid_ex(context, port_num, gid_index, entry, flags);
}
int ReqNotifyCq(ibv_cq* cq, int solicited_only) { return ibv_req_notify_cq(cq, solicited_only); }
int PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc) { return ibv_poll_cq(cq, num_entries, wc); }
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  return ibv_post_send(qp, wr, bad_wr);
}
ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr(pd, addr, length, access);
}

// ibv_reg_dmabuf_mr came with rdma-core 34: looked up at run time so that an older libibverbs
// still loads (the backend then registers GPU memory through nvidia-peermem, or not at all).
using RegDmabufMr = ibv_mr* (*)(ibv_pd*, uint64_t, size_t, uint64_t, int, int);
RegDmabufMr FindRegDmabufMr() {
  return reinterpret_cast<RegDmabufMr>(dlsym(RTLD_DEFAULT, "ibv_reg_dmabuf_mr"));
}

VerbsApi Make() {
  VerbsApi api;
  api.provider = "libibverbs";
  api.get_device_list = &ibv_get_device_list;
  api.free_device_list = &ibv_free_device_list;
  api.get_device_name = &ibv_get_device_name;
  api.open_device = &ibv_open_device;
  api.close_device = &ibv_close_device;
  api.query_device = &ibv_query_device;
  api.query_port = [](ibv_context* c, uint8_t port, ibv_port_attr* a) {
    return ibv_query_port(c, port, a);
  };
  api.query_gid_ex = &QueryGidEx;
  api.alloc_pd = &ibv_alloc_pd;
  api.dealloc_pd = &ibv_dealloc_pd;
  api.reg_mr = &RegMr;
  api.reg_dmabuf_mr = FindRegDmabufMr();
  api.dereg_mr = &ibv_dereg_mr;
  api.create_comp_channel = &ibv_create_comp_channel;
  api.destroy_comp_channel = &ibv_destroy_comp_channel;
  api.create_cq = &ibv_create_cq;
  api.destroy_cq = &ibv_destroy_cq;
  api.req_notify_cq = &ReqNotifyCq;
  api.get_cq_event = &ibv_get_cq_event;
  api.ack_cq_events = &ibv_ack_cq_events;
  api.poll_cq = &PollCq;
  api.create_qp = &ibv_create_qp;
  api.modify_qp = &ibv_modify_qp;
  api.destroy_qp = &ibv_destroy_qp;
  api.post_send = &PostSend;
  return api;
}

}  // namespace

const VerbsApi& LibibverbsApi() {
  static const VerbsApi api = Make();
  return api;
}

}  // namespace kvrail::transport
