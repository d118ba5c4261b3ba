#pragma once
// "Did you mean ...?" for a misspelt section, key or name in a config.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::config {

// The closest candidate when it is plausibly a typo of `word`, else nothing: beyond about a
// third of the word's length a "suggestion" would only confuse. A truncated name ("cl100k" for
// "cl100k_base") is far in edit distance but an obvious intent, so a prefix match counts too.
std::optional<std::string> closest(std::string_view word, const std::vector<std::string>& candidates);

// "; did you mean 'closest'?", or "" when no candidate is close.
std::string suggestion(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace loom::config
