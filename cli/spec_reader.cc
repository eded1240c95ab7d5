#include "cli/spec_reader.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace depthbench::cli {
namespace {

using nlohmann::json;
namespace v1 = ::depthbench::v1;

absl::Status Err(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

std::string Kind(const json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "a list";
  return "a mapping";
}

absl::StatusOr<int64_t> Int(const json& j, const std::string& path) {
  if (j.is_number_unsigned() &&
      j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Err(path, absl::StrCat(j.get<uint64_t>(), " is out of the 64-bit integer range"));
  }
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number_float()) {
    double d = j.get<double>();
    if (std::floor(d) == d && std::abs(d) < 9e15) return static_cast<int64_t>(d);
  }
  return Err(path, absl::StrCat("expected an integer, got ", Kind(j), " ", j.dump()));
}

// For the proto's int32 fields: out-of-range values are errors, not wraps.
absl::StatusOr<int32_t> Int32(const json& j, const std::string& path) {
  ASSIGN_OR_RETURN(int64_t v, Int(j, path));
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    return Err(path, absl::StrCat("must fit in 32 bits, got ", v));
  }
  return static_cast<int32_t>(v);
}

absl::StatusOr<double> Double(const json& j, const std::string& path) {
  if (j.is_number_float() && !std::isfinite(j.get<double>())) {
    return Err(path, "must be a finite number (out of range or infinite)");
  }
  if (j.is_number()) return j.get<double>();
  return Err(path, absl::StrCat("expected a number, got ", Kind(j), " ", j.dump()));
}

absl::StatusOr<bool> Bool(const json& j, const std::string& path) {
  if (j.is_boolean()) return j.get<bool>();
  return Err(path, absl::StrCat("expected true or false, got ", Kind(j), " ", j.dump()));
}

absl::StatusOr<std::string> String(const json& j, const std::string& path) {
  if (j.is_string()) return j.get<std::string>();
  return Err(path, absl::StrCat("expected a string, got ", Kind(j), " ", j.dump()));
}

absl::Status Object(const json& j, const std::string& path) {
  if (!j.is_object()) return Err(path, absl::StrCat("expected a mapping, got ", Kind(j)));
  return absl::OkStatus();
}

absl::Status List(const json& j, const std::string& path) {
  if (!j.is_array()) return Err(path, absl::StrCat("expected a list, got ", Kind(j)));
  return absl::OkStatus();
}

using Handler = std::function<absl::Status(const json&, const std::string&)>;

// Dispatches each key of `obj` to its handler; unknown keys are errors.
absl::Status Fields(const json& obj, const std::string& path,
                    const std::map<std::string, Handler>& handlers) {
  RETURN_IF_ERROR(Object(obj, path));
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    auto h = handlers.find(it.key());
    std::string field = absl::StrCat(path, ".", it.key());
    if (h == handlers.end()) {
      std::string known;
      for (const auto& [k, _] : handlers) known += (known.empty() ? "" : ", ") + k;
      return Err(field, absl::StrCat("unknown field (valid: ", known, ")"));
    }
    RETURN_IF_ERROR(h->second(it.value(), field));
  }
  return absl::OkStatus();
}

template <typename Setter>
Handler IntField(Setter set) {
  return [set](const json& j, const std::string& p) -> absl::Status {
    ASSIGN_OR_RETURN(int64_t v, Int(j, p));
    set(v);
    return absl::OkStatus();
  };
}
template <typename Setter>
Handler Int32Field(Setter set) {
  return [set](const json& j, const std::string& p) -> absl::Status {
    ASSIGN_OR_RETURN(int32_t v, Int32(j, p));
    set(v);
    return absl::OkStatus();
  };
}
template <typename Setter>
Handler DoubleField(Setter set) {
  return [set](const json& j, const std::string& p) -> absl::Status {
    ASSIGN_OR_RETURN(double v, Double(j, p));
    set(v);
    return absl::OkStatus();
  };
}
template <typename Setter>
Handler BoolField(Setter set) {
  return [set](const json& j, const std::string& p) -> absl::Status {
    ASSIGN_OR_RETURN(bool v, Bool(j, p));
    set(v);
    return absl::OkStatus();
  };
}
template <typename Setter>
Handler StringField(Setter set) {
  return [set](const json& j, const std::string& p) -> absl::Status {
    ASSIGN_OR_RETURN(std::string v, String(j, p));
    set(v);
    return absl::OkStatus();
  };
}

