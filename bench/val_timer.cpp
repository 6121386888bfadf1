// kiln.bench.val_timer — a callback for bench/collect_cost.sh: the wall time
// of each validation epoch, from on_validation_start to on_validation_end
// (every batch, the epoch-end gather of collected rows and the model's
// on_epoch_end, the metrics' reduction), printed by rank 0 as
//   "bench: validation epoch <ms> ms"
#include <chrono>
#include <cstdio>

#include <kiln/plugin.hpp>

namespace {

class ValTimer final : public kiln::Callback {
 public:
  ValTimer(const kiln::Host& host, kiln::Config&) : kiln::Callback(host) {}
  void on_validation_start(const kiln_progress&) override { start_ = std::chrono::steady_clock::now(); }
  void on_validation_end(const kiln_progress&) override {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
    char text[64];
    std::snprintf(text, sizeof text, "bench: validation epoch %.2f ms", ms);
    if (host().rank() == 0) host().info(text);
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<ValTimer>({"kiln.bench.val_timer", "Validation epoch timer (bench)", "1.0.0"}))
