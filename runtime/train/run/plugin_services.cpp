#include "train/run/plugin_services.hpp"

#include "train/loops/stop_condition.hpp"
#include "train/run/epoch_collections.hpp"
#include "train/run/run_files.hpp"
#include "train/run/run_metrics.hpp"

namespace kiln {

void PluginServices::record_metric(const std::string& plugin_id, const char* name, double value, double weight,
                                   uint32_t flags) {
  metrics_.record_from(plugin_id, name, value, weight, flags);
}

void PluginServices::record_metric_tensor(const std::string& plugin_id, const char* name, const at::Tensor& value,
                                          double weight, uint32_t flags) {
  metrics_.record_tensor_from(plugin_id, name, value, weight, flags);
}

bool PluginServices::metric(const char* name, double* out) const {
  const auto value = metrics_.latest(name);
  if (value) *out = *value;
  return value.has_value();
}

void PluginServices::request_stop(const std::string& plugin_id, const char* reason) {
  stop_.request(plugin_id, reason ? reason : "");
}

std::string PluginServices::collect(const std::string& plugin_id, bool main_thread, const char* name,
                                    const at::Tensor& rows) {
  return collections_.collect(plugin_id, main_thread, name, rows);
}

std::string PluginServices::write_run_file(const std::string& plugin_id, const std::string& name, std::string bytes) {
  return files_.save(plugin_id, name, std::move(bytes));
}

}  // namespace kiln