absl::Status StringMap(const json& j, const std::string& path,
                       google::protobuf::Map<std::string, std::string>* out) {
  RETURN_IF_ERROR(Object(j, path));
  for (auto it = j.begin(); it != j.end(); ++it) {
    ASSIGN_OR_RETURN(std::string v, String(it.value(), absl::StrCat(path, ".", it.key())));
    (*out)[it.key()] = v;
  }
  return absl::OkStatus();
}

absl::Status Shapes(const json& j, const std::string& path, v1::ShapeSpec* s) {
  if (j.is_object() && j.contains("explicit") && j.contains("explicit_shapes")) {
    return Err(path + ".explicit_shapes", "give either explicit or explicit_shapes, not both");
  }
  Handler explicit_shapes = [s](const json& j, const std::string& p) -> absl::Status {
    RETURN_IF_ERROR(List(j, p));
    for (size_t i = 0; i < j.size(); ++i) {
      auto* e = s->add_explicit_shapes();
      std::string ip = absl::StrCat(p, "[", i, "]");
      if (j[i].is_string()) {  // "LxD"
        std::string text = j[i].get<std::string>();
        size_t x = text.find('x');
        int64_t l = 0, d = 0;
        if (x == std::string::npos || !absl::SimpleAtoi(text.substr(0, x), &l) ||
            !absl::SimpleAtoi(text.substr(x + 1), &d)) {
          return Err(ip, absl::StrCat("expected LxD such as 4x96 or {layers, d_model}, got \"", text, "\""));
        }
        e->set_layers(l);
        e->set_d_model(d);
        continue;
      }
      RETURN_IF_ERROR(Fields(j[i], ip, {
          {"layers", IntField([e](int64_t x) { e->set_layers(x); })},
          {"d_model", IntField([e](int64_t x) { e->set_d_model(x); })},
          {"vocab", IntField([e](int64_t x) { e->set_vocab(x); })},
          {"heads", IntField([e](int64_t x) { e->set_heads(x); })},
          {"kv_heads", IntField([e](int64_t x) { e->set_kv_heads(x); })},
      }));
    }
    return absl::OkStatus();
  };
  return Fields(j, path, {
      {"suite", StringField([s](const std::string& v) { s->set_suite(v); })},
      {"solver", [s](const json& j, const std::string& p) {
         auto* v = s->mutable_solver();
         return Fields(j, p, {
             {"ref", [v](const json& j, const std::string& p) -> absl::Status {
                // "24x1024" shorthand for ref_layers/ref_d_model.
                ASSIGN_OR_RETURN(std::string text, String(j, p));
                size_t x = text.find('x');
                int64_t l = 0, d = 0;
                if (x == std::string::npos || !absl::SimpleAtoi(text.substr(0, x), &l) ||
                    !absl::SimpleAtoi(text.substr(x + 1), &d)) {
                  return Err(p, absl::StrCat("expected LxD such as 24x1024, got \"", text, "\""));
                }
                v->set_ref_layers(l);
                v->set_ref_d_model(d);
                return absl::OkStatus();
              }},
             {"ref_layers", IntField([v](int64_t x) { v->set_ref_layers(x); })},
             {"ref_d_model", IntField([v](int64_t x) { v->set_ref_d_model(x); })},
             {"layers", [v](const json& j, const std::string& p) -> absl::Status {
                RETURN_IF_ERROR(List(j, p));
                for (size_t i = 0; i < j.size(); ++i) {
                  ASSIGN_OR_RETURN(int64_t l, Int(j[i], absl::StrCat(p, "[", i, "]")));
                  v->add_layers(l);
                }
                return absl::OkStatus();
              }},
             {"match", StringField([v](const std::string& x) { v->set_match(x); })},
             {"vocab", IntField([v](int64_t x) { v->set_vocab(x); })},
             {"heads", IntField([v](int64_t x) { v->set_heads(x); })},
             {"kv_heads", IntField([v](int64_t x) { v->set_kv_heads(x); })},
         });
       }},
      // `explicit_shapes` is the proto's name (the one scheduler errors use).
      {"explicit", explicit_shapes},
      {"explicit_shapes", explicit_shapes},
  });
}

