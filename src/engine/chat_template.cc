#include "engine/chat_template.h"

namespace kvtier::engine {
namespace {

constexpr std::string_view kStart = "<|im_start|>";
constexpr std::string_view kEnd = "<|im_end|>";

}  // namespace

Result<ChatTemplate> ChatTemplate::FromGguf(const GgufFile& file) {
  KVTIER_ASSIGN_OR_RETURN(std::string source, file.GetString("tokenizer.chat_template"));
  return FromSource(source);
}

Result<ChatTemplate> ChatTemplate::FromSource(const std::string& source) {
  if (source.find(kStart) == std::string::npos || source.find(kEnd) == std::string::npos) {
    return Status::InvalidArgument(
        "unsupported chat template: only ChatML (<|im_start|>role\\ncontent<|im_end|>) is "
        "implemented; kvtier does not interpret Jinja");
  }
  ChatTemplate t;
  // A literal default system turn, emitted only when messages[0] is not a system message:
  // "<|im_start|>system\n" TEXT "<|im_end|>" inside a condition on the first role.
  const std::string sys_open = std::string(kStart) + "system\n";
  const size_t at = source.find(sys_open);
  if (at != std::string::npos && source.find("!= 'system'") != std::string::npos) {
    const size_t text = at + sys_open.size();
    const size_t end = source.find(kEnd, text);
    if (end != std::string::npos) t.default_system_ = source.substr(text, end - text);
  }
  return t;
}

std::string ChatTemplate::Apply(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) const {
  std::string out;
  auto turn = [&](std::string_view role, std::string_view content) {
    out.append(kStart).append(role).append("\n").append(content).append(kEnd).append("\n");
  };
  if (default_system_ && (messages.empty() || messages[0].role != "system")) {
    turn("system", *default_system_);
  }
  for (const ChatMessage& m : messages) turn(m.role, m.content);
  if (add_generation_prompt) out.append(kStart).append("assistant\n");
  return out;
}

}  // namespace kvtier::engine
