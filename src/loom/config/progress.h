#pragma once
// ProgressBar: one console line per optimizer step (loss, lr, grad norm, throughput, ETA),
// redrawn in place on a terminal and printed as plain log lines otherwise.
#include <functional>
#include <iostream>
#include <string>

namespace loom::config {

// Whether the bar may redraw in place: stdout is a terminal and this is not a rank started by
// an MPI launcher or Slurm (mpirun gives ranks a pseudo-terminal even when its own output goes
// to a log file, which '\r' redraws would fill).
bool stdout_is_interactive();

class ProgressBar {
 public:
  // Seconds since an arbitrary epoch; injectable so tests can fix the ETA.
  using Clock = std::function<double()>;

  // `total_steps`: the run's last step. `first_step`: steps already done when this process
  // started (0, or the step a resumed run continues from); the ETA counts only steps timed
  // here. `is_terminal`: redraw in place with '\r' (pass stdout_is_interactive()); otherwise a
  // plain line every `log_interval` steps and at the last step. An empty `clock` uses
  // std::chrono::steady_clock.
  ProgressBar(int total_steps, int first_step, bool is_terminal, int log_interval = 1,
              std::ostream& out = std::cout, Clock clock = {});
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  // Ends a bar left open on a terminal, so the shell prompt starts on its own line.
  ~ProgressBar();

  // Reports that `step` steps are done (1-based: the last call passes total_steps).
  // `extra`: more statistics appended to the line (e.g. MoE routing), or empty.
  void update(int step, double loss, double lr, double grad_norm, double tokens_per_s, const std::string& extra = "");
  // Prints `text` on its own line (e.g. a validation loss) and redraws the bar below it.
  void message(const std::string& text);
  // The run's work done after `step` steps, for the ETA when steps differ in size (under a batch
  // ramp-up: the samples consumed); unset, every step is the same work.
  using Work = std::function<double(int step)>;
  void set_work(Work work) { work_ = std::move(work); }

  // "12/100 loss 3.2104 lr 3.00e-04 gnorm 0.912 12.3k tok/s ETA 1m02s"; `eta_s` < 0 = unknown.
  static std::string format_stats(int step, int total_steps, double loss, double lr, double grad_norm,
                                  double tokens_per_s, double eta_s);
  // "[########............]" with `width` cells filled in proportion to step / total_steps.
  static std::string format_bar(int step, int total_steps, int width = 20);
  // "45s", "1m02s", "2h03m"; "--" when negative (unknown).
  static std::string format_duration(double seconds);

 private:
  void draw(const std::string& line);

  int total_steps_;
  int first_step_;
  bool is_terminal_;
  int log_interval_;
  std::ostream& out_;
  Clock clock_;
  Work work_;
  double start_s_;
  std::string bar_line_;     // the bar currently on screen (terminal mode), empty when none
  size_t drawn_width_ = 0;   // characters of the last redraw, to blank a shorter one
};

}  // namespace loom::config