absl::Status Training(const json& j, const std::string& path, v1::TrainingSettings* t) {
  return Fields(j, path, {
      {"data", StringField([t](const std::string& v) { t->set_data(v); })},
      {"seq_len", IntField([t](int64_t v) { t->set_seq_len(v); })},
      {"batch", IntField([t](int64_t v) { t->set_batch(v); })},
      {"tokens_per_param", DoubleField([t](double v) { t->set_tokens_per_param(v); })},
      {"steps", IntField([t](int64_t v) { t->set_steps(v); })},
      {"tokens", IntField([t](int64_t v) { t->set_tokens(v); })},
      {"eval_interval", IntField([t](int64_t v) { t->set_eval_interval(v); })},
      {"eval_batches", IntField([t](int64_t v) { t->set_eval_batches(v); })},
      {"checkpoint_interval", IntField([t](int64_t v) { t->set_checkpoint_interval(v); })},
      {"checkpoint_minutes", DoubleField([t](double v) { t->set_checkpoint_minutes(v); })},
      {"threads", IntField([t](int64_t v) { t->set_threads(v); })},
      {"warmup_frac", DoubleField([t](double v) { t->set_warmup_frac(v); })},
      {"min_lr_frac", DoubleField([t](double v) { t->set_min_lr_frac(v); })},
      {"weight_decay", DoubleField([t](double v) { t->set_weight_decay(v); })},
      {"grad_clip", DoubleField([t](double v) { t->set_grad_clip(v); })},
      {"explode_threshold", DoubleField([t](double v) { t->set_explode_threshold(v); })},
      {"hc_streams", IntField([t](int64_t v) { t->set_hc_streams(v); })},
      {"hc_form", StringField([t](const std::string& v) { t->set_hc_form(v); })},
      {"log_interval", IntField([t](int64_t v) { t->set_log_interval(v); })},
  });
}

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or
// code points above U+10FFFF): spec strings travel in proto3 string fields,
// which must hold UTF-8.
bool ValidUtf8(const std::string& text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char* end = p + text.size();
  while (p < end) {
    unsigned char c = *p;
    int extra = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++p;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= extra) return false;
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    p += extra + 1;
  }
  return true;
}

// Refuses YAML aliases (`*name`): each one repeats its anchored node, so a
// few hundred bytes of nested aliases expand to gigabytes (a "billion
// laughs" document). A sweep spec never needs them. Runs on parse events,
// before any node is built.
class AliasRefuser final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    if (!alias_) alias_ = mark;
  }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  // Where the first alias is, if any.
  const std::optional<YAML::Mark>& alias() const { return alias_; }

 private:
  std::optional<YAML::Mark> alias_;
};

