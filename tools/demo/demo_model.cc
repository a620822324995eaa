#include "demo/demo_model.h"

#include <fcntl.h>
#include <unistd.h>

#include "core/regular_file.h"

namespace kvtier::cli {

Status CheckDemoModelPath(const std::string& path) {
  Result<int> fd = OpenRegularFile(path, O_RDONLY);
  if (fd.ok()) {
    ::close(*fd);
    return Status::Ok();
  }
  if (fd.status().Is(StatusCode::kNotFound)) {
    return Status::InvalidArgument("model file " + path +
                                   " not found. Run scripts/fetch-model.sh to download "
                                   "SmolLM2-135M-Instruct (Q4_1), or pass --model PATH.");
  }
  return Status::InvalidArgument("--model: " + fd.status().message() +
                                 "; pass --model the path of a GGUF file");
}

Result<DemoModel> LoadDemoModel(const std::string& path) {
  DemoModel m;
  KVTIER_ASSIGN_OR_RETURN(m.file, engine::GgufFile::Open(path));
  KVTIER_ASSIGN_OR_RETURN(m.tokenizer, engine::Tokenizer::FromGguf(*m.file));
  KVTIER_ASSIGN_OR_RETURN(m.model, engine::LlamaModel::FromGguf(*m.file));
  KVTIER_ASSIGN_OR_RETURN(m.chat, engine::ChatTemplate::FromGguf(*m.file));
  return m;
}

}  // namespace kvtier::cli
