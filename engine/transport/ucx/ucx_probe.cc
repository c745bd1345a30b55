#include "engine/transport/ucx/ucx_probe.h"

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include "absl/strings/str_cat.h"

namespace kvrail::transport {

namespace {

const char* KindOf(uct_device_type_t type) {
  switch (type) {
    case UCT_DEVICE_TYPE_NET:
      return "network";
    case UCT_DEVICE_TYPE_SHM:
      return "shared memory";
    case UCT_DEVICE_TYPE_ACC:
      return "accelerator";
    case UCT_DEVICE_TYPE_SELF:
      return "self";
    default:
      return "other";
  }
}

// The resources of one memory domain of `component`, appended to `probe`.
void ProbeMd(uct_component_h component, const std::string& component_name,
             const std::string& md_name, DataPlaneProbe& probe) {
  uct_md_config_t* config = nullptr;
  ucs_status_t status = uct_md_config_read(component, nullptr, nullptr, &config);
  if (status != UCS_OK) {
    probe.ucx_problems.push_back(
        absl::StrCat(md_name, ": uct_md_config_read: ", ucs_status_string(status)));
    return;
  }
  uct_md_h md = nullptr;
  status = uct_md_open(component, md_name.c_str(), config, &md);
  uct_config_release(config);
  if (status != UCS_OK) {
    probe.ucx_problems.push_back(
        absl::StrCat(md_name, ": uct_md_open: ", ucs_status_string(status)));
    return;
  }
  uct_tl_resource_desc_t* resources = nullptr;
  unsigned count = 0;
  status = uct_md_query_tl_resources(md, &resources, &count);
  if (status != UCS_OK) {
    probe.ucx_problems.push_back(
        absl::StrCat(md_name, ": uct_md_query_tl_resources: ", ucs_status_string(status)));
  } else {
    for (unsigned i = 0; i < count; ++i) {
      probe.ucx_resources.push_back({component_name, md_name, resources[i].tl_name,
                                     resources[i].dev_name, KindOf(resources[i].dev_type)});
    }
    uct_release_tl_resource_list(resources);
  }
  uct_md_close(md);
}

}  // namespace

absl::Status ProbeUcx(DataPlaneProbe& probe) {
  probe.ucx_version = ucp_get_version_string();
  uct_component_h* components = nullptr;
  unsigned count = 0;
  ucs_status_t status = uct_query_components(&components, &count);
  if (status != UCS_OK) {
    return absl::InternalError(
        absl::StrCat("UCX: uct_query_components: ", ucs_status_string(status)));
  }
  for (unsigned c = 0; c < count; ++c) {
    uct_component_attr_t attr = {};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (!mds.empty() && uct_component_query(components[c], &attr) != UCS_OK) continue;
    for (const uct_md_resource_desc_t& md : mds) {
      ProbeMd(components[c], attr.name, md.md_name, probe);
    }
  }
  uct_release_component_list(components);
  return absl::OkStatus();
}

}  // namespace kvrail::transport
