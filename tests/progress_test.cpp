// progress_test — the one progress renderer (util/progress.h), drawn through its sink seam onto a
// small terminal emulator and a log, at 40, 80 and 200 columns, with a clock the test moves:
// lines that never wrap, redraws in place with no stale line, one ETA, plain lines off a terminal
// with one closing line, an observer that only rises; and its users: a load (model/weights.h)
// advances by bytes inside a layer, k3_repack (tools/repack_lib.h) shows one figure over the whole
// run that moves inside a shard.
#include "util/progress.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "repack_lib.h"
#include "synth_lib.h"
#include "test_util.h"

namespace k3 {
namespace {

// Decodes UTF-8 (the test's own decoder, not the renderer's display_width) into characters.
std::vector<std::pair<std::string, char32_t>> characters(std::string_view s) {
  std::vector<std::pair<std::string, char32_t>> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    char32_t c = n == 1 ? b : n == 2 ? b & 0x1F : n == 3 ? b & 0x0F : b & 0x07;
    for (size_t k = 1; k < n && i + k < s.size(); ++k)
      c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.emplace_back(std::string(s.substr(i, n)), c);
    i += n;
  }
  return out;
}

// Columns of one character: the CJK and fullwidth ranges 2, everything else this test draws 1.
int columns_of(char32_t c) {
  return (c >= 0x1100 && c <= 0x115F) || (c >= 0x2E80 && c <= 0xA4CF) ||
                 (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0xF900 && c <= 0xFAFF) ||
                 (c >= 0xFF00 && c <= 0xFF60)
             ? 2
             : 1;
}

// A terminal of `width` columns as xterm behaves: "\r" to column 0, "\n" to a new line,
// "\x1b[K" clears from the cursor to the end of the line, and a character written past the last
// column wraps onto a new line (so a line too long for the terminal shows as two).
struct Terminal {
  int width;
  std::vector<std::vector<std::string>> rows{{}};  // cells; a wide character's second cell is ""
  int col = 0;

  void feed(std::string_view text) {
    const auto chars = characters(text);
    for (size_t i = 0; i < chars.size(); ++i) {
      const char32_t c = chars[i].second;
      std::vector<std::string>& row = rows.back();
      if (c == '\r') {
        col = 0;
      } else if (c == '\n') {
        rows.emplace_back();
        col = 0;
      } else if (c == 0x1b) {
        ASSERT_TRUE(i + 2 < chars.size() && chars[i + 1].second == '[' &&
                    chars[i + 2].second == 'K')
            << "only the clear-to-end-of-line sequence is expected";
        if (static_cast<int>(row.size()) > col) row.resize(static_cast<size_t>(col));
        i += 2;
      } else {
        const int w = columns_of(c);
        if (col + w > width) {  // wraps
          rows.emplace_back();
          col = 0;
        }
        std::vector<std::string>& r = rows.back();
        if (static_cast<int>(r.size()) < col + w) r.resize(static_cast<size_t>(col + w), " ");
        r[static_cast<size_t>(col)] = chars[i].first;
        if (w == 2) r[static_cast<size_t>(col + 1)] = "";
        col += w;
      }
    }
  }
  // The screen's lines, trailing blanks removed, the empty line after a final "\n" dropped.
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    for (const auto& row : rows) {
      std::string line;
      for (const auto& cell : row) line += cell;
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out.push_back(line);
    }
    if (!out.empty() && out.back().empty()) out.pop_back();
    return out;
  }
};

