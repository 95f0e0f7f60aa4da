#include "services/ctl/text_table.h"

#include <algorithm>

namespace pipetrain {
namespace ctl {
namespace {

constexpr size_t kGap = 2;

void AppendLine(const std::vector<TextColumn>& columns,
                const std::vector<size_t>& widths,
                const std::vector<std::string>& cells, std::string* out) {
  std::string line;
  for (size_t c = 0; c < columns.size(); ++c) {
    const std::string& cell = cells[c];
    const std::string pad(widths[c] - cell.size(), ' ');
    if (c > 0) line.append(kGap, ' ');
    line += columns[c].right_aligned ? pad + cell : cell + pad;
  }
  line.erase(line.find_last_not_of(' ') + 1);
  *out += line;
  *out += '\n';
}

}  // namespace

void TextTable::AddRow(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
}

std::string TextTable::Render() const {
  std::vector<size_t> widths(columns_.size());
  std::vector<std::string> headers;
  for (size_t c = 0; c < columns_.size(); ++c) {
    widths[c] = columns_[c].header.size();
    headers.push_back(columns_[c].header);
  }
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  std::string out;
  AppendLine(columns_, widths, headers, &out);
  for (const auto& row : rows_) AppendLine(columns_, widths, row, &out);
  return out;
}

}  // namespace ctl
}  // namespace pipetrain