// YAML -> JSON. Unquoted scalars become integers, floats, booleans or null
// when they parse as such; quoted scalars stay strings.
absl::StatusOr<json> YamlToJson(const YAML::Node& node, const std::string& path) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return json(nullptr);
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (!ValidUtf8(text)) return Err(path, "not valid UTF-8");
      if (node.Tag() == "!") return json(text);  // quoted
      int64_t i = 0;
      double d = 0;
      if (absl::SimpleAtoi(text, &i)) return json(i);
      if (absl::SimpleAtod(text, &d) && text.find_first_of("0123456789") != std::string::npos) {
        return json(d);
      }
      if (text == "true" || text == "True") return json(true);
      if (text == "false" || text == "False") return json(false);
      if (text == "null" || text == "~") return json(nullptr);
      return json(text);
    }
    case YAML::NodeType::Sequence: {
      json arr = json::array();
      for (size_t i = 0; i < node.size(); ++i) {
        ASSIGN_OR_RETURN(json v, YamlToJson(node[i], absl::StrCat(path, "[", i, "]")));
        arr.push_back(std::move(v));
      }
      return arr;
    }
    case YAML::NodeType::Map: {
      json obj = json::object();
      for (auto it = node.begin(); it != node.end(); ++it) {
        if (!it->first.IsScalar()) {
          return Err(path, "keys must be plain strings, not lists, mappings or null");
        }
        std::string key = it->first.Scalar();
        if (!ValidUtf8(key)) return Err(path, "a key is not valid UTF-8");
        std::string field = absl::StrCat(path, ".", key);
        if (obj.contains(key)) return Err(field, "duplicate key");
        ASSIGN_OR_RETURN(json v, YamlToJson(it->second, field));
        obj[key] = std::move(v);
      }
      return obj;
    }
  }
  return json(nullptr);
}

// Finds the first key repeated within one JSON object, which json::parse
// would resolve silently (the last one wins).
class DuplicateKeyFinder final : public nlohmann::json_sax<json> {
 public:
  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override {
    frames_.push_back({true, {}, "", 0});
    return true;
  }
  bool key(string_t& key) override {
    Frame& frame = frames_.back();
    if (!frame.keys.insert(key).second) {
      duplicate_ = absl::StrCat(ContainerPath(), ".", key);
      return false;  // stops the parse
    }
    frame.key = key;
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return Value();
  }
  bool start_array(std::size_t) override {
    frames_.push_back({false, {}, "", 0});
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return Value();
  }
  bool parse_error(std::size_t, const std::string& token,
                   const nlohmann::detail::exception& e) override {
    // A number too large for a double (e.g. 1e400, id 406) fails the parse
    // here: name the field it was given for.
    if (e.id == 406) {
      overflow_ = absl::StrCat(ValuePath(), ": the number ", token,
                               " is out of range (must be a finite number)");
    }
    return false;
  }

  // "spec.<path>" of the first repeated key; empty when there is none.
  const std::string& duplicate() const { return duplicate_; }
  // "spec.<path>: ..." when the parse stopped at an out-of-range number.
  const std::string& overflow() const { return overflow_; }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;  // objects: keys seen so far
    std::string key;             // objects: the key being read
    size_t index;                // arrays: the element being read
  };
  // A value ended; in an array the next element begins.
  bool Value() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
    return true;
  }
  // The path of the innermost open container.
  std::string ContainerPath() const {
    std::string path = "spec";
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
      path += frames_[i].object ? absl::StrCat(".", frames_[i].key)
                                : absl::StrCat("[", frames_[i].index, "]");
    }
    return path;
  }

  // The path of the value being read.
  std::string ValuePath() const {
    std::string path = "spec";
    for (const Frame& frame : frames_) {
      path += frame.object ? absl::StrCat(".", frame.key) : absl::StrCat("[", frame.index, "]");
    }
    return path;
  }

  std::vector<Frame> frames_;
  std::string duplicate_;
  std::string overflow_;
};

absl::Status TooLarge(size_t size) {
  return absl::InvalidArgumentError(absl::StrCat(
      "spec: the file is ", size, " bytes; a spec may be at most ", kMaxSpecFileBytes,
      " bytes"));
}