// Columns of a rendered piece of output, escape sequences and control characters excluded.
size_t visible_columns(std::string_view text) {
  size_t cols = 0;
  const auto chars = characters(text);
  for (size_t i = 0; i < chars.size(); ++i) {
    const char32_t c = chars[i].second;
    if (c == 0x1b) {
      i += 2;
    } else if (c >= 0x20) {
      cols += static_cast<size_t>(columns_of(c));
    }
  }
  return cols;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// A sink that keeps every write (and feeds a terminal when there is one), with a clock the test
// moves by hand.
struct Output {
  std::vector<std::string> writes;
  Terminal terminal{80};
  double now = 1000.0;
  ProgressSink sink(bool tty, int width) {
    terminal.width = width;
    ProgressSink s;
    s.write = [this](std::string_view text) {
      writes.emplace_back(text);
      terminal.feed(text);
    };
    s.tty = tty;
    s.columns = [width] { return width; };
    s.clock = [this] { return now; };
    return s;
  }
};

const std::vector<std::string> kLabels = {
    "repack model-00003-of-000064 [3/64]",
    "loading /models/moonshotai/Kimi-K3-Instruct-repacked-int4-aligned-striped/main",
    "loading /模型/キミ/大きいモデルのディレクトリ",  // wide characters: 2 columns each
    "x",
};

// Every redraw at every width stays inside the terminal, with at most one ETA: the screen ends
// with exactly the closing line, nothing wrapped, no stale line.
TEST(Progress, TerminalLinesFitTheWidthAndNeverWrap) {
  for (const int width : {10, 40, 80, 200}) {
    for (const std::string& label : kLabels) {
      SCOPED_TRACE("width " + std::to_string(width) + ", label \"" + label + "\"");
      Output out;
      {
        Progress p(label, 7'400'000'000, out.sink(true, width));
        for (int i = 0; i < 50; ++i) {
          out.now += 0.7;
          p.advance(148'000'000);
        }
        p.finish();
      }
      ASSERT_GT(out.writes.size(), 40u);
      for (const std::string& w : out.writes) {
        EXPECT_LT(visible_columns(w), static_cast<size_t>(width)) << "\"" << w << "\"";
        EXPECT_LE(count(w, "ETA"), 1u) << "\"" << w << "\"";
      }
      const std::vector<std::string> screen = out.terminal.lines();
      ASSERT_EQ(screen.size(), 1u) << "wrapped or stale lines:\n" << screen.front();
      EXPECT_NE(screen[0].find("100.0%"), std::string::npos) << screen[0];
      // Something useful survives at each width: the percentage always, the whole label, the
      // bar and the ETA when there is room.
      const std::string mid = out.writes[out.writes.size() / 2];
      EXPECT_NE(mid.find('%'), std::string::npos) << mid;
      if (width == 200) {
        EXPECT_NE(mid.find(label), std::string::npos) << mid;
        EXPECT_NE(mid.find("\u2588"), std::string::npos) << mid;
        EXPECT_NE(mid.find("ETA"), std::string::npos) << mid;
        EXPECT_NE(mid.find("B/s"), std::string::npos) << mid;
      }
      if (width == 80) {
        EXPECT_NE(mid.find("ETA"), std::string::npos) << mid;
      }
    }
  }
}

// Each redraw is one line: "\r", the line, clear to its end, no newline but the closing one.
// Lines printed while the bar is shown land above it.
TEST(Progress, RedrawsInPlaceAndPrintsAboveTheBar) {
  Output out;
  {
    Progress p("writing", 1000, out.sink(true, 60));
    for (int i = 1; i <= 10; ++i) {
      out.now += 0.5;
      p.advance(100);
      if (i == 3 || i == 7)
        p.print_above([&] {
          const std::string line = "shard " + std::to_string(i) + " written\n";
          out.writes.push_back(line);
          out.terminal.feed(line);
        });
    }
    p.finish();
  }
  for (size_t i = 0; i + 1 < out.writes.size(); ++i) {
    const std::string& w = out.writes[i];
    if (w.starts_with("shard ")) continue;
    EXPECT_TRUE(w.starts_with("\r")) << "\"" << w << "\"";
    EXPECT_NE(w.find("\x1b[K"), std::string::npos) << "\"" << w << "\"";
    EXPECT_EQ(count(w, "\n"), 0u) << "\"" << w << "\"";
  }
  EXPECT_TRUE(out.writes.back().starts_with("\r"));
  EXPECT_TRUE(out.writes.back().ends_with("\x1b[K\n"));
  const std::vector<std::string> screen = out.terminal.lines();
  ASSERT_EQ(screen.size(), 3u);
  EXPECT_EQ(screen[0], "shard 3 written");
  EXPECT_EQ(screen[1], "shard 7 written");
  EXPECT_TRUE(screen[2].starts_with("writing [")) << screen[2];
  EXPECT_NE(screen[2].find("100.0%"), std::string::npos) << screen[2];
}

// Off a terminal: a plain line every kLogEvery seconds, none at 100% (the closing line's), then
// one closing line; a run shorter than the interval writes nothing (its program's summary says
// it).
TEST(Progress, OffTerminalPlainLinesAtTheIntervalAndOneClosingLine) {
  Output out;
  {
    Progress p("loading /m", 1000, out.sink(false, 80));
    for (int i = 1; i <= 20; ++i) {
      out.now += 1.0;
      p.advance(50);  // 100% at t = 20, a multiple of the interval
    }
    p.finish();
  }
  ASSERT_EQ(out.writes.size(), 4u) << "lines at 5, 10 and 15 s, then the closing line";
  for (const std::string& w : out.writes) {
    EXPECT_TRUE(w.ends_with("\n")) << w;
    EXPECT_EQ(count(w, "\n"), 1u) << w;
    EXPECT_EQ(w.find('\r'), std::string::npos) << w;
    EXPECT_EQ(w.find('\x1b'), std::string::npos) << w;
    EXPECT_TRUE(w.starts_with("loading /m: ")) << w;
    EXPECT_LE(count(w, "ETA"), 1u) << w;
  }
  EXPECT_NE(out.writes[0].find("25.0%"), std::string::npos) << out.writes[0];
  EXPECT_NE(out.writes[2].find("75.0%"), std::string::npos) << out.writes[2];
  EXPECT_NE(out.writes[0].find("ETA 15s"), std::string::npos) << out.writes[0];
  std::string all;
  for (const std::string& w : out.writes) all += w;
  EXPECT_EQ(count(all, "100.0%"), 1u) << all;
  EXPECT_NE(out.writes.back().find("done"), std::string::npos) << out.writes.back();

  Output quick;
  {
    Progress p("loading /m", 1000, quick.sink(false, 80));
    quick.now += 1.0;
    p.advance(1000);
    p.finish();
  }
  EXPECT_EQ(quick.writes.size(), 0u);
}

// The observer (a server's /health) only ever rises, reaches 1 exactly once, even with many
// threads advancing at once and advances of zero bytes.
TEST(Progress, ObserverRisesAndReachesOneOnce) {
  std::mutex mutex;
  std::vector<double> seen;
  Output out;
  {
    Progress p("loading", 4 * 20000, out.sink(false, 80), [&](double f) {
      std::lock_guard<std::mutex> lock(mutex);
      seen.push_back(f);
    });
    p.advance(0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&p] {
        for (int i = 0; i < 20000; ++i) p.advance(i % 2);
        for (int i = 0; i < 10000; ++i) p.advance(1);
      });
    for (auto& t : threads) t.join();
    p.finish();
  }
  ASSERT_FALSE(seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) ASSERT_LT(seen[i - 1], seen[i]) << "at report " << i;
  EXPECT_EQ(seen.back(), 1.0);

  // A plan that counted more than was done: 1 comes from finish(), once.
  seen.clear();
  {
    Progress p("loading", 1000, out.sink(false, 80), [&](double f) { seen.push_back(f); });
    p.advance(600);
    p.finish();
    p.finish();
  }
  EXPECT_EQ(seen, (std::vector<double>{0.6, 1.0}));
  // Abandoned (an error unwinding): never 1.
  seen.clear();
  {
    Progress p("loading", 1000, out.sink(false, 80), [&](double f) { seen.push_back(f); });
    p.advance(600);
  }
  EXPECT_EQ(seen, (std::vector<double>{0.6}));
}

// A one-layer slice of the tiny checkpoint: the load's fraction moves tensor by tensor inside the
// layer (it used to move once per layer: 0.5, then 1), rises, and ends at 1.
TEST(Progress, LoadAdvancesByBytesWithinALayer) {
  std::vector<double> seen;
  EngineOptions o;
  o.model_dir = k3::testing::kTinyDir;
  o.load.layers = 1;
  o.on_progress = [&](double f) { seen.push_back(f); };
  Result<std::unique_ptr<Engine>> engine = Engine::load(o);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  ASSERT_FALSE(seen.empty());
  size_t inside = 0;
  for (size_t i = 0; i < seen.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(seen[i - 1], seen[i]) << "at report " << i;
    }
    if (seen[i] > 0 && seen[i] < 1) ++inside;
  }
  EXPECT_EQ(seen.back(), 1.0);
  EXPECT_GE(inside, 10u) << "reports before the end: " << inside;
  EXPECT_LT(seen.front(), 0.25);
}

