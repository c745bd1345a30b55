#include "engine/transport/verbs/verbs_qp.h"

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvrail::transport::verbs_internal {

absl::Status VerbsCallError(const char* call, int error, absl::string_view where) {
  return absl::UnavailableError(
      absl::StrCat(call, " (", where, "): ", std::strerror(error), " (errno ", error, ")"));
}

uint32_t RandomPsn() {
  thread_local std::mt19937 random(std::random_device{}());
  return random() & 0xffffff;
}

std::string WcStatusText(ibv_wc_status status) {
  std::string text = absl::StrCat(ibv_wc_status_str(status));
  switch (status) {
    case IBV_WC_REM_ACCESS_ERR:
      return absl::StrCat("IBV_WC_REM_ACCESS_ERR: ", text,
                          " (the peer's region was deregistered, or its key or bounds refused "
                          "the write)");
    case IBV_WC_RETRY_EXC_ERR:
      return absl::StrCat("IBV_WC_RETRY_EXC_ERR: ", text,
                          " (the peer did not acknowledge: its process died or stopped, or the "
                          "link is down)");
    case IBV_WC_WR_FLUSH_ERR:
      return absl::StrCat("IBV_WC_WR_FLUSH_ERR: ", text);
    case IBV_WC_LOC_PROT_ERR:
      return absl::StrCat("IBV_WC_LOC_PROT_ERR: ", text);
    default:
      return absl::StrCat("work completion status ", static_cast<int>(status), ": ", text);
  }
}

absl::StatusOr<ibv_qp*> CreateQp(const VerbsApi& api, const Rail& rail, ibv_cq* cq,
                                 uint32_t max_send_wr, uint32_t max_send_sge,
                                 const std::string& where) {
  ibv_qp_init_attr init = {};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = max_send_wr;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = max_send_sge;
  init.cap.max_recv_sge = 1;
  ibv_qp* qp = api.create_qp(rail.pd(), &init);
  if (qp == nullptr) return VerbsCallError("ibv_create_qp", errno, where);
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = rail.port();
  attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (int rc = api.modify_qp(qp, &attr,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      rc != 0) {
    api.destroy_qp(qp);
    return VerbsCallError("ibv_modify_qp to INIT", rc, where);
  }
  return qp;
}

absl::Status QpToRtr(const VerbsApi& api, ibv_qp* qp, const Rail& rail,
                     const v1::VerbsQpInfo& remote, ibv_mtu mtu) {
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = mtu;
  attr.dest_qp_num = remote.qp_num();
  attr.rq_psn = remote.psn();
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.dlid = static_cast<uint16_t>(remote.lid());
  attr.ah_attr.port_num = rail.port();
  std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid().data(), 16);
  attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(rail.gid_index());
  attr.ah_attr.grh.hop_limit = 64;
  if (int rc = api.modify_qp(qp, &attr,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      rc != 0) {
    return VerbsCallError(
        "ibv_modify_qp to RTR", rc,
        absl::StrCat(rail.device(), " to remote QP ", remote.qp_num(), " GID ",
                     GidText(*reinterpret_cast<const ibv_gid*>(remote.gid().data()))));
  }
  return absl::OkStatus();
}

absl::Status QpToRts(const VerbsApi& api, ibv_qp* qp, uint32_t psn, uint8_t timeout,
                     uint8_t retry_cnt) {
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = timeout;
  attr.retry_cnt = retry_cnt;
  attr.rnr_retry = 7;
  attr.sq_psn = psn;
  attr.max_rd_atomic = 1;
  if (int rc = api.modify_qp(qp, &attr,
                             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
      rc != 0) {
    return VerbsCallError("ibv_modify_qp to RTS", rc, absl::StrCat("QP ", qp->qp_num));
  }
  return absl::OkStatus();
}

void DestroyQp(const VerbsApi& api, ibv_qp* qp) {
  if (qp == nullptr) return;
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_ERR;
  api.modify_qp(qp, &attr, IBV_QP_STATE);
  api.destroy_qp(qp);
}

}  // namespace kvrail::transport::verbs_internal
