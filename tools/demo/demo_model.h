// The reference engine's model, tokenizer and chat template, loaded from one GGUF file: what
// `kvtier demo` and its worker processes (`demo --workers N`) both start from.
#pragma once

#include <memory>
#include <string>

#include "engine/chat_template.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kvtier/status.h"

namespace kvtier::cli {

struct DemoModel {
  std::unique_ptr<engine::GgufFile> file;  // kept open: the model's weights may point into it
  std::unique_ptr<engine::Tokenizer> tokenizer;
  std::unique_ptr<engine::LlamaModel> model;
  engine::ChatTemplate chat;
};

// Checks, before anything starts (a model load, worker processes), that `path` can be the
// model: InvalidArgument when it does not exist (saying how to fetch it) or is not a regular
// file (a directory, a FIFO, a device: named). What is inside is LoadDemoModel's to check.
Status CheckDemoModelPath(const std::string& path);

// Opens `path` and builds all three from it. The first error of GgufFile::Open,
// Tokenizer::FromGguf, LlamaModel::FromGguf or ChatTemplate::FromGguf, unchanged.
Result<DemoModel> LoadDemoModel(const std::string& path);

}  // namespace kvtier::cli