// k3_repack over a checkpoint of several shards, drawn on a 120-column terminal: one figure over
// the whole run, named after the shard being written, that moves while a shard is written, one
// ETA; the screen ends with the per-shard lines and one closing line (nothing wrapped or stale).
TEST(Progress, RepackShowsOneOverallFigureThatMovesInsideAShard) {
  testing::TempDir source("progress-repack-src"), dest("progress-repack-dst");
  synth::SynthSpec spec = synth::preset_spec("tiny");
  spec.progress = false;
  synth::write_checkpoint(spec, source.path());

  Output out;
  repack::Options o;
  o.source = source.path();
  o.dest = dest.path();
  o.bits = 4;
  o.progress = out.sink(true, 120);
  o.progress.clock = [&out] { return out.now += 0.05; };  // time passes as bytes are written
  size_t logged = 0;
  const repack::Summary s = repack::run(o, [&](const std::string& line) {
    out.terminal.feed(line + "\n");
    ++logged;
  });
  ASSERT_GE(s.shards_written, 3);

  static const std::regex figure(R"(\[(\d+)/(\d+)\].*?(\d+\.\d)%)");
  std::map<int, std::vector<double>> by_shard;  // shard index in the run -> percentages shown
  for (const std::string& w : out.writes) {
    EXPECT_LT(visible_columns(w), 120u) << w;
    EXPECT_LE(count(w, "ETA"), 1u) << w;
    EXPECT_EQ(w.find("overall"), std::string::npos) << w;
    std::smatch m;
    if (std::regex_search(w, m, figure)) by_shard[std::stoi(m[1])].push_back(std::stod(m[3]));
  }
  ASSERT_GE(by_shard.size(), 3u);
  double previous = -1;
  size_t shards_moving = 0;
  for (const auto& [shard, percents] : by_shard) {
    EXPECT_GE(percents.front(), previous) << "shard " << shard << " starts below the last one";
    std::set<double> distinct(percents.begin(), percents.end());
    if (distinct.size() >= 2 && shard < static_cast<int>(by_shard.size())) ++shards_moving;
    for (size_t i = 1; i < percents.size(); ++i) EXPECT_LE(percents[i - 1], percents[i]);
    previous = percents.back();
  }
  EXPECT_GE(shards_moving, 2u) << "the figure must move while a shard is written";
  // The first shard holds a fraction of the run's bytes: its figure never reads 100.
  EXPECT_LT(by_shard.begin()->second.back(), 90.0);

  const std::vector<std::string> screen = out.terminal.lines();
  ASSERT_EQ(screen.size(), logged + 1);
  EXPECT_NE(screen.back().find("100.0%"), std::string::npos) << screen.back();
  for (size_t i = 0; i + 1 < screen.size(); ++i)
    EXPECT_NE(screen[i].find(": wrote "), std::string::npos) << screen[i];
}

TEST(Progress, DisplayWidthCountsColumns) {
  EXPECT_EQ(display_width("abc"), 3u);
  EXPECT_EQ(display_width("\u2588\u258C"), 2u);
  EXPECT_EQ(display_width("キミ"), 4u);
  EXPECT_EQ(display_width("e\u0301"), 1u);
  EXPECT_EQ(display_width("\xff"), 1u);
}

}  // namespace
}  // namespace k3
