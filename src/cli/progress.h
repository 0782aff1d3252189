// Progress of long work (convert, quantize, model load) on stderr: a bar redrawn in place on a
// terminal, and on anything else a plain line at each tenth, so that logs stay readable.
//
//   Progress p("quantize");
//   for (...) p.update(done_bytes, total_bytes);
//   p.finish();
//
// With show_after_s > 0 nothing appears until the work has run that long (a model load that is over
// in a moment prints nothing).
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace cera::cli {

class Progress {
 public:
    // count_unit: the amounts are counts of these ("chunks"), not bytes (shown in MiB).
    explicit Progress(std::string label, double show_after_s = 0, std::FILE* out = stderr,
                      const char* count_unit = nullptr);
    ~Progress() { finish(); }
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;

    void update(uint64_t done, uint64_t total);  // bytes (or counts); done == total finishes
    void finish();                               // ends the bar's line (once; later updates are ignored)
    // On a terminal, erases the bar so that a line can be printed; the next update draws it again.
    void clear_line();
    bool terminal() const { return tty_; }

    // The bar as drawn at `done` of `total` after `elapsed_s` (no terminal codes).
    static std::string bar_line(const std::string& label, uint64_t done, uint64_t total, double elapsed_s, int width,
                                const char* count_unit = nullptr);

 private:
    using Clock = std::chrono::steady_clock;
    std::string label_;
    double show_after_s_;
    std::FILE* out_;
    const char* count_unit_;
    bool tty_;
    bool shown_ = false, finished_ = false;
    int last_tenth_ = -1;
    uint64_t done_ = 0, total_ = 0;
    Clock::time_point start_, last_draw_;
};

}  // namespace cera::cli
