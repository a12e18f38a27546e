#include "tools/manifest.h"

#include "tools/json.h"
#include "tools/spec_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace flashjit::cli {
namespace {

Expected<int64_t> integer(const json::Value &v, std::string_view field) {
  if (!v.is_number())
    return Status::error("'{}' must be an integer, like 128", field);
  auto i = json::integer(v);
  if (!i) {
    // Digits past int64 are read as unsigned or, past uint64, as a double.
    const bool huge = v.is_number_unsigned() || std::fabs(v.get<double>()) >= 0x1p63;
    return Status::error("'{}' must be an integer written in digits, like 128; got {}{}", field,
                         v.dump(), huge ? " (past the 64-bit range)" : "");
  }
  return *i;
}

Expected<WarmupItem> parse_item(const json::Value &item) {
  if (!item.is_object())
    return Status::error("each item must be an object like {{\"arch\": \"gfx1201\", "
                         "\"head_dim\": 128}}");
  static const std::vector<std::string_view> known = {
      "arch",     "compiler",   "batch",   "heads",     "kv_heads", "seqlen_q",  "seqlen_k",
      "head_dim", "head_dim_v", "dtype",   "layout",    "causal",   "window",    "scale",
      "lse",      "softcap",    "alibi",   "score_mod", "mask_mod", "attn_mask", "dropout",
      "sinks",    "f32_io",     "block_m", "block_n",   "waves",    "mma_m"};
  for (const auto &member : item.items())
    if (const std::string &key = member.key();
        std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (std::string_view k : known)
        list += (list.empty() ? "" : ", ") + std::string(k);
      return Status::error("unknown field '{}' (known: {})", key, list);
    }
  WarmupItem w;
  auto str = [&](const char *field, std::string &out) -> Status {
    if (auto v = item.find(field); v != item.end()) {
      if (!v->is_string())
        return Status::error("'{}' must be a string", field);
      out = v->get<std::string>();
    }
    return Status::ok();
  };
  auto num = [&](const char *field, int64_t fallback) -> Expected<int64_t> {
    auto v = item.find(field);
    return v != item.end() ? integer(*v, field) : Expected<int64_t>(fallback);
  };
  auto boolean = [&](const char *field, bool &out) -> Status {
    if (auto v = item.find(field); v != item.end()) {
      if (!v->is_boolean())
        return Status::error("'{}' must be true or false", field);
      out = v->get<bool>();
    }
    return Status::ok();
  };
  FJ_RETURN_IF_ERROR(str("arch", w.arch));
  if (w.arch.empty())
    return Status::error("'arch' is required (e.g. \"gfx1201\")");
  FJ_RETURN_IF_ERROR(str("compiler", w.compiler));

  AttentionSpec &s = w.spec;
  struct IntField {
    const char *name;
    int64_t *out;
    const int64_t *fallback; // another field, or nullptr for `value`
    int64_t value;
  };
  const IntField ints[] = {{"batch", &s.batch, nullptr, 1},
                           {"heads", &s.heads, nullptr, 1},
                           {"kv_heads", &s.kv_heads, &s.heads, 0},
                           {"seqlen_q", &s.seqlen_q, nullptr, 128},
                           {"seqlen_k", &s.seqlen_k, &s.seqlen_q, 0},
                           {"head_dim", &s.head_dim_qk, nullptr, 64},
                           {"head_dim_v", &s.head_dim_v, &s.head_dim_qk, 0}};
  for (const IntField &f : ints) {
    auto v = num(f.name, f.fallback ? *f.fallback : f.value);
    if (!v)
      return v.status();
    *f.out = *v;
  }
  std::string dtype = "bf16", layout = "bshd";
  FJ_RETURN_IF_ERROR(str("dtype", dtype));
  FJ_RETURN_IF_ERROR(str("layout", layout));
  auto dt = parse_dtype(dtype);
  if (!dt)
    return dt.status().with_context("'dtype'");
  s.dtype = *dt;
  auto lay = parse_layout(layout);
  if (!lay)
    return lay.status().with_context("'layout'");
  FJ_RETURN_IF_ERROR(boolean("causal", s.causal));
  FJ_RETURN_IF_ERROR(boolean("lse", s.lse));
  FJ_RETURN_IF_ERROR(boolean("sinks", s.sinks));
  FJ_RETURN_IF_ERROR(boolean("f32_io", s.f32_io));
  // A finite number (AttentionSpec::validate checks the ranges).
  auto real = [&](const char *field, double &out, const char *what) -> Status {
    if (auto v = item.find(field); v != item.end()) {
      if (!v->is_number() || !std::isfinite(v->get<double>()))
        return Status::error("'{}' must be {}", field, what);
      out = v->get<double>();
    }
    return Status::ok();
  };
  FJ_RETURN_IF_ERROR(real("scale", s.scale, "a finite positive number, like 0.125"));
  if (item.contains("scale") && !(s.scale > 0))
    return Status::error("'scale' must be a finite positive number, like 0.125");
  // The score modifiers and masks, with the CLI's meanings (flashjit emit --help):
  // the values a kernel takes per call (the cap, slopes, mask, dropout's seed)
  // change nothing in it, so only their kind matters here.
  FJ_RETURN_IF_ERROR(real("softcap", s.softcap, "a number >= 0, like 30 (0: off)"));
  FJ_RETURN_IF_ERROR(real("dropout", s.dropout_p, "a probability in [0, 1), like 0.1"));
  std::string alibi, attn_mask;
  FJ_RETURN_IF_ERROR(str("alibi", alibi));
  if (!alibi.empty() && alibi != "heads" && alibi != "batch-heads")
    return Status::error("'alibi' must be \"heads\" (slopes [heads]) or \"batch-heads\" "
                         "([batch, heads]), got \"{}\"",
                         alibi);
  s.alibi = alibi.empty() ? Alibi::none : alibi == "heads" ? Alibi::heads : Alibi::batch_heads;
  FJ_RETURN_IF_ERROR(str("score_mod", s.score_mod));
  FJ_RETURN_IF_ERROR(str("mask_mod", s.mask_mod));
  FJ_RETURN_IF_ERROR(str("attn_mask", attn_mask));
  if (auto v = item.find("window"); v != item.end()) {
    if (!v->is_array() || v->size() != 2)
      return Status::error("'window' must be [left, right] (-1 = unbounded)");
    auto l = integer((*v)[0], "window[0]"), r = integer((*v)[1], "window[1]");
    if (!l)
      return l.status();
    if (!r)
      return r.status();
    s.window = Window{*l, *r};
  }
  s.set_layout(*lay);
  if (!attn_mask.empty()) // its strides follow the shapes above
    FJ_RETURN_IF_ERROR(set_attn_mask(attn_mask, s).with_context("'attn_mask'"));
  FJ_RETURN_IF_ERROR(s.validate());
  for (auto [field, out] : {std::pair{"block_m", &w.block_m}, std::pair{"block_n", &w.block_n},
                            std::pair{"waves", &w.waves}, std::pair{"mma_m", &w.mma_m}})
    if (item.contains(field)) {
      auto v = num(field, 0);
      if (!v)
        return v.status();
      *out = *v;
    }
  return w;
}

/// The items of a parsed manifest (`path` names it in messages).
Expected<std::vector<WarmupItem>> manifest_items(const json::Value &root, const std::string &path) {
  if (!root.is_array())
    return Status::error("{}: the manifest must be a JSON list of kernels, e.g. [{{\"arch\": "
                         "\"gfx1201\", \"head_dim\": 128}}]",
                         path);
  std::vector<WarmupItem> items;
  for (size_t i = 0; i < root.size(); ++i) {
    auto item = parse_item(root[i]);
    if (!item)
      return item.status().with_context(fmt::format("{}: item {}", path, i));
    items.push_back(item.take());
  }
  return items;
}

} // namespace

Expected<std::vector<WarmupItem>> parse_manifest(std::string_view text, const std::string &path) {
  std::string error;
  auto root = json::parse(text, &error);
  if (!root)
    return Status::error("cannot read the manifest {}: {}", path, error);
  return manifest_items(*root, path);
}

Expected<std::vector<WarmupItem>> read_manifest(const std::string &path) {
  std::string error;
  auto root = json::parse_file(path, &error);
  if (!root)
    return Status::error("cannot read the manifest {}", error);
  return manifest_items(*root, path);
}

} // namespace flashjit::cli
