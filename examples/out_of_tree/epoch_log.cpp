// example.epoch_log — a callback that writes one line per finished epoch.
// The second plugin of this project: a find_package(Kiln) project may define
// any number of them with kiln_add_plugin().
#include <string>

#include <kiln/plugin.hpp>

namespace {

class EpochLog : public kiln::Callback {
 public:
  EpochLog(const kiln::Host& host, kiln::Config&) : Callback(host) {}
  void on_train_epoch_end(const kiln_progress& p) override {
    host().info("example.epoch_log: epoch " + std::to_string(p.epoch) + " done");
  }
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<EpochLog>({"example.epoch_log", "epoch log", "1"}))
