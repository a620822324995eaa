// kvtier._kvtier: the Python binding of kvtier's public API (include/kvtier/). It wraps
// BlockManager, Config, KvLayout and the block hasher one to one; the logic stays in C++.
//
// Rules kept here:
//  - The GIL is released around every call that hashes, copies, waits or does I/O (arguments
//    are converted to C++ values first, while the GIL is held).
//  - A Status that is not ok raises KvtierError (with .code, the StatusCode name), except where
//    the C++ API reports a failure as data (WaitLayer: a load failure is an expected outcome,
//    returned as a message so the connector can recompute without an exception per layer).
//  - Events are queued in C++ (bounded; overflow is counted) and drained by take_events(), so
//    no Python code ever runs on a kvtier thread.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/config.h"
#include "kvtier/connector.h"
#include "kvtier/events.h"
#include "kvtier/g1_memory.h"
#include "kvtier/layout.h"
#include "kvtier/service_lookup.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"
#include "router_bindings.h"

namespace py = pybind11;

namespace kvtier {
namespace {

// Raised for every kvtier error; `code` is the StatusCode name ("InvalidArgument", ...).
struct KvtierError {
  Status status;
};

[[noreturn]] void Throw(const Status& s) { throw KvtierError{s}; }
void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}
template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(*r);
}

// "G2,G3" -> the tier bits; "" -> every tier; "none" -> none. InvalidArgument naming `what`
// otherwise.
uint8_t ParseTierList(const std::string& list, const char* what) {
  if (list.empty()) return kAllTiers;
  if (list == "none") return 0;
  uint8_t bits = 0;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, comma - pos);
    if (name == "G2") {
      bits |= 1u << kTierG2;
    } else if (name == "G3") {
      bits |= 1u << kTierG3;
    } else if (name == "G4") {
      bits |= 1u << kTierG4;
    } else {
      Throw(Status::InvalidArgument(std::string(what) + ": '" + name +
                                    "' is not a tier; use G2, G3 and G4, comma-separated"));
    }
    pos = comma + 1;
  }
  return bits;
}

// Config values given from Python: str, bool (true/false), int.
std::string ConfigText(const py::handle& value, const std::string& name) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::int_>(value)) return py::str(value).cast<std::string>();
  if (py::isinstance<py::float_>(value)) return py::repr(value).cast<std::string>();
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  Throw(Status::InvalidArgument("config value of '" + name +
                                "' must be str, int, float or bool, not " +
                                py::type::of(value).attr("__name__").cast<std::string>()));
}

// The bounded queue between kvtier's threads (producers) and take_events() (the consumer).
class EventQueue {
 public:
  explicit EventQueue(size_t capacity) : capacity_(capacity) {}
  void Push(std::span<const KvEvent> events) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const KvEvent& e : events) {
      if (queue_.size() >= capacity_) {
        ++dropped_;
        continue;
      }
      queue_.push_back(e);
    }
  }
  std::vector<KvEvent> Drain() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<KvEvent> out(queue_.begin(), queue_.end());
    queue_.clear();
    return out;
  }
  uint64_t dropped() {
    std::lock_guard<std::mutex> lock(mu_);
    return dropped_;
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::deque<KvEvent> queue_;
  uint64_t dropped_ = 0;
};

// Runs `f` with the GIL released (its arguments were converted while the GIL was held) and
// returns what it returns.
template <typename F>
auto WithoutGil(F&& f) {
  py::gil_scoped_release release;
  return f();
}

// A Lookup's request from the Python arguments (`prompt` must outlive the spec).
RequestSpec MakeSpec(const std::string& request_id, const std::vector<TokenId>& prompt,
                     const std::string& cache_salt, const std::string& adapter_id,
                     const std::vector<py::bytes>& block_extra, const std::string& load_tiers,
                     const std::string& store_tiers) {
  RequestSpec spec{request_id, prompt, cache_salt, adapter_id, {}};
  spec.load_tiers = ParseTierList(load_tiers, "load_tiers");
  spec.store_tiers = ParseTierList(store_tiers, "store_tiers");
  spec.block_extra.reserve(block_extra.size());
  for (const py::bytes& b : block_extra) spec.block_extra.push_back(std::string(b));
  return spec;
}

