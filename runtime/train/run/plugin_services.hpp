// What plugins reach through kiln_host (RunServices): their metrics go to
// the run's metrics, their stop requests to the stop condition, and they
// learn the process group's shape; their collected rows go to the epoch's
// collections, their own files to the run directory.
#pragma once

#include "plugin/run_services.hpp"

namespace kiln {

class EpochCollections;
class RunFiles;
class RunMetrics;
class StopCondition;

class PluginServices final : public RunServices {
 public:
  PluginServices(RunMetrics& metrics, StopCondition& stop, EpochCollections& collections, RunFiles& files,
                 int32_t rank, int32_t world_size)
      : metrics_(metrics),
        stop_(stop),
        collections_(collections),
        files_(files),
        rank_(rank),
        world_size_(world_size) {}

  void record_metric(const std::string& plugin_id, const char* name, double value, double weight,
                     uint32_t flags) override;
  void record_metric_tensor(const std::string& plugin_id, const char* name, const at::Tensor& value, double weight,
                            uint32_t flags) override;
  bool metric(const char* name, double* out) const override;
  void request_stop(const std::string& plugin_id, const char* reason) override;
  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return world_size_; }
  std::string collect(const std::string& plugin_id, bool main_thread, const char* name,
                      const at::Tensor& rows) override;
  std::string write_run_file(const std::string& plugin_id, const std::string& name, std::string bytes) override;

 private:
  RunMetrics& metrics_;
  StopCondition& stop_;
  EpochCollections& collections_;
  RunFiles& files_;
  int32_t rank_, world_size_;
};

}  // namespace kiln
