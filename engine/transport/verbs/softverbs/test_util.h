// Helpers shared by the softverbs tests: an endpoint (context, PD, CQ, QP) and the RC
// connection sequence (RESET -> INIT -> RTR -> RTS) the verbs backend performs.
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_TEST_UTIL_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_TEST_UTIL_H_

#include <infiniband/verbs.h>

#include <cstring>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/transport/verbs/softverbs/softverbs.h"

namespace kvrail::transport::softverbs::testing {

inline const VerbsApi& Api() { return SoftVerbsApi(); }

inline ibv_context* OpenByName(const char* name) {
  int n = 0;
  ibv_device** list = Api().get_device_list(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n; ++i) {
    if (std::strcmp(Api().get_device_name(list[i]), name) == 0) ctx = Api().open_device(list[i]);
  }
  Api().free_device_list(list);
  return ctx;
}

inline int ToInit(ibv_qp* qp) {
  ibv_qp_attr a;
  std::memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  return Api().modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

inline int ToRtr(ibv_qp* qp, uint32_t dest_qpn, const ibv_gid& dgid, uint8_t sgid_index = 1) {
  ibv_qp_attr a;
  std::memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = dgid;
  a.ah_attr.grh.sgid_index = sgid_index;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  return Api().modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

// timeout 14 with retry_cnt 7: a budget of 4.096 us x 2^14 x 8 = 537 ms, ample on a loaded
// machine under a sanitizer. (timeout 8, retry_cnt 2 would be 3 ms: the 50 ms floor.)
inline int ToRts(ibv_qp* qp, uint8_t timeout = 14, uint8_t retry_cnt = 7) {
  ibv_qp_attr a;
  std::memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = timeout;
  a.retry_cnt = retry_cnt;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  return Api().modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

inline int SetState(ibv_qp* qp, ibv_qp_state state) {
  ibv_qp_attr a;
  std::memset(&a, 0, sizeof(a));
  a.qp_state = state;
  return Api().modify_qp(qp, &a, IBV_QP_STATE);
}

inline ibv_gid Gid(ibv_context* ctx, uint32_t index = 1) {
  ibv_gid_entry e;
  std::memset(&e, 0, sizeof(e));
  Api().query_gid_ex(ctx, 1, index, &e, 0);
  return e.gid;
}

inline ibv_qp* MakeQp(ibv_pd* pd, ibv_cq* cq, uint32_t max_send_wr = 256) {
  ibv_qp_init_attr init;
  std::memset(&init, 0, sizeof(init));
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = max_send_wr;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 4;
  init.cap.max_recv_sge = 1;
  return Api().create_qp(pd, &init);
}

// Polls until `n` completions arrived or `timeout` passed; returns what arrived.
inline std::vector<ibv_wc> PollN(ibv_cq* cq, size_t n, absl::Duration timeout = absl::Seconds(10)) {
  std::vector<ibv_wc> out;
  const absl::Time deadline = absl::Now() + timeout;
  while (out.size() < n && absl::Now() < deadline) {
    ibv_wc wc[16];
    const int got = Api().poll_cq(cq, 16, wc);
    if (got < 0) break;
    out.insert(out.end(), wc, wc + got);
    if (got == 0) absl::SleepFor(absl::Microseconds(100));
  }
  return out;
}

inline ibv_send_wr Write(uint64_t wr_id, ibv_sge* sge, uint64_t raddr, uint32_t rkey,
                         bool signaled = true) {
  ibv_send_wr wr;
  std::memset(&wr, 0, sizeof(wr));
  wr.wr_id = wr_id;
  wr.sg_list = sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  return wr;
}

}  // namespace kvrail::transport::softverbs::testing

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_TEST_UTIL_H_