// (num_tokens, (G1, G2, G3, G4 blocks)), or the error raised.
py::tuple LookupTuple(Result<LookupResult> r) {
  LookupResult lr = Take(std::move(r));
  py::tuple by_tier(kNumTiers);
  for (TierId t = 0; t < kNumTiers; ++t) by_tier[t] = lr.blocks_by_tier[t];
  return py::make_tuple(lr.num_tokens, by_tier);
}

// BlockManager plus what the binding keeps beside it (the event queue).
class PyBlockManager {
 public:
  PyBlockManager(const KvLayout& layout, const std::string& model_id, const Config& config,
                 size_t event_queue_capacity) {
    ManagerOptions o;
    o.layout = layout;
    o.model_id = model_id;
    o.config = config;
    {
      py::gil_scoped_release release;
      auto r = BlockManager::Create(o);
      if (!r.ok()) {
        py::gil_scoped_acquire acquire;
        Throw(r.status());
      }
      manager_ = std::move(*r);
    }
    if (event_queue_capacity > 0) {
      events_ = std::make_shared<EventQueue>(event_queue_capacity);
      std::weak_ptr<EventQueue> q = events_;
      manager_->SubscribeEvents([q](std::span<const KvEvent> ev) {
        if (auto queue = q.lock()) queue->Push(ev);
      });
    }
  }

  BlockManager& m() {
    if (manager_ == nullptr) Throw(Status::FailedPrecondition("the BlockManager is closed"));
    return *manager_;
  }

  void Close() {
    std::unique_ptr<BlockManager> m = std::move(manager_);
    py::gil_scoped_release release;
    m.reset();  // finishes transfers, flushes G2 to G3 when configured
  }

  std::shared_ptr<EventQueue> events_;
  std::unique_ptr<BlockManager> manager_;
};

// "G1->G2": a bytes_by_path key.
std::string PathName(const TransferPath& p) {
  return std::string(TierName(p.from)) + "->" + TierName(p.to);
}

// Every field of ManagerStats by its name (manager_stats_fields.h): a number or a bool, a
// per-tier field as {"G1": n, ..., "G4": n}, bytes_by_path as {"G1->G2": n, ...}.
py::dict StatsDict(const ManagerStats& s) {
  py::dict d;
  ForEachStatField(
      [&](const StatField& f, const auto& v) {
        using V = std::remove_cvref_t<decltype(v)>;
        if constexpr (std::is_same_v<V, StatPerTier>) {
          py::dict by_tier;
          for (TierId t = 0; t < kNumTiers; ++t) by_tier[TierName(t)] = v[t];
          d[f.name] = by_tier;
        } else if constexpr (std::is_same_v<V, StatPerPath>) {
          py::dict by_path;
          for (size_t p = 0; p < v.size(); ++p) by_path[PathName(kTransferPaths[p]).c_str()] = v[p];
          d[f.name] = by_path;
        } else {
          d[f.name] = v;
        }
      },
      s);
  return d;
}

// The table itself, for Python code that derives its lists of counters from it.
py::tuple StatsFields() {
  static const char* kShape[] = {"u64", "flag", "per_tier", "per_path"};
  static const char* kKind[] = {"counter", "gauge"};
  static const char* kVllm[] = {"own_name", "figure", "none"};
  py::list rows;
  for (const StatField& f : kManagerStatsFields) {
    py::dict row;
    row["name"] = f.name;
    row["shape"] = kShape[static_cast<int>(f.shape)];
    row["kind"] = kKind[static_cast<int>(f.kind)];
    row["vllm"] = kVllm[static_cast<int>(f.vllm)];
    row["metric"] = f.metric;
    row["label"] = f.label;
    row["help"] = f.help;
    rows.append(row);
  }
  return py::tuple(rows);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
py::bytes KeyBytes(const BlockKey& k) {
  char b[16];
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<char>(k.hi >> (56 - 8 * i));
    b[8 + i] = static_cast<char>(k.lo >> (56 - 8 * i));
  }
  return py::bytes(b, 16);
}
}  // namespace kvtier

