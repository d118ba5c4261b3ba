#include "loom/config/progress.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <unistd.h>

#include "loom/core/error.h"

namespace loom::config {

bool stdout_is_interactive() {
  for (const char* launcher_variable : {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (std::getenv(launcher_variable) != nullptr) return false;
  }
  return ::isatty(STDOUT_FILENO) == 1;
}

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string printf_string(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return buffer;
}

// 950 -> "950", 12345 -> "12.3k", 4.2e6 -> "4.2M".
std::string format_rate(double value) {
  if (!(value >= 0) || !std::isfinite(value)) return "--";
  if (value < 1e3) return printf_string("%.0f", value);
  if (value < 1e6) return printf_string("%.1fk", value / 1e3);
  if (value < 1e9) return printf_string("%.1fM", value / 1e6);
  return printf_string("%.1fG", value / 1e9);
}

}  // namespace

ProgressBar::ProgressBar(int total_steps, int first_step, bool is_terminal, int log_interval, std::ostream& out,
                         Clock clock)
    : total_steps_(total_steps),
      first_step_(first_step),
      is_terminal_(is_terminal),
      log_interval_(log_interval),
      out_(out),
      clock_(clock ? std::move(clock) : Clock(steady_seconds)) {
  LOOM_CHECK(total_steps >= 1, "progress bar: total steps = " + std::to_string(total_steps) + " must be >= 1");
  LOOM_CHECK(first_step >= 0 && first_step <= total_steps,
        "progress bar: first step = " + std::to_string(first_step) + " must be in [0, " +
            std::to_string(total_steps) + "]");
  LOOM_CHECK(log_interval >= 1, "progress bar: log interval = " + std::to_string(log_interval) + " must be >= 1");
  start_s_ = clock_();
}

ProgressBar::~ProgressBar() {
  if (is_terminal_ && !bar_line_.empty()) {
    out_ << '\n';
    out_.flush();
  }
}

std::string ProgressBar::format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "--";
  long long s = std::llround(seconds);
  char buffer[48];
  if (s < 60) std::snprintf(buffer, sizeof(buffer), "%llds", s);
  else if (s < 3600) std::snprintf(buffer, sizeof(buffer), "%lldm%02llds", s / 60, s % 60);
  else std::snprintf(buffer, sizeof(buffer), "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  return buffer;
}

std::string ProgressBar::format_bar(int step, int total_steps, int width) {
  int clamped = std::clamp(step, 0, std::max(total_steps, 1));
  int filled = static_cast<int>(static_cast<long long>(clamped) * width / std::max(total_steps, 1));
  std::string bar = "[";  // appended, not "[" + ...: gcc 12 gives a false -Wrestrict on the latter
  return bar.append(filled, '#').append(width - filled, '.').append("]");
}

std::string ProgressBar::format_stats(int step, int total_steps, double loss, double lr, double grad_norm,
                                      double tokens_per_s, double eta_s) {
  return std::to_string(step) + "/" + std::to_string(total_steps) + " loss " + printf_string("%.4f", loss) +
         " lr " + printf_string("%.2e", lr) + " gnorm " + printf_string("%.3f", grad_norm) + " " +
         format_rate(tokens_per_s) + " tok/s ETA " + format_duration(eta_s);
}

void ProgressBar::update(int step, double loss, double lr, double grad_norm, double tokens_per_s,
                         const std::string& extra) {
  const Work work = work_ ? work_ : [](int s) { return static_cast<double>(s); };
  const double timed_work = work(step) - work(first_step_);
  const double elapsed = clock_() - start_s_;
  const double eta = timed_work > 0 ? elapsed / timed_work * std::max(work(total_steps_) - work(step), 0.0) : -1.0;
  const std::string stats =
      format_stats(step, total_steps_, loss, lr, grad_norm, tokens_per_s, eta) + (extra.empty() ? "" : " " + extra);
  if (is_terminal_) {
    bar_line_ = format_bar(step, total_steps_) + " " + stats;
    draw(bar_line_);
    if (step >= total_steps_) {
      out_ << '\n';
      bar_line_.clear();
      drawn_width_ = 0;
    }
  } else if (step % log_interval_ == 0 || step >= total_steps_) {
    out_ << "step " << stats << '\n';
  }
  out_.flush();
}

void ProgressBar::message(const std::string& text) {
  if (is_terminal_ && !bar_line_.empty()) {
    draw(text);  // overwrites the bar, blanking what is longer than the text
    out_ << '\n';
    drawn_width_ = 0;
    draw(bar_line_);
  } else {
    out_ << text << '\n';
  }
  out_.flush();
}

void ProgressBar::draw(const std::string& line) {
  out_ << '\r' << line;
  if (line.size() < drawn_width_) out_ << std::string(drawn_width_ - line.size(), ' ');
  drawn_width_ = line.size();
}

}  // namespace loom::config
