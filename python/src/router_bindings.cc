// kvtier._kvtier's routing half: the block hasher (to key a prompt, or a block an event names,
// in the router's own namespace) and KvRouter (include/kvtier/router.h), for kvtier.router's
// HTTP proxy. Keys cross into Python as 16-byte bytes; tiers as "G1".."G4".
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/events.h"
#include "kvtier/router.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"
#include "router_bindings.h"

namespace py = pybind11;

namespace kvtier {
namespace {

BlockKey KeyFromBytes(const py::handle& h) {
  if (!py::isinstance<py::bytes>(h)) {
    throw py::type_error("a block key is 16 bytes, not " +
                         py::type::of(h).attr("__name__").cast<std::string>());
  }
  std::string s = h.cast<std::string>();
  if (s.size() != 16) {
    throw py::value_error("a block key is 16 bytes, got " + std::to_string(s.size()));
  }
  BlockKey k;
  for (int i = 0; i < 8; ++i) {
    k.hi = (k.hi << 8) | static_cast<uint8_t>(s[i]);
    k.lo = (k.lo << 8) | static_cast<uint8_t>(s[8 + i]);
  }
  return k;
}

TierId TierFromName(const std::string& name) {
  for (TierId t = 0; t < kNumTiers; ++t) {
    if (name == TierName(t)) return t;
  }
  throw py::value_error("unknown tier '" + name + "' (expected G1, G2, G3 or G4)");
}

// Raises the same way the rest of the module does (KvtierError with .code) by handing the
// Status to the caller-supplied thrower.
using Thrower = void (*)(const Status&);
Thrower g_throw = nullptr;

void Check(const Status& s) {
  if (!s.ok()) g_throw(s);
}
template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) g_throw(r.status());
  return std::move(*r);
}

py::dict CandidateDict(const RouteCandidate& c) {
  py::dict d;
  d["worker"] = c.worker;
  d["up"] = c.up;
  py::dict by_tier;
  for (TierId t = 0; t < kNumTiers; ++t) by_tier[TierName(t)] = c.blocks_by_tier[t];
  d["blocks_by_tier"] = by_tier;
  d["compute_tokens"] = c.compute_tokens;
  d["queue_s"] = c.queue_s;
  d["load_s"] = c.load_s;
  d["compute_s"] = c.compute_s;
  d["ttft_s"] = c.ttft_s;
  return d;
}

}  // namespace