using namespace kvtier;  // NOLINT: the module body names every kvtier type

PYBIND11_MODULE(_kvtier, mod) {
  mod.doc() = "kvtier's C++ API (see the kvtier package for the documented Python surface)";

  static py::exception<KvtierError> error_type(mod, "KvtierError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const KvtierError& e) {
      py::object type = py::reinterpret_borrow<py::object>(error_type.ptr());
      py::object err = type(e.status.ToString());
      err.attr("code") = StatusCodeName(e.status.code());
      err.attr("detail") = e.status.message();
      PyErr_SetObject(error_type.ptr(), err.ptr());
    }
  });

  mod.attr("NUM_TIERS") = static_cast<int>(kNumTiers);
  mod.attr("TIER_NAMES") = py::make_tuple("G1", "G2", "G3", "G4");
  mod.attr("NO_G1_BLOCK") = kNoG1Block;  // connector.h: a block the engine does not hold

  // ---- Config ----
  py::class_<Config>(mod, "Config")
      .def(py::init<>(), "All settings at their defaults.")
      .def(
          "load_file", [](Config& c, const std::string& path) { Check(c.LoadFile(path)); },
          py::arg("path"), "Applies a TOML file; raises KvtierError naming the file and line.")
      .def(
          "load_environment", [](Config& c) { Check(c.LoadProcessEnvironment()); },
          "Applies every KVTIER_* variable of this process's environment.")
      .def(
          "set",
          [](Config& c, const std::string& name, py::handle value) {
            Check(c.Set(name, ConfigText(value, name), ConfigSource::kOverride, "python"));
          },
          py::arg("name"), py::arg("value"),
          "Sets one field (\"g2.capacity_bytes\", \"8GiB\"); raises KvtierError naming the "
          "field, the value and what is allowed.")
      .def(
          "get",
          [](const Config& c, const std::string& name) -> std::string {
            for (const ConfigEntry& e : c.Entries()) {
              if (e.spec->name == name) return e.value;
            }
            Throw(Status::InvalidArgument("unknown config field '" + name + "'"));
          },
          py::arg("name"), "The field's normalized value as text (sizes in bytes).")
      .def(
          "is_set",
          [](const Config& c, const std::string& name) -> bool {
            for (const ConfigFieldSpec& s : Config::Schema()) {
              if (s.name == name) return c.IsSet(name);
            }
            Throw(Status::InvalidArgument("unknown config field '" + name + "'"));
          },
          py::arg("name"),
          "True when the field was set by a file, the environment or set(), False while it "
          "holds its built-in default.")
      .def(
          "entries",
          [](const Config& c) {
            py::list out;
            for (const ConfigEntry& e : c.Entries()) {
              out.append(py::make_tuple(e.spec->name, e.value, ConfigSourceName(e.source), e.origin,
                                        e.spec->doc));
            }
            return out;
          },
          "Every field as (name, value, source, origin, doc), in schema order.")
      .def("warnings", &Config::Warnings, "Settings that are valid but have no effect.")
      .def_static(
          "field_names",
          []() {
            std::vector<std::string> names;
            for (const ConfigFieldSpec& s : Config::Schema()) names.push_back(s.name);
            return names;
          },
          "Every field kvtier knows.");

  // ---- Layout ----
  py::class_<KvLayout>(mod, "Layout")
      .def(py::init([](uint32_t num_layers, uint32_t num_planes, uint32_t num_kv_heads,
                       uint32_t head_dim, uint32_t tokens_per_block, const std::string& dtype,
                       const std::string& g1_arrangement) {
             KvLayout l;
             l.num_layers = num_layers;
             l.num_planes = num_planes;
             l.num_kv_heads = num_kv_heads;
             l.head_dim = head_dim;
             l.tokens_per_block = tokens_per_block;
             l.dtype = Take(ParseDType(dtype));
             l.g1_arrangement = Take(ParseG1Arrangement(g1_arrangement));
             Check(l.Validate());
             return l;
           }),
           py::arg("num_layers"), py::arg("num_planes"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("tokens_per_block"), py::arg("dtype"),
           py::arg("g1_arrangement") = "layer-separate")
      .def_readonly("num_layers", &KvLayout::num_layers)
      .def_readonly("num_planes", &KvLayout::num_planes)
      .def_readonly("num_kv_heads", &KvLayout::num_kv_heads)
      .def_readonly("head_dim", &KvLayout::head_dim)
      .def_readonly("tokens_per_block", &KvLayout::tokens_per_block)
      .def_property_readonly("dtype", [](const KvLayout& l) { return DTypeName(l.dtype); })
      .def_property_readonly("g1_arrangement",
                             [](const KvLayout& l) { return G1ArrangementName(l.g1_arrangement); })
      .def_property_readonly("chunk_bytes", &KvLayout::ChunkBytes)
      .def_property_readonly("block_bytes", &KvLayout::BlockBytes)
      .def_property_readonly("fingerprint", &KvLayout::Fingerprint)
      .def("__repr__", &KvLayout::ToString);

  mod.def("stats_fields", &StatsFields,
          "ManagerStats's fields in order, as dicts: name, shape (u64, flag, per_tier, "
          "per_path), kind (counter, gauge), vllm (own_name, figure, none), metric (kvtier's "
          "Prometheus family, or empty), label, help. BlockManager.stats() has a key per field.");

  // ---- keys ----
  mod.def(
      "block_keys",
      [](const std::vector<TokenId>& tokens, const std::string& model_id, const KvLayout& layout,
         const std::string& cache_salt, const std::string& adapter_id,
         const std::string& algorithm) {
        HashAlgorithm alg = Take(ParseHashAlgorithm(algorithm));
        KeyNamespace ns{model_id, layout.Fingerprint(), cache_salt, adapter_id};
        BlockHasher h = Take(BlockHasher::Create(ns, layout.tokens_per_block, alg));
        std::vector<BlockKey> keys;
        {
          py::gil_scoped_release release;
          keys = h.KeysFor(tokens);
        }
        py::list out;
        for (const BlockKey& k : keys) out.append(KeyBytes(k));
        return out;
      },
      py::arg("tokens"), py::arg("model_id"), py::arg("layout"), py::arg("cache_salt") = "",
      py::arg("adapter_id") = "", py::arg("algorithm") = "sha256",
      "The 16-byte keys of the full blocks of `tokens`, as BlockManager computes them.");

  // ---- BlockManager ----
  py::class_<PyBlockManager>(mod, "BlockManager")
      .def(py::init<const KvLayout&, const std::string&, const Config&, size_t>(),
           py::arg("layout"), py::arg("model_id"), py::arg("config"),
           py::arg("event_queue_capacity") = 65536)
      .def("close", &PyBlockManager::Close)
      .def(
          "lookup",
          [](PyBlockManager& self, const std::string& request_id, std::vector<TokenId> prompt,
             uint32_t num_computed_tokens, const std::string& cache_salt,
             const std::string& adapter_id, const std::vector<py::bytes>& block_extra,
             const std::string& load_tiers, const std::string& store_tiers) {
            BlockManager& m = self.m();
            RequestSpec spec = MakeSpec(request_id, prompt, cache_salt, adapter_id, block_extra,
                                        load_tiers, store_tiers);
            return LookupTuple(WithoutGil([&] { return m.Lookup(spec, num_computed_tokens); }));
          },
          py::arg("request_id"), py::arg("prompt"), py::arg("num_computed_tokens"),
          py::arg("cache_salt") = "", py::arg("adapter_id") = "",
          py::arg("block_extra") = std::vector<py::bytes>{}, py::arg("load_tiers") = "",
          py::arg("store_tiers") = "")
      .def(
          "prepare_load",
          [](PyBlockManager& self, const std::string& request_id,
             const std::vector<uint32_t>& g1_block_ids, uint32_t num_external_tokens,
             bool async_load) {
            BlockManager& m = self.m();
            Result<uint32_t> r = WithoutGil([&] {
              return m.PrepareLoad(request_id, g1_block_ids, num_external_tokens, async_load);
            });
            return Take(std::move(r));
          },
          py::arg("request_id"), py::arg("g1_block_ids"), py::arg("num_external_tokens"),
          py::arg("async_load") = false,
          "async_load: the engine polls finished() for it; wait_layer never waits for it.")
      .def(
          "commit",
          [](PyBlockManager& self, const std::string& request_id,
             const std::vector<TokenId>& tokens, const std::vector<uint32_t>& g1_block_ids) {
            BlockManager& m = self.m();
            Check(WithoutGil([&] { return m.Commit(request_id, tokens, g1_block_ids); }));
          },
          py::arg("request_id"), py::arg("tokens"), py::arg("g1_block_ids"))
      .def(
          "request_finished",
          [](PyBlockManager& self, const std::string& request_id) {
            BlockManager& m = self.m();
            py::gil_scoped_release release;
            return m.RequestFinished(request_id);
          },
          py::arg("request_id"))
      .def(
          "register_memory",
          [](PyBlockManager& self, const KvLayout& layout, uint32_t num_blocks,
             const std::vector<std::pair<uint64_t, uint64_t>>& regions, bool on_device) {
            G1Memory g1;
            g1.layout = layout;
            g1.num_blocks = num_blocks;
            g1.on_device = on_device;
            for (const auto& [base, stride] : regions) {
              g1.regions.push_back(G1Region{reinterpret_cast<uint8_t*>(base), stride});
            }
            Check(g1.Validate());
            BlockManager& m = self.m();
            Check(WithoutGil([&] { return m.RegisterDeviceMemory(g1); }));
          },
          py::arg("layout"), py::arg("num_blocks"), py::arg("regions"), py::arg("on_device"))
      .def(
          "start_load",
          [](PyBlockManager& self, std::optional<uintptr_t> engine_stream) {
            BlockManager& m = self.m();
            Check(WithoutGil(
                [&] { return engine_stream ? m.StartLoad(*engine_stream) : m.StartLoad(); }));
          },
          py::arg("engine_stream") = py::none(),
          "engine_stream: for a device G1, the engine's CUDA stream as an int "
          "(torch.cuda.current_stream().cuda_stream; 0 is the legacy default stream): the loads "
          "write G1 only after the work queued on it so far. None: no ordering (host G1).")
      .def(
          "wait_layer",
          [](PyBlockManager& self, uint32_t layer) -> std::optional<std::string> {
            BlockManager& m = self.m();
            const Status s = WithoutGil([&] { return m.WaitLayer(layer); });
            if (s.Is(StatusCode::kInvalidArgument)) Throw(s);
            if (s.ok()) return std::nullopt;
            return s.ToString();
          },
          py::arg("layer"))
      .def(
          "loaded_tokens",
          [](PyBlockManager& self, const std::string& request_id) {
            BlockManager& m = self.m();
            py::gil_scoped_release release;
            return m.LoadedTokens(request_id);
          },
          py::arg("request_id"))
      .def(
          "start_save",
          [](PyBlockManager& self, std::optional<uintptr_t> engine_stream) {
            BlockManager& m = self.m();
            Check(WithoutGil(
                [&] { return engine_stream ? m.StartSave(*engine_stream) : m.StartSave(); }));
          },
          py::arg("engine_stream") = py::none(),
          "engine_stream: for a device G1, the engine's CUDA stream as an int "
          "(torch.cuda.current_stream().cuda_stream; 0 is the legacy default stream): the saves "
          "read G1 only after the work queued on it so far. None: no ordering (host G1, or an "
          "engine that synchronized).")
      .def("wait_for_saves",
           [](PyBlockManager& self) {
             BlockManager& m = self.m();
             py::gil_scoped_release release;
             m.WaitForSaves();
           })
      .def(
          "wait_for_request_saves",
          [](PyBlockManager& self, const std::string& request_id) {
            BlockManager& m = self.m();
            py::gil_scoped_release release;
            m.WaitForRequestSaves(request_id);
          },
          py::arg("request_id"),
          "Before the engine reuses the request's G1 blocks (preemption): drops its saves that "
          "have not started and waits until none of its saves reads G1; other requests' saves "
          "are not waited for.")
      .def("finished",
           [](PyBlockManager& self) {
             BlockManager& m = self.m();
             FinishedRequests f = WithoutGil([&] { return m.Finished(); });
             return py::make_tuple(f.saves_done, f.loads_done);
           })
      .def("stats",
           [](PyBlockManager& self) {
             BlockManager& m = self.m();
             ManagerStats s;
             {
               py::gil_scoped_release release;
               s = m.Stats();
             }
             py::dict d = StatsDict(s);
             d["events_dropped"] = self.events_ ? self.events_->dropped() : 0;
             return d;
           })
      // details=False: (kind, key, parent, tier, time_ns) tuples, as before. details=True: a
      // dict per event with those names plus what the wire carries (docs/events.md):
      // token_ids, block_size, parent_is_root, lora_name, cache_salt, namespace_known.
      .def(
          "take_events",
          [](PyBlockManager& self, bool details) {
            py::list out;
            if (!self.events_) return out;
            for (const KvEvent& e : self.events_->Drain()) {
              if (!details) {
                out.append(py::make_tuple(KvEventKindName(e.kind), KeyBytes(e.key),
                                          KeyBytes(e.parent), TierName(e.tier), e.time_ns));
                continue;
              }
              py::dict d;
              d["kind"] = KvEventKindName(e.kind);
              d["key"] = KeyBytes(e.key);
              d["parent"] = KeyBytes(e.parent);
              d["tier"] = TierName(e.tier);
              d["time_ns"] = e.time_ns;
              d["token_ids"] = py::list(py::cast(e.token_ids));
              d["block_size"] = e.block_size;
              d["parent_is_root"] = e.parent_is_root;
              d["lora_name"] = e.lora_name;
              d["cache_salt"] = e.cache_salt;
              d["namespace_known"] = e.namespace_known;
              out.append(std::move(d));
            }
            return out;
          },
          py::arg("details") = false)
      .def_property_readonly("layout", [](PyBlockManager& self) { return self.m().layout(); });

  // ---- ServiceLookup: a scheduler's lookups straight to kvtier serve ----
  py::class_<ServiceLookup>(mod, "ServiceLookup")
      .def(py::init([](const Config& config, const std::string& instance_name) {
             return Take(WithoutGil([&] { return ServiceLookup::Create(config, instance_name); }));
           }),
           py::arg("config"), py::arg("instance_name"))
      .def(
          "lookup",
          [](ServiceLookup& self, const std::string& request_id, std::vector<TokenId> prompt,
             uint32_t num_computed_tokens, const std::string& cache_salt,
             const std::string& adapter_id, const std::vector<py::bytes>& block_extra,
             const std::string& load_tiers, const std::string& store_tiers) {
            RequestSpec spec = MakeSpec(request_id, prompt, cache_salt, adapter_id, block_extra,
                                        load_tiers, store_tiers);
            return LookupTuple(WithoutGil([&] { return self.Lookup(spec, num_computed_tokens); }));
          },
          py::arg("request_id"), py::arg("prompt"), py::arg("num_computed_tokens"),
          py::arg("cache_salt") = "", py::arg("adapter_id") = "",
          py::arg("block_extra") = std::vector<py::bytes>{}, py::arg("load_tiers") = "",
          py::arg("store_tiers") = "")
      .def("stats", [](ServiceLookup& self) {
        ServiceLookup::Stats s = self.stats();
        py::dict d;
        d["connected"] = s.connected;
        d["connects"] = s.connects;
        d["failed_calls"] = s.failed_calls;
        d["lookups"] = s.lookups;
        return d;
      });

  // ---- routing: BlockHasher, KvRouter (router_bindings.cc) ----
  BindRouter(mod, &Throw);
}