// lr_grids: ARCH -> a plain list, or {lrs: [...]} as in the proto (whose
// path the scheduler's errors use).
absl::Status LrGrids(const json& j, const std::string& p, v1::SweepSpec* s) {
  RETURN_IF_ERROR(Object(j, p));
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string ap = absl::StrCat(p, "[\"", it.key(), "\"]");
    const json* lrs = &it.value();
    if (lrs->is_object()) {
      RETURN_IF_ERROR(Fields(*lrs, ap, {{"lrs", [](const json&, const std::string&) {
                                           return absl::OkStatus();
                                         }}}));
      if (!lrs->contains("lrs")) return Err(ap + ".lrs", "required");
      lrs = &(*lrs)["lrs"];
      ap += ".lrs";
    }
    RETURN_IF_ERROR(List(*lrs, ap));
    auto& grid = (*s->mutable_lr_grids())[it.key()];
    for (size_t i = 0; i < lrs->size(); ++i) {
      ASSIGN_OR_RETURN(double lr, Double((*lrs)[i], absl::StrCat(ap, "[", i, "]")));
      grid.add_lrs(lr);
    }
  }
  return absl::OkStatus();
}

// diagnostics: a list of kinds, or {kinds: [...], num_sequences, ...}. The
// spec gets a diagnostics message only when something sets it.
absl::Status Diagnostics(const json& j, const std::string& p, v1::SweepSpec* s) {
  const json* kinds = &j;
  std::string kp = p;
  if (j.is_object()) {
    v1::DiagnosticsSpec* d = s->mutable_diagnostics();
    RETURN_IF_ERROR(Fields(j, p, {
        {"kinds", [](const json&, const std::string&) { return absl::OkStatus(); }},
        {"num_sequences", IntField([d](int64_t v) { d->set_num_sequences(v); })},
        {"allow_small_n", BoolField([d](bool v) { d->set_allow_small_n(v); })},
        {"causal_form", StringField([d](const std::string& v) { d->set_causal_form(v); })},
        {"fixed_lr", DoubleField([d](double v) { d->set_fixed_lr(v); })},
    }));
    if (!j.contains("kinds")) return absl::OkStatus();
    kinds = &j["kinds"];
    kp = p + ".kinds";
  }
  RETURN_IF_ERROR(List(*kinds, kp));
  for (size_t i = 0; i < kinds->size(); ++i) {
    ASSIGN_OR_RETURN(std::string k, String((*kinds)[i], absl::StrCat(kp, "[", i, "]")));
    s->mutable_diagnostics()->add_kinds(k);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::SweepSpec> SpecFromJson(const json& root) {
  v1::SweepSpec spec;
  v1::SweepSpec* s = &spec;
  RETURN_IF_ERROR(Fields(root, "spec", {
      {"name", StringField([s](const std::string& v) { s->set_name(v); })},
      {"architectures", [s](const json& j, const std::string& p) -> absl::Status {
         RETURN_IF_ERROR(List(j, p));
         for (size_t i = 0; i < j.size(); ++i) {
           ASSIGN_OR_RETURN(std::string a, String(j[i], absl::StrCat(p, "[", i, "]")));
           s->add_architectures(a);
         }
         return absl::OkStatus();
       }},
      {"shapes", [s](const json& j, const std::string& p) {
         return Shapes(j, p, s->mutable_shapes());
       }},
      {"lr_grids", [s](const json& j, const std::string& p) { return LrGrids(j, p, s); }},
      {"seeds", [s](const json& j, const std::string& p) -> absl::Status {
         RETURN_IF_ERROR(List(j, p));
         for (size_t i = 0; i < j.size(); ++i) {
           ASSIGN_OR_RETURN(int64_t v, Int(j[i], absl::StrCat(p, "[", i, "]")));
           s->add_seeds(v);
         }
         return absl::OkStatus();
       }},
      {"training", [s](const json& j, const std::string& p) {
         return Training(j, p, s->mutable_training());
       }},
      {"retry", [s](const json& j, const std::string& p) {
         auto* r = s->mutable_retry();
         return Fields(j, p, {
             {"max_attempts", Int32Field([r](int32_t v) { r->set_max_attempts(v); })},
             {"initial_backoff_ms", IntField([r](int64_t v) { r->set_initial_backoff_ms(v); })},
             {"backoff_multiplier", DoubleField([r](double v) { r->set_backoff_multiplier(v); })},
             {"max_backoff_ms", IntField([r](int64_t v) { r->set_max_backoff_ms(v); })},
         });
       }},
      {"diagnostics", [s](const json& j, const std::string& p) {
         return Diagnostics(j, p, s);
       }},
      {"strategy", [s](const json& j, const std::string& p) -> absl::Status {
         // Either the kind ("successive_halving") or {kind, rungs,
         // reduction_factor, reference_shape} (scheduler/strategies/asha.h).
         auto* st = s->mutable_strategy();
         if (j.is_string()) {
           st->set_kind(j.get<std::string>());
           return absl::OkStatus();
         }
         return Fields(j, p, {
             {"kind", StringField([st](const std::string& v) { st->set_kind(v); })},
             {"rungs", [st](const json& j, const std::string& p) -> absl::Status {
                RETURN_IF_ERROR(List(j, p));
                for (size_t i = 0; i < j.size(); ++i) {
                  ASSIGN_OR_RETURN(double r, Double(j[i], absl::StrCat(p, "[", i, "]")));
                  st->add_rungs(r);
                }
                return absl::OkStatus();
              }},
             {"reduction_factor", DoubleField([st](double v) { st->set_reduction_factor(v); })},
             {"reference_shape",
              StringField([st](const std::string& v) { st->set_reference_shape(v); })},
         });
       }},
      {"resources", [s](const json& j, const std::string& p) {
         auto* r = s->mutable_resources();
         return Fields(j, p, {
             {"devices", Int32Field([r](int32_t v) { r->set_devices(v); })},
             {"memory_mb", IntField([r](int64_t v) { r->set_memory_mb(v); })},
             {"labels", [r](const json& j, const std::string& p) {
                return StringMap(j, p, r->mutable_labels());
              }},
         });
       }},
  }));
  return spec;
}

absl::StatusOr<v1::SweepSpec> ParseSpecJson(const std::string& text) {
  if (text.size() > kMaxSpecFileBytes) return TooLarge(text.size());
  DuplicateKeyFinder finder;
  json::sax_parse(text, &finder, json::input_format_t::json, /*strict=*/true);
  if (!finder.overflow().empty()) return absl::InvalidArgumentError(finder.overflow());
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, out_of_range, ...
    return absl::InvalidArgumentError(absl::StrCat("spec: not valid JSON: ", e.what()));
  }
  if (!finder.duplicate().empty()) return Err(finder.duplicate(), "duplicate key");
  return SpecFromJson(root);
}

absl::StatusOr<v1::SweepSpec> ParseSpecYaml(const std::string& text) {
  if (text.size() > kMaxSpecFileBytes) return TooLarge(text.size());
  YAML::Node node;
  try {
    std::stringstream in(text);
    YAML::Parser parser(in);
    AliasRefuser aliases;
    while (parser.HandleNextDocument(aliases)) {
      if (aliases.alias()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec: YAML aliases (*name) are not supported (line ", aliases.alias()->line + 1,
            ", column ", aliases.alias()->column + 1, "); write the value out"));
      }
    }
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("spec: not valid YAML: ", e.what()));
  }
  try {
    ASSIGN_OR_RETURN(json root, YamlToJson(node, "spec"));
    return SpecFromJson(root);
  } catch (const std::exception& e) {  // a last resort: never abort on input
    return absl::InvalidArgumentError(absl::StrCat("spec: cannot read: ", e.what()));
  }
}

absl::StatusOr<v1::SweepSpec> ReadSpecFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read spec file ", path));
  // Read at most one byte past the limit: a huge file is refused unread.
  std::string text(kMaxSpecFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxSpecFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec: ", path, " is larger than ", kMaxSpecFileBytes, " bytes, the limit for a spec"));
  }
  bool is_json = path.size() >= 5 && path.substr(path.size() - 5) == ".json";
  return is_json ? ParseSpecJson(text) : ParseSpecYaml(text);
}

}  // namespace depthbench::cli
