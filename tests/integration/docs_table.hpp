// docs/data.md's tables of what a data module refuses and the line it prints
// for each, read by the tests that make each case happen (ArraysRefuse,
// CsvRefuse, ImageFolderRefuse, ImageFolderDamaged): a quote that differs
// from what the program prints, or a row no case makes happen, fails a
// test, so the docs and the program cannot drift apart (issue 32).
//
// A table is found by the "## " heading its section starts with and its
// header line, e.g. "| what | the line says |". Each row's first cell names
// it; its second cell quotes the lines (each backquoted, several separated
// by "; "), and '…' in a quote stands for what varies (a path, a count): the
// quote is split there into literal pieces that one line of the program's
// output must hold, in order.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/run_process.hpp"

namespace kiln::test {

// One row of a docs table: its first cell, and the messages its second
// quotes, each split at '…' into the literal pieces the line holds, in order.
struct DocsRow {
  std::string what;
  std::vector<std::vector<std::string>> messages;
};

inline std::string docs_cell_trimmed(const std::string& s) {
  const size_t begin = s.find_first_not_of(' ');
  return begin == std::string::npos ? "" : s.substr(begin, s.find_last_not_of(' ') - begin + 1);
}

// The table of docs/data.md under the heading that starts with `section`
// ("## `kiln_arrays`") whose header line is `header`.
inline std::vector<DocsRow> docs_table(const std::string& section,
                                       const std::string& header = "| what | the line says |") {
  const std::string ellipsis = "\xe2\x80\xa6";  // …
  std::istringstream in(read_file(source_dir() / "docs" / "data.md"));
  std::vector<DocsRow> rows;
  bool in_section = false, in_table = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) {
      if (in_table) break;
      in_section = line.rfind(section, 0) == 0;
      continue;
    }
    if (!in_table) {
      in_table = in_section && line == header;
      continue;
    }
    if (line.rfind("|", 0) != 0) break;  // the table's end
    if (line.rfind("|---", 0) == 0) continue;
    // Cells split at '|' outside backquotes.
    std::vector<std::string> cells;
    std::string cell;
    bool quoted = false;
    for (size_t i = 1; i < line.size(); ++i) {
      if (line[i] == '`') quoted = !quoted;
      if (line[i] == '|' && !quoted) {
        cells.push_back(docs_cell_trimmed(cell));
        cell.clear();
      } else {
        cell += line[i];
      }
    }
    EXPECT_EQ(cells.size(), 2u) << "docs/data.md: " << line;
    if (cells.size() != 2) continue;
    DocsRow row{cells[0], {}};
    for (size_t open = cells[1].find('`'); open != std::string::npos; open = cells[1].find('`', open)) {
      const size_t close = cells[1].find('`', open + 1);
      if (close == std::string::npos) break;
      const std::string message = cells[1].substr(open + 1, close - open - 1);
      std::vector<std::string> pieces;
      for (size_t from = 0;;) {
        const size_t at = message.find(ellipsis, from);
        pieces.push_back(message.substr(from, at == std::string::npos ? std::string::npos : at - from));
        if (at == std::string::npos) break;
        from = at + ellipsis.size();
      }
      row.messages.push_back(pieces);
      open = close + 1;
    }
    rows.push_back(row);
  }
  return rows;
}

// Whether one line of `output` holds every piece of `pieces`, in order.
inline bool has_line_with(const std::string& output, const std::vector<std::string>& pieces) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    size_t at = 0;
    bool all = true;
    for (const auto& piece : pieces) {
      const size_t found = line.find(piece, at);
      if (found == std::string::npos) {
        all = false;
        break;
      }
      at = found + piece.size();
    }
    if (all) return true;
  }
  return false;
}

// The row of `table` whose first cell is `what`; nullptr when there is none.
inline const DocsRow* docs_row(const std::vector<DocsRow>& table, const std::string& what) {
  const auto row = std::find_if(table.begin(), table.end(), [&](const DocsRow& d) { return d.what == what; });
  return row == table.end() ? nullptr : &*row;
}

// The index of the first of `row`'s messages that a line of `output` is;
// -1 when none is.
inline int quoted_message(const DocsRow& row, const std::string& output) {
  for (size_t i = 0; i < row.messages.size(); ++i)
    if (has_line_with(output, row.messages[i])) return static_cast<int>(i);
  return -1;
}

// Expects a line of `output` to be one that the row `what` of `table`
// quotes; the index of that quote, or -1 (a failure) when there is no such
// row, it quotes nothing, or no line is one it quotes.
inline int expect_docs_quote(const std::vector<DocsRow>& table, const std::string& what, const std::string& output) {
  const DocsRow* row = docs_row(table, what);
  EXPECT_NE(row, nullptr) << "docs/data.md's table has no row '" << what << "'";
  if (row == nullptr) return -1;
  EXPECT_FALSE(row->messages.empty()) << "docs/data.md's row '" << what << "' quotes no line";
  const int quote = quoted_message(*row, output);
  EXPECT_GE(quote, 0) << "no line is one docs/data.md quotes for '" << what << "':\n" << output;
  return quote;
}

// Expects every row of `table` to be among `seen` (a row's first cell, and
// the index of the quote a case printed): a row added without a case fails;
// with `every_quote`, so does a quote that no case printed.
inline void expect_every_row_seen(const std::vector<DocsRow>& table, const std::set<std::pair<std::string, int>>& seen,
                                  bool every_quote) {
  for (const auto& row : table) {
    const bool any = std::any_of(seen.begin(), seen.end(), [&](const auto& s) { return s.first == row.what; });
    EXPECT_TRUE(any) << "docs/data.md's row '" << row.what << "' has no case";
    if (!any || !every_quote) continue;
    for (size_t i = 0; i < row.messages.size(); ++i)
      EXPECT_TRUE(seen.count({row.what, static_cast<int>(i)}))
          << "docs/data.md's row '" << row.what << "': no case printed its quote " << i + 1;
  }
}

}  // namespace kiln::test
