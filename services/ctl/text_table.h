// A plain-text table with aligned columns, as pipetrainctl prints them:
//
//   ID     STATE    STEP       LOSS
//   job-1  RUNNING  1200/1875  0.4123
//
// Columns are separated by two spaces; numeric columns may be right-aligned.
// Trailing spaces are trimmed. Not thread-safe; a value type.
#ifndef PIPETRAIN_SERVICES_CTL_TEXT_TABLE_H_
#define PIPETRAIN_SERVICES_CTL_TEXT_TABLE_H_

#include <string>
#include <vector>

namespace pipetrain {
namespace ctl {

struct TextColumn {
  std::string header;
  bool right_aligned = false;
};

class TextTable {
 public:
  explicit TextTable(std::vector<TextColumn> columns)
      : columns_(std::move(columns)) {}

  // Missing cells print empty; extra cells are ignored.
  void AddRow(std::vector<std::string> cells);
  size_t num_rows() const { return rows_.size(); }

  // The header and every row, each ending in '\n'.
  std::string Render() const;

 private:
  std::vector<TextColumn> columns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace ctl
}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_CTL_TEXT_TABLE_H_
