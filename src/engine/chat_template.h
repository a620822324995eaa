// ChatTemplate: turns a conversation into prompt text.
//
// GGUF carries the model's chat template as Jinja source (tokenizer.chat_template). kvtier does
// not interpret Jinja: it recognizes the ChatML family (templates that emit
// "<|im_start|>" ROLE "\n" CONTENT "<|im_end|>\n" per message, like SmolLM2's) and formats
// that by hand, including a default system message when the template inserts one for
// conversations that do not start with a system turn (SmolLM2's does).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/gguf.h"
#include "kvtier/status.h"

namespace kvtier::engine {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // Plain ChatML with no default system message.
  ChatTemplate() = default;

  // From tokenizer.chat_template. NotFound when the key is missing; InvalidArgument when the
  // template is not ChatML (the message says only ChatML is supported).
  static Result<ChatTemplate> FromGguf(const GgufFile& file);
  // From template source text (same rules as FromGguf).
  static Result<ChatTemplate> FromSource(const std::string& source);

  // The prompt text for `messages`; with add_generation_prompt it ends with
  // "<|im_start|>assistant\n" so the model writes the reply. The text contains the special
  // tokens' spellings: encode it with Tokenizer::Encode(text, /*parse_special=*/true).
  std::string Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  // The system message inserted when the conversation starts with another role, if any.
  const std::optional<std::string>& default_system() const { return default_system_; }

 private:
  std::optional<std::string> default_system_;
};

}  // namespace kvtier::engine
