// kiln.early_stopping — asks the run to stop when a monitored metric has not
// improved for `patience` checks in a row.
//
// [[callbacks]]
// path = "kiln_early_stopping"
// monitor = "val/loss"
// mode = "min"                  # "min": lower is better; "max": higher is better
// patience = 3                  # checks without improvement before stopping
// min_delta = 0.0               # an improvement must beat the best by more than this
// check_on = "validation_end"   # or "train_epoch_end", e.g. to monitor "train/loss"
//
// The best value and the count of checks without improvement are saved in
// checkpoints, so a resumed run keeps its patience where it was. A metric
// never recorded is warned about once; a fit that ran epochs but never
// validated (nothing to check) is warned about at its end.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>

#include "kiln/plugin.hpp"
#include "kiln_plugins/checks.hpp"

namespace {

constexpr const char* kId = "kiln.early_stopping";

enum class Mode { min, max };
enum class CheckOn { validation_end, train_epoch_end };

// Enough digits to read back the same double, for checkpoints.
std::string exact(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::string brief(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

class EarlyStopping final : public kiln::Callback {
 public:
  EarlyStopping(const kiln::Host& host, kiln::Config& config) : Callback(host) {
    monitor_ = config.get<std::string>("monitor", "val/loss");
    if (monitor_.empty()) throw kiln::ConfigError("'monitor' must name a metric");
    const std::string mode = config.get<std::string>("mode", "min");
    if (mode == "min")
      mode_ = Mode::min;
    else if (mode == "max")
      mode_ = Mode::max;
    else
      throw kiln::ConfigError("'mode' must be \"min\" or \"max\", not \"" + mode + "\"");
    patience_ = kiln_plugins::positive("patience", config.get<int64_t>("patience", 3));
    min_delta_ = kiln_plugins::non_negative("min_delta", config.get<double>("min_delta", 0.0));
    const std::string check_on = config.get<std::string>("check_on", "validation_end");
    if (check_on == "validation_end")
      check_on_ = CheckOn::validation_end;
    else if (check_on == "train_epoch_end")
      check_on_ = CheckOn::train_epoch_end;
    else
      throw kiln::ConfigError(
          "'check_on' must be \"validation_end\" or \"train_epoch_end\", not \"" + check_on + "\"");
  }

  void on_validation_end(const kiln_progress& progress) override {
    if (check_on_ == CheckOn::validation_end) check(progress);
  }
  void on_train_epoch_end(const kiln_progress& progress) override {
    if (progress.stage == KILN_STAGE_FIT) ++epochs_ended_;
    if (check_on_ == CheckOn::train_epoch_end) check(progress);
  }
  // A fit that trained whole epochs but never validated never gave early
  // stopping a value to check (no validation split, or validation that
  // never came round): say so rather than let it pass for "no stop needed",
  // as Lightning's EarlyStopping refuses a metric it never saw.
  void on_fit_end(const kiln_progress&) override {
    if (epochs_ended_ > 0 && checks_ == 0)
      host().warn("early stopping never checked '" + monitor_ + "': the fit ran " + std::to_string(epochs_ended_) +
                  (epochs_ended_ == 1 ? " epoch" : " epochs") +
                  " and no validation (the data module has no validation split, or trainer.check_val_every_n_epoch "
                  "is above the epochs run); check_on = \"train_epoch_end\" checks a training metric");
  }

  void state_save(kiln::StateWriter& writer) override {
    writer.write("monitor", monitor_);
    if (best_) writer.write("best", exact(*best_));
    writer.write("bad_checks", std::to_string(bad_checks_));
  }

  void state_load(const kiln::StateReader& reader) override {
    // A best value of another metric means nothing for this one: start afresh.
    const auto monitor = reader.read("monitor");
    if (monitor && *monitor != monitor_) {
      host().warn("checkpoint monitored '" + *monitor + "', this run monitors '" + monitor_ +
                  "'; starting patience afresh");
      return;
    }
    if (const auto best = reader.read("best")) best_ = parse<double>("best", *best);
    if (const auto bad = reader.read("bad_checks"))
      bad_checks_ = parse<int64_t>("bad_checks", *bad);
  }

 private:
  void check(const kiln_progress& progress) {
    // Only fit can be stopped; a validate run's hooks fire too.
    if (progress.stage != KILN_STAGE_FIT) return;
    ++checks_;
    const std::optional<double> value = host().metric(monitor_);
    if (!value) {
      if (!warned_missing_)
        host().warn("metric '" + monitor_ +
                    "' has not been recorded; early stopping does nothing until it is "
                    "(check 'monitor', and that the model logs it)");
      warned_missing_ = true;
      return;
    }
    if (improves(*value)) {
      best_ = *value;
      bad_checks_ = 0;
      return;
    }
    ++bad_checks_;
    if (bad_checks_ < patience_) return;
    host().request_stop("early stopping: '" + monitor_ + "' did not improve for " +
                        std::to_string(bad_checks_) + (bad_checks_ == 1 ? " check" : " checks") +
                        " (best " + (best_ ? brief(*best_) : std::string("none")) + ")");
  }

  // NaN never improves, so a diverged run runs out of patience.
  bool improves(double value) const {
    if (std::isnan(value)) return false;
    if (!best_) return true;
    return mode_ == Mode::min ? value < *best_ - min_delta_ : value > *best_ + min_delta_;
  }

  template <class T>
  static T parse(const std::string& key, const std::string& text) {
    try {
      size_t used = 0;
      T value;
      if constexpr (std::is_floating_point_v<T>)
        value = std::stod(text, &used);
      else
        value = std::stoll(text, &used);
      if (used == text.size()) return value;
    } catch (const std::exception&) {
    }
    throw std::runtime_error("checkpoint state '" + key + "' is not a number (\"" + text +
                             "\"); the checkpoint is corrupt or from another plugin");
  }

  std::string monitor_;
  Mode mode_ = Mode::min;
  int64_t patience_ = 3;
  double min_delta_ = 0.0;
  CheckOn check_on_ = CheckOn::validation_end;

  std::optional<double> best_;
  int64_t bad_checks_ = 0;
  bool warned_missing_ = false;
  int64_t epochs_ended_ = 0;  // this fit's training epochs (stage fit)
  int64_t checks_ = 0;        // this fit's checks, with or without a value
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<EarlyStopping>(
    {kId, "Early stopping", "0.1.0", "Stops fit when a monitored metric stops improving"}))
