#include "loom/config/enums.h"

#include <vector>

#include "loom/config/suggestion.h"

namespace loom::config {

std::string one_of_message(std::string_view text, std::span<const std::string_view> names) {
  const std::vector<std::string> allowed(names.begin(), names.end());
  std::string out = "must be one of ";
  for (size_t i = 0; i < allowed.size(); ++i) out.append(i ? ", " : "").append(allowed[i]);
  return out + suggestion(text, allowed);
}

std::string unknown_name_message(const std::string& key, std::string_view text,
                                 std::span<const std::string_view> names) {
  std::string out = key;
  out.append(" = '").append(text).append("' is invalid: ");
  return out + one_of_message(text, names);
}

}  // namespace loom::config