void BindRouter(py::module_& mod, void (*thrower)(const Status&)) {
  g_throw = thrower;

  py::class_<BlockHasher>(mod, "BlockHasher",
                          "Chained block keys under one namespace (include/kvtier/block_key.h).")
      .def(py::init([](const std::string& model_id, uint32_t tokens_per_block,
                       const std::string& cache_salt, const std::string& adapter_id,
                       uint64_t layout_fingerprint, const std::string& algorithm) {
             HashAlgorithm alg = Take(ParseHashAlgorithm(algorithm));
             KeyNamespace ns{model_id, layout_fingerprint, cache_salt, adapter_id};
             return Take(BlockHasher::Create(ns, tokens_per_block, alg));
           }),
           py::arg("model_id"), py::arg("tokens_per_block"), py::arg("cache_salt") = "",
           py::arg("adapter_id") = "", py::arg("layout_fingerprint") = 0,
           py::arg("algorithm") = "sha256")
      .def_property_readonly("tokens_per_block", &BlockHasher::tokens_per_block)
      .def_property_readonly("root", [](const BlockHasher& h) { return KeyBytes(h.root()); })
      .def(
          "chain",
          [](const BlockHasher& h, const py::bytes& parent, const std::vector<TokenId>& tokens) {
            if (tokens.size() != h.tokens_per_block()) {
              throw py::value_error("chain needs exactly " + std::to_string(h.tokens_per_block()) +
                                    " tokens, got " + std::to_string(tokens.size()));
            }
            BlockKey p = KeyFromBytes(parent);
            return KeyBytes(h.Chain(p, tokens));
          },
          py::arg("parent"), py::arg("tokens"),
          "The key of the block holding `tokens` (exactly tokens_per_block) after `parent`.")
      .def(
          "keys",
          [](const BlockHasher& h, const std::vector<TokenId>& tokens) {
            std::vector<BlockKey> keys;
            {
              py::gil_scoped_release release;
              keys = h.KeysFor(tokens);
            }
            py::list out;
            for (const BlockKey& k : keys) out.append(KeyBytes(k));
            return out;
          },
          py::arg("tokens"), "The keys of the full blocks of a prompt, first block first.");

  py::class_<KvRouter, std::unique_ptr<KvRouter>>(
      mod, "KvRouter",
      "Prefix index over workers' KV events and the tier-aware TTFT estimate "
      "(include/kvtier/router.h).")
      .def(py::init([](uint32_t tokens_per_block, uint64_t block_bytes, double prefill_tokens_per_s,
                       std::array<double, kNumTiers> load_gbps, double queue_weight,
                       uint64_t max_blocks_per_worker_tier) {
             RouterOptions o;
             o.tokens_per_block = tokens_per_block;
             o.block_bytes = block_bytes;
             o.prefill_tokens_per_s = prefill_tokens_per_s;
             o.load_gbps = load_gbps;
             o.queue_weight = queue_weight;
             o.max_blocks_per_worker_tier = max_blocks_per_worker_tier;
             return Take(KvRouter::Create(o));
           }),
           py::arg("tokens_per_block"), py::arg("block_bytes"), py::arg("prefill_tokens_per_s"),
           py::arg("load_gbps") = std::array<double, kNumTiers>{0.0, 12.0, 2.0, 1.25},
           py::arg("queue_weight") = 1.0, py::arg("max_blocks_per_worker_tier") = 0)
      .def("add_worker", [](KvRouter& r, WorkerId w) { Check(r.AddWorker(w)); })
      .def("remove_worker", [](KvRouter& r, WorkerId w) { Check(r.RemoveWorker(w)); })
      .def("set_up", [](KvRouter& r, WorkerId w, bool up) { Check(r.SetWorkerUp(w, up)); })
      .def("set_queue", [](KvRouter& r, WorkerId w, double s) { Check(r.SetWorkerQueue(w, s)); })
      .def(
          "apply",
          [](KvRouter& r, WorkerId w, const py::list& events) {
            // Each event: (kind "stored"|"removed", 16-byte key, tier "G1".."G4").
            std::vector<KvEvent> evs;
            evs.reserve(events.size());
            for (const py::handle& item : events) {
              py::tuple t = item.cast<py::tuple>();
              if (t.size() != 3) throw py::value_error("an event is (kind, key, tier)");
              KvEvent e;
              std::string kind = t[0].cast<std::string>();
              if (kind == "stored") {
                e.kind = KvEvent::Kind::kStored;
              } else if (kind == "removed") {
                e.kind = KvEvent::Kind::kRemoved;
              } else {
                throw py::value_error("unknown event kind '" + kind +
                                      "' (expected stored or removed)");
              }
              e.key = KeyFromBytes(t[1]);
              e.tier = TierFromName(t[2].cast<std::string>());
              evs.push_back(std::move(e));
            }
            Check(r.Apply(w, evs));
          },
          py::arg("worker"), py::arg("events"))
      .def(
          "clear",
          [](KvRouter& r, WorkerId w, const std::vector<std::string>& tiers) {
            uint8_t mask = 0;
            for (const std::string& t : tiers) mask |= static_cast<uint8_t>(1u << TierFromName(t));
            Check(r.ClearWorker(w, mask));
          },
          py::arg("worker"), py::arg("tiers"))
      .def(
          "route",
          [](const KvRouter& r, const py::list& keys, uint32_t prompt_tokens) {
            std::vector<BlockKey> ks;
            ks.reserve(keys.size());
            for (const py::handle& k : keys) ks.push_back(KeyFromBytes(k));
            RouteDecision d;
            {
              py::gil_scoped_release release;
              Result<RouteDecision> res = r.Route(ks, prompt_tokens);
              if (!res.ok()) {
                py::gil_scoped_acquire acquire;
                g_throw(res.status());
              }
              d = std::move(*res);
            }
            py::dict out;
            out["worker"] = d.worker;
            py::list cands;
            for (const RouteCandidate& c : d.candidates) cands.append(CandidateDict(c));
            out["candidates"] = cands;
            return out;
          },
          py::arg("keys"), py::arg("prompt_tokens"))
      .def(
          "block_count",
          [](const KvRouter& r, WorkerId w, const std::string& tier) {
            return r.BlockCount(w, TierFromName(tier));
          },
          py::arg("worker"), py::arg("tier"));
}

}  // namespace kvtier
