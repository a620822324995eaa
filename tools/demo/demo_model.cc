#include "demo/demo_model.h"

namespace kvtier::cli {

Result<DemoModel> LoadDemoModel(const std::string& path) {
  DemoModel m;
  KVTIER_ASSIGN_OR_RETURN(m.file, engine::GgufFile::Open(path));
  KVTIER_ASSIGN_OR_RETURN(m.tokenizer, engine::Tokenizer::FromGguf(*m.file));
  KVTIER_ASSIGN_OR_RETURN(m.model, engine::LlamaModel::FromGguf(*m.file));
  KVTIER_ASSIGN_OR_RETURN(m.chat, engine::ChatTemplate::FromGguf(*m.file));
  return m;
}

}  // namespace kvtier::cli
