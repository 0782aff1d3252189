#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace cera::cli {
namespace {

// "1.5/3.0 MiB", or "3/8 chunks" for counts.
std::string amounts(uint64_t done, uint64_t total, const char* count_unit) {
    char b[80];
    if (count_unit)
        std::snprintf(b, sizeof b, "%llu/%llu %s", (unsigned long long)done, (unsigned long long)total, count_unit);
    else
        std::snprintf(b, sizeof b, "%.1f/%.1f MiB", double(done) / double(1 << 20), double(total) / double(1 << 20));
    return b;
}

}  // namespace

Progress::Progress(std::string label, double show_after_s, std::FILE* out, const char* count_unit)
    : label_(std::move(label)),
      show_after_s_(show_after_s),
      out_(out),
      count_unit_(count_unit),
      tty_(isatty(fileno(out)) != 0),
      start_(Clock::now()) {}

std::string Progress::bar_line(const std::string& label, uint64_t done, uint64_t total, double elapsed_s, int width,
                               const char* count_unit) {
    const double frac = total > 0 ? std::clamp(double(done) / double(total), 0.0, 1.0) : 0.0;
    const int fill = int(std::floor(frac * width));
    std::string line = label + " [";
    line.append(size_t(fill), '=');
    if (fill < width) line += '>';
    line.append(size_t(std::max(0, width - fill - 1)), ' ');
    char tail[160];
    const std::string a = amounts(done, total, count_unit);
    if (frac > 0.02 && frac < 1.0) {
        const double eta = elapsed_s * (1.0 - frac) / frac;  // at the rate so far
        std::snprintf(tail, sizeof tail, "] %3d%% %s, %.0f s left", int(frac * 100), a.c_str(), std::round(eta));
    } else {
        std::snprintf(tail, sizeof tail, "] %3d%% %s, %.1f s", int(frac * 100), a.c_str(), elapsed_s);
    }
    return line + tail;
}

void Progress::update(uint64_t done, uint64_t total) {
    if (finished_) return;
    done_ = done;
    total_ = total;
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (!shown_ && elapsed < show_after_s_) return;  // not yet worth showing (or over before it was)
    const int tenth = total > 0 ? int(std::min<uint64_t>(10, done * 10 / total)) : 0;
    if (tty_) {
        // At most ten redraws a second, and always the last one.
        if (shown_ && done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
        std::fprintf(out_, "\r%s\x1b[K", bar_line(label_, done, total, elapsed, 30, count_unit_).c_str());
        std::fflush(out_);
    } else {
        if (tenth == last_tenth_) return;
        std::fprintf(out_, "%s: %d%% (%s, %.1f s)\n", label_.c_str(), tenth * 10,
                     amounts(done, total, count_unit_).c_str(), elapsed);
        std::fflush(out_);
    }
    last_tenth_ = tenth;
    last_draw_ = now;
    shown_ = true;
    if (total > 0 && done >= total) finish();
}

void Progress::clear_line() {
    if (!tty_ || !shown_ || finished_) return;
    std::fprintf(out_, "\r\x1b[K");
    std::fflush(out_);
    last_draw_ = {};  // redraw at the next update
}

void Progress::finish() {
    if (finished_) return;
    finished_ = true;
    if (shown_ && tty_) {
        std::fputc('\n', out_);
        std::fflush(out_);
    }
}

}  // namespace cera::cli
