// A batch of MetaSchedule candidates' traces, read in place in one call, in two forms:
//
// * `tcl.CandidateSteps(candidates, begin, end, kinds) -> str`: a JSON array with, per candidate
//   in [begin, end), the steps `tcl.records.metaschedule.trace_to_steps` makes of its trace's
//   JSON (the JSON a database line holds), or null where an instruction kind is not in `kinds`.
// * `tcl.CandidateFeaturizer(kinds, kind_columns, strings, string_columns, other_column,
//   numeric_column, n_numeric, max_len, n_features) -> Function`: the encoding of
//   `tcl.features.Featurizer` (the vocabulary passed in once), as a function
//   `(candidates, begin, end, x, lengths)` that writes candidate i's (max_len, n_features) float32
//   rows into x[i] and its number of rows into lengths[i] (0: an empty program). The steps are
//   encoded as the walk makes them: no text, no Python objects, no table to gather from.
//
// From Python, each FFI value of a trace costs its own call (hundreds a trace), and TVM's own
// TraceAsJSON builds an object per value and a name per variable. Here the trace's instructions,
// their arguments and the decisions are read in place through the FFI's reflection, and the
// step rules applied as they go (one walk, `WalkTrace`, feeds either form). Built against the
// TVM FFI headers only: TVM's objects (the variables, IntImm, FloatImm, IndexMap) are recognised
// by type key. An IndexMap is written as the string "<IndexMap>" (see Sink::Object). The FFI
// releases the GIL during a call, so two threads take a half of a batch each.
//
// Loaded by tcl/tuner/traces.py with ctypes; registering the functions is the library's static
// initialiser. tests/test_tuner.py checks, for every kind of operator of the networks, the steps
// against those ingest reads from a database, and the features byte for byte against the
// Featurizer's of those steps.

#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/accessor.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

using tvm::ffi::Any;
using tvm::ffi::Array;
using tvm::ffi::Function;
using tvm::ffi::ObjectRef;
using tvm::ffi::String;

int32_t TypeIndexOf(const char* key) {
  TVMFFIByteArray name{key, std::char_traits<char>::length(key)};
  int32_t index = -1;
  if (TVMFFITypeKeyToIndex(&name, &index) != 0) return -1;
  return index;
}

// An ObjectRef field of an object, read in place: a borrowed pointer, no reference taken (the
// walk's objects outlive it). The reflection getter returns an owned Any: an atomic increment
// and decrement on each instruction's kind, inputs, attrs and outputs, and on each array item
// when iterated as Array<Any>, were about half of a walk's time (perf).
class BorrowedField {
 public:
  BorrowedField(std::string_view type_key, const char* field)
      : info_(tvm::ffi::reflection::GetFieldInfo(type_key, field)) {
    TVM_FFI_CHECK(info_->field_static_type_index >= kTVMFFIStaticObjectBegin, TypeError)
        << type_key << "." << field << " is not an object field";
  }
  const tvm::ffi::Object* operator()(const tvm::ffi::Object* obj) const {
    return reinterpret_cast<const ObjectRef*>(reinterpret_cast<const char*>(obj) + info_->offset)->get();
  }

 private:
  const TVMFFIFieldInfo* info_;
};

// The items of an array object, borrowed; empty for anything else (a null field).
struct Items {
  const Any* first = nullptr;
  const Any* last = nullptr;
  explicit Items(const tvm::ffi::Object* obj) {
    if (obj != nullptr && obj->type_index() == kTVMFFIArray) {
      auto* array = static_cast<const tvm::ffi::ArrayObj*>(obj);
      first = array->begin();
      last = array->end();
    }
  }
  explicit Items(const Any& value) : Items(value.type_index() == kTVMFFIArray ? value.as<tvm::ffi::Object>() : nullptr) {}
  const Any* begin() const { return first; }
  const Any* end() const { return last; }
  size_t size() const { return last - first; }
  const Any& operator[](size_t i) const { return first[i]; }
};

struct Context {
  int32_t int_imm = TypeIndexOf("ir.IntImm");
  int32_t float_imm = TypeIndexOf("ir.FloatImm");
  int32_t index_map = TypeIndexOf("tirx.IndexMap");
  tvm::ffi::reflection::FieldGetter int_value{"ir.IntImm", "value"};
  tvm::ffi::reflection::FieldGetter float_value{"ir.FloatImm", "value"};
  tvm::ffi::reflection::FieldGetter candidate_sch{"s_tir.meta_schedule.MeasureCandidate", "sch"};
  int32_t block_rv = TypeIndexOf("s_tir.SBlockRV");
  int32_t loop_rv = TypeIndexOf("s_tir.LoopRV");
  int32_t var = TypeIndexOf("ir.Var");
  BorrowedField trace_insts{"s_tir.Trace", "insts"};
  tvm::ffi::reflection::FieldGetter trace_decisions{"s_tir.Trace", "decisions"};
  BorrowedField inst_kind{"s_tir.Instruction", "kind"};
  BorrowedField inst_inputs{"s_tir.Instruction", "inputs"};
  BorrowedField inst_attrs{"s_tir.Instruction", "attrs"};
  BorrowedField inst_outputs{"s_tir.Instruction", "outputs"};
  tvm::ffi::reflection::FieldGetter kind_name{"s_tir.InstructionKind", "name"};
  Function get_trace = Function::GetGlobalRequired("s_tir.schedule.ScheduleGetTrace");
};

const Context& GetContext() {
  static Context ctx;  // after TVM registered its types and functions (first call, not load)
  return ctx;
}

bool IsString(const Any& v) {
  int32_t i = v.type_index();
  return i == kTVMFFIStr || i == kTVMFFISmallStr;
}

std::string_view View(const String& s) { return {s.data(), s.size()}; }

bool IsQuoted(std::string_view s) { return s.size() >= 2 && s.front() == '"' && s.back() == '"'; }

std::optional<int64_t> AsInt(const Context& ctx, const Any& v) {
  if (v.type_index() == kTVMFFIInt) return v.cast<int64_t>();
  if (v.type_index() == ctx.int_imm) return ctx.int_value(v.cast<ObjectRef>()).cast<int64_t>();
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// What the walk hands a sink, per step: Begin(kind) (false: the sink keeps nothing of this step,
// but the walk still follows its variables), the step's values in order (Null, Bool, Int, Float,
// Str; a list's items between BeginList and EndList), End(). Unknown(): an instruction kind
// outside the known ones, the program has no steps. Full(): the sink wants no more steps (the
// walk then only checks the remaining kinds).

// What the step rules need of an instruction kind, looked up once per kind.
struct KindInfo {
  bool known = false;  // in the kinds trace_to_steps reads
  bool tile = false;   // SamplePerfectTile / SamplePartitionedTile
  bool categorical = false;
  int64_t column = -1;  // the featurizer's one-hot column (-1: a query kind it skips)
  std::string name;
};

// One value as the database's JSON holds it (read back by orjson): an IntImm is its value, an
// IndexMap the string "<IndexMap>". (In these templates GCC takes a field getter's result as
// dependent: its `cast` needs the `template` keyword.)
template <typename Sink>
void Emit(const Context& ctx, const Any& value, Sink* sink) {
  int32_t index = value.type_index();
  switch (index) {
    case kTVMFFINone: sink->Null(); return;
    case kTVMFFIBool: sink->Bool(value.cast<bool>()); return;
    case kTVMFFIInt: sink->Int(value.cast<int64_t>()); return;
    case kTVMFFIFloat: sink->Float(value.cast<double>()); return;
    case kTVMFFISmallStr:
    case kTVMFFIStr: sink->Str(View(value.cast<String>())); return;
    case kTVMFFIArray: {
      sink->BeginList();
      for (const Any& item : Items(value)) Emit(ctx, item, sink);
      sink->EndList();
      return;
    }
    default: break;
  }
  const tvm::ffi::Object* obj = value.as<tvm::ffi::Object>();
  if (index == ctx.int_imm) {
    sink->Int(ctx.int_value(obj).template cast<int64_t>());
  } else if (index == ctx.float_imm) {
    sink->Float(ctx.float_value(obj).template cast<double>());
  } else if (index == ctx.index_map) {
    // The database holds the map's JSON graph (C++ SaveJSON, indented), ~0.1 ms to write here;
    // the featurizer encodes any string outside its vocabulary as one token, so a fixed
    // string gives the same features (tests/test_tuner.py checks it) at no cost.
    sink->Str("<IndexMap>");
  } else {
    TVM_FFI_THROW(TypeError) << "unexpected object of type index " << index << " in a trace";
  }
}

// One argument of a step: a string literal is stored quoted and loses its quotes.
template <typename Sink>
void Item(const Context& ctx, const Any& v, Sink* sink) {
  if (IsString(v)) {
    std::string_view sv = View(v.cast<String>());
    if (IsQuoted(sv)) {
      sink->Str(sv.substr(1, sv.size() - 2));
      return;
    }
  }
  Emit(ctx, v, sink);
}

template <typename Sink>
void Flatten(const Context& ctx, const Any& v, Sink* sink) {
  if (v.type_index() == kTVMFFIArray) {
    for (const Any& item : Items(v)) Flatten(ctx, item, sink);
  } else {
    Item(ctx, v, sink);
  }
}

// ---------------------------------------------------------------------------------------------
// tcl.records.metaschedule.trace_to_steps, the same rules on the FFI objects (its docstring says
// why each is there): literal inputs and flattened attributes, a variable input replaced by its
// value (a loop: its position among the outputs that made it; a sampled tile or categorical
// pick: the value; a block: dropped), then the instruction's decision.

struct Slot {
  bool drop = false;  // a block: it names, it carries no number
  Any value;          // a loop's position among its maker's outputs, or a sampled value
  char prefix = 0;    // its name, as TraceAsJSON writes it: prefix (b/l/v) + `number`,
  size_t number = 0;  // the count of variables made before it
};

// Object pointer -> V, open addressing (linear probing), kept across the traces of a batch:
// cleared, not freed. The walk makes ~100 variables a trace; std::unordered_map allocated a node
// for each (14 % of the walk's samples inside tuning, perf).
template <typename V>
class PointerTable {
 public:
  PointerTable() { Resize(256); }
  void Clear() {
    std::fill(keys_.begin(), keys_.end(), nullptr);
    size_ = 0;
  }
  const V* Find(const tvm::ffi::Object* key) const {
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == nullptr) return nullptr;
    }
  }
  V& operator[](const tvm::ffi::Object* key) {  // inserts V{} where absent
    if (2 * (size_ + 1) > keys_.size()) Grow();
    size_t i = Hash(key);
    for (; keys_[i] != nullptr; i = (i + 1) & mask_) {
      if (keys_[i] == key) return values_[i];
    }
    keys_[i] = key;
    values_[i] = V{};
    ++size_;
    return values_[i];
  }

 private:
  size_t Hash(const tvm::ffi::Object* key) const {
    return ((reinterpret_cast<uintptr_t>(key) >> 4) * 0x9E3779B97F4A7C15ull >> 20) & mask_;
  }
  void Resize(size_t capacity) {
    keys_.assign(capacity, nullptr);
    values_.assign(capacity, V{});
    mask_ = capacity - 1;
    size_ = 0;
  }
  void Grow() {
    std::vector<const tvm::ffi::Object*> keys = std::move(keys_);
    std::vector<V> values = std::move(values_);
    Resize(2 * keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] != nullptr) (*this)[keys[i]] = std::move(values[i]);
    }
  }
  std::vector<const tvm::ffi::Object*> keys_;
  std::vector<V> values_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

using Slots = PointerTable<Slot>;

// A variable of the trace (SBlockRV, LoopRV or an expression's Var), or nullptr.
const tvm::ffi::Object* Variable(const Context& ctx, const Any& v) {
  int32_t i = v.type_index();
  if (i == ctx.block_rv || i == ctx.loop_rv || i == ctx.var) return v.as<tvm::ffi::Object>();
  return nullptr;
}

// One input of an instruction as TraceAsJSON writes it then trace_to_steps reads it: a string is
// a literal; None is the string "None"; a known variable is its value (a block: nothing), an
// unknown one nothing; a list is flattened (a variable in it: its name).
template <typename Sink>
void Input(const Context& ctx, const Any& x, const Slots& slots, Sink* sink, bool nested) {
  int32_t i = x.type_index();
  if (i == kTVMFFINone) {
    sink->Str("None");
  } else if (IsString(x)) {
    sink->Str(View(x.cast<String>()));
  } else if (i == kTVMFFIArray) {
    for (const Any& item : Items(x)) Input(ctx, item, slots, sink, true);
  } else if (const tvm::ffi::Object* var = Variable(ctx, x)) {
    const Slot* found = slots.Find(var);
    if (found == nullptr) {
      if (nested) TVM_FFI_THROW(ValueError) << "a variable no instruction made, in a list";
      return;
    }
    if (nested) {
      std::string name = found->prefix + std::to_string(found->number);
      sink->Str(name);
    } else if (!found->drop) {
      Emit(ctx, found->value, sink);
    }
  } else if (i == kTVMFFIInt || i == kTVMFFIBool || i == kTVMFFIFloat || i == ctx.int_imm ||
             i == ctx.float_imm || i == ctx.index_map) {
    Item(ctx, x, sink);
  } else {  // an expression of variables: TraceAsJSON prints it; not met in MetaSchedule's spaces
    TVM_FFI_THROW(TypeError) << "unsupported input of type index " << i << " in a trace";
  }
}

// Kind name -> what the rules and the featurizer need of it; the cache is keyed by the kind
// object (kinds are registered once: stable pointers).
struct Kinds {
  std::unordered_map<std::string, int64_t> columns;  // the known kinds, with their columns
  std::unordered_map<const tvm::ffi::Object*, KindInfo> cache;

  const KindInfo& Of(const Context& ctx, const tvm::ffi::Object* kind_obj) {
    auto cached = cache.find(kind_obj);
    if (cached != cache.end()) return cached->second;
    String kind = ctx.kind_name(kind_obj).cast<String>();
    std::string name(kind.data(), kind.size());
    auto column = columns.find(name);
    KindInfo info{column != columns.end(), name == "SamplePerfectTile" || name == "SamplePartitionedTile",
                  name == "SampleCategorical", column != columns.end() ? column->second : -1, name};
    return cache.emplace(kind_obj, info).first->second;
  }
};

// What the walks of a batch share: the kinds met so far, and two tables cleared for each trace.
struct WalkState {
  Kinds kinds;
  Slots slots;                  // variable -> what an input naming it stands for
  PointerTable<Any> decisions;  // instruction -> its decision
};

// Instructions ahead of the walk whose arrays are prefetched (see WalkTrace).
constexpr size_t kPrefetchAhead = 2;

// The steps of one trace into `sink`. The instructions, their arguments and the decisions are
// read through the FFI's reflection (no JSON is built).
//
// Inside tuning each trace is new to the caches (the search made it since the last batch), and
// the walk is a chain of dependent loads: instruction -> its input, attribute and output arrays
// -> their items. So the instructions are prefetched all at once first, and each instruction's
// arrays a few instructions ahead, letting the misses overlap instead of following each other.
template <typename Sink>
void WalkTrace(const Context& ctx, const ObjectRef& trace, WalkState* state, Sink* sink) {
  Items insts(ctx.trace_insts(trace.get()));
  for (const Any& inst_any : insts) __builtin_prefetch(inst_any.as<tvm::ffi::Object>());
  PointerTable<Any>& decisions = state->decisions;
  decisions.Clear();
  for (const auto& [inst_any, decision] :
       ctx.trace_decisions(trace).template cast<tvm::ffi::Map<Any, Any>>()) {
    if (const tvm::ffi::Object* inst = inst_any.template as<tvm::ffi::Object>()) {
      __builtin_prefetch(decision.template as<tvm::ffi::Object>());
      decisions[inst] = decision;
    }
  }
  Slots& slots = state->slots;
  slots.Clear();
  Kinds* kinds = &state->kinds;
  size_t n_names = 0;
  for (size_t k = 0; k < insts.size(); ++k) {
    const Any& inst_any = insts[k];
    const tvm::ffi::Object* inst = inst_any.as<tvm::ffi::Object>();
    if (k + kPrefetchAhead < insts.size()) {
      const tvm::ffi::Object* ahead = insts[k + kPrefetchAhead].as<tvm::ffi::Object>();
      __builtin_prefetch(ctx.inst_inputs(ahead));
      __builtin_prefetch(ctx.inst_attrs(ahead));
      __builtin_prefetch(ctx.inst_outputs(ahead));
    }
    const KindInfo& info = kinds->Of(ctx, ctx.inst_kind(inst));
    if (!info.known) {
      sink->Unknown();
      return;
    }
    if (sink->Full()) continue;  // only an unknown kind further on changes the result
    bool keep = sink->Begin(info);
    if (keep) {
      for (const Any& x : Items(ctx.inst_inputs(inst))) Input(ctx, x, slots, sink, false);
    }
    Items attrs(ctx.inst_attrs(inst));
    if (keep) {
      for (const Any& a : attrs) Flatten(ctx, a, sink);
    }
    Items outputs(ctx.inst_outputs(inst));
    bool loops = outputs.size() > 0 && outputs[0].type_index() == ctx.loop_rv;
    int64_t position = 0;
    for (const Any& o : outputs) {  // an instruction makes variables of one sort
      int32_t t = o.type_index();
      char prefix = t == ctx.block_rv ? 'b' : t == ctx.loop_rv ? 'l' : t == ctx.var ? 'v' : 0;
      if (!prefix) TVM_FFI_THROW(TypeError) << "an output of type index " << t << " in a trace";
      Slot& slot = slots[o.as<tvm::ffi::Object>()];
      slot.prefix = prefix;
      slot.number = n_names++;
      slot.drop = !loops;
      slot.value = loops ? Any(position++) : Any();
    }
    const Any* decision = decisions.Find(inst);
    if (decision != nullptr && decision->type_index() != kTVMFFINone) {
      const Any& d = *decision;
      if (keep) Flatten(ctx, d, sink);
      if (info.tile && d.type_index() == kTVMFFIArray) {
        Items sampled(d);
        for (size_t i = 0; i < outputs.size() && i < sampled.size(); ++i) {
          Slot& slot = slots[outputs[i].as<tvm::ffi::Object>()];
          slot.drop = false;
          slot.value = sampled[i];
        }
      } else if (info.categorical && attrs.size() > 0 && outputs.size() > 0) {
        Items candidates(attrs[0]);
        auto pick = AsInt(ctx, d);
        if (pick && *pick >= 0 && *pick < static_cast<int64_t>(candidates.size())) {
          Slot& slot = slots[outputs[0].as<tvm::ffi::Object>()];
          slot.drop = false;
          slot.value = candidates[*pick];
        }
      }
    }
    if (keep) sink->End();
  }
}

ObjectRef TraceOf(const Context& ctx, const Any& candidate) {
  return ctx.get_trace(ctx.candidate_sch(candidate.cast<ObjectRef>())).cast<ObjectRef>();
}

// ---------------------------------------------------------------------------------------------
// The steps as JSON text (tcl.CandidateSteps).

void WriteString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

class JsonSink {
 public:
  explicit JsonSink(std::string* out) : out_(out), start_(out->size()) { out_->push_back('['); }

  bool Full() const { return unknown_; }
  void Unknown() {
    out_->resize(start_);
    *out_ += "null";
    unknown_ = true;
  }
  bool Begin(const KindInfo& info) {
    if (steps_++) out_->push_back(',');
    out_->push_back('[');
    WriteString(info.name, out_);
    return true;
  }
  void End() { out_->push_back(']'); }
  void Finish() {
    if (!unknown_) out_->push_back(']');
  }

  void Null() { Comma(); *out_ += "null"; }
  void Bool(bool v) { Comma(); *out_ += v ? "true" : "false"; }
  void Int(int64_t v) {
    Comma();
    char buf[24];
    out_->append(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
  }
  void Float(double v) {
    Comma();
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    std::string_view text(buf);
    *out_ += text;
    if (text.find_first_of(".eEn") == std::string_view::npos) *out_ += ".0";  // stays a float
  }
  void Str(std::string_view v) { Comma(); WriteString(v, out_); }
  void BeginList() { Comma(); out_->push_back('['); open_ = true; }
  void EndList() { out_->push_back(']'); open_ = false; }

 private:
  void Comma() {
    if (!open_) out_->push_back(',');  // a step's arguments follow its kind
    open_ = false;
  }
  std::string* out_;
  size_t start_;
  size_t steps_ = 0;
  bool unknown_ = false;
  bool open_ = false;  // right after '[' of a list: no comma before its first item
};

String CandidateSteps(Array<Any> candidates, int64_t begin, int64_t end, Array<String> kind_names) {
  const Context& ctx = GetContext();
  WalkState state;
  for (const String& k : kind_names) state.kinds.columns.emplace(std::string(View(k)), -1);
  std::string out = "[";
  for (int64_t i = begin; i < end; ++i) {
    if (i > begin) out.push_back(',');
    JsonSink sink(&out);
    WalkTrace(ctx, TraceOf(ctx, candidates[i]), &state, &sink);
    sink.Finish();
  }
  out.push_back(']');
  return String(std::move(out));
}

// ---------------------------------------------------------------------------------------------
// The steps as the featurizer's rows (tcl.CandidateFeaturizer): tcl.features.Featurizer's
// encoding, the same numbers in the same float32 bits. A row is the one-hot of its kind, its
// first n_numeric numbers (flags as 1/0) as sign(a) * log2(1 + |a|) computed in double, and a
// one-hot of each string's token (its text up to a '$'; outside the vocabulary, one column for
// all); None carries nothing; a list's items are the step's. Query kinds make no row; a program
// keeps its first max_len rows.

struct Encoding {
  std::unordered_map<std::string, int64_t> kind_columns;
  std::unordered_map<std::string, int64_t> string_columns;
  int64_t other_column, numeric_column, n_numeric, max_len, n_features;
  std::vector<float> small_logs;  // sign-free log2(1 + i) for small integers i, as float32

  float Log(double a) const {
    // math.copysign(math.log2(1.0 + abs(a)), a) in double (the same libm), then float32
    return static_cast<float>(std::copysign(std::log2(1.0 + std::fabs(a)), a));
  }
};

class FeatureSink {
 public:
  FeatureSink(const Encoding& enc, float* x, int64_t* length)
      : enc_(enc), x_(x), length_(length) {
    std::memset(x_, 0, sizeof(float) * enc_.max_len * enc_.n_features);
    *length_ = 0;
  }

  bool Full() const { return unknown_ || *length_ == enc_.max_len; }
  void Unknown() {
    std::memset(x_, 0, sizeof(float) * enc_.max_len * enc_.n_features);
    *length_ = 0;
    unknown_ = true;
  }
  bool Begin(const KindInfo& info) {
    if (info.column < 0) return false;  // a query kind: no row
    row_ = x_ + *length_ * enc_.n_features;
    row_[info.column] = 1.0f;
    numbers_ = 0;
    return true;
  }
  void End() { ++*length_; }

  void Null() {}
  void Bool(bool v) { Number(v ? 1 : 0); }
  void Int(int64_t v) {
    if (numbers_ >= enc_.n_numeric) return;
    if (v >= 0 && v < static_cast<int64_t>(enc_.small_logs.size())) {
      row_[enc_.numeric_column + numbers_++] = enc_.small_logs[v];
    } else {
      Number(static_cast<double>(v));
    }
  }
  void Float(double v) { Number(v); }
  void Str(std::string_view v) {
    if (v.find('$') != std::string_view::npos) {
      // an Ansor-style "token$number": Python's float() parses the number; not met in
      // MetaSchedule's traces, so such a batch takes the featurizer's own way
      TVM_FFI_THROW(TypeError) << "a string with '$' in a trace: " << v;
    }
    auto found = enc_.string_columns.find(std::string(v));
    row_[found != enc_.string_columns.end() ? found->second : enc_.other_column] = 1.0f;
  }
  void BeginList() {}
  void EndList() {}

 private:
  void Number(double v) {
    if (numbers_ < enc_.n_numeric) row_[enc_.numeric_column + numbers_++] = enc_.Log(v);
  }
  const Encoding& enc_;
  float* x_;
  int64_t* length_;
  float* row_ = nullptr;
  int64_t numbers_ = 0;
  bool unknown_ = false;
};

void CheckTensor(const tvm::ffi::TensorView& t, const char* name, DLDataTypeCode code, int bits,
                 std::initializer_list<int64_t> trailing, int64_t rows) {
  TVM_FFI_CHECK(t.device().device_type == kDLCPU, ValueError) << name << " must be on the CPU";
  TVM_FFI_CHECK(t.dtype().code == code && t.dtype().bits == bits && t.dtype().lanes == 1, TypeError)
      << name << " has the wrong dtype";
  TVM_FFI_CHECK(t.ndim() == static_cast<int32_t>(1 + trailing.size()) && t.IsContiguous(), ValueError)
      << name << " must be a C-contiguous array of " << 1 + trailing.size() << " dimensions";
  TVM_FFI_CHECK(t.shape()[0] >= rows, ValueError) << name << " has fewer rows than candidates";
  int d = 1;
  for (int64_t want : trailing) {
    TVM_FFI_CHECK(t.shape()[d++] == want, ValueError) << name << " has the wrong shape";
  }
}

Function CandidateFeaturizer(Array<String> kinds, Array<int64_t> kind_columns, Array<String> strings,
                             Array<int64_t> string_columns, int64_t other_column, int64_t numeric_column,
                             int64_t n_numeric, int64_t max_len, int64_t n_features) {
  TVM_FFI_CHECK(kinds.size() == kind_columns.size() && strings.size() == string_columns.size(), ValueError)
      << "names and columns differ in length";
  auto enc = std::make_shared<Encoding>();
  for (size_t i = 0; i < kinds.size(); ++i) enc->kind_columns.emplace(std::string(View(kinds[i])), kind_columns[i]);
  for (size_t i = 0; i < strings.size(); ++i) {
    enc->string_columns.emplace(std::string(View(strings[i])), string_columns[i]);
  }
  enc->other_column = other_column;
  enc->numeric_column = numeric_column;
  enc->n_numeric = n_numeric;
  enc->max_len = max_len;
  enc->n_features = n_features;
  for (int64_t c : kind_columns) TVM_FFI_CHECK(c < n_features, ValueError) << "a kind column out of range";
  for (int64_t c : string_columns) TVM_FFI_CHECK(c >= 0 && c < n_features, ValueError) << "a string column out of range";
  TVM_FFI_CHECK(other_column >= 0 && other_column < n_features && numeric_column >= 0 &&
                numeric_column + n_numeric <= n_features && max_len > 0, ValueError)
      << "columns out of range";
  enc->small_logs.resize(1 << 14);  // tile sizes, loop positions, unroll steps, picks
  for (size_t i = 0; i < enc->small_logs.size(); ++i) enc->small_logs[i] = enc->Log(static_cast<double>(i));
  std::shared_ptr<const Encoding> encoding = enc;
  return Function::FromTyped([encoding](Array<Any> candidates, int64_t begin, int64_t end,
                                        tvm::ffi::TensorView x, tvm::ffi::TensorView lengths) {
    const Encoding& e = *encoding;
    TVM_FFI_CHECK(0 <= begin && begin <= end && end <= static_cast<int64_t>(candidates.size()), IndexError)
        << "candidates [" << begin << ", " << end << ") out of range";
    CheckTensor(x, "x", kDLFloat, 32, {e.max_len, e.n_features}, end);
    CheckTensor(lengths, "lengths", kDLInt, 64, {}, end);
    const Context& ctx = GetContext();
    WalkState state;
    state.kinds.columns = e.kind_columns;
    float* xs = static_cast<float*>(x.data_ptr()) + x.byte_offset() / sizeof(float);
    int64_t* ls = static_cast<int64_t*>(lengths.data_ptr()) + lengths.byte_offset() / sizeof(int64_t);
    ObjectRef next = begin < end ? TraceOf(ctx, candidates[begin]) : ObjectRef();
    for (int64_t i = begin; i < end; ++i) {
      ObjectRef trace = std::move(next);
      if (i + 1 < end) {  // the next trace's instruction array, fetched while this one is walked
        next = TraceOf(ctx, candidates[i + 1]);
        __builtin_prefetch(ctx.trace_insts(next.get()));
      }
      FeatureSink sink(e, xs + i * e.max_len * e.n_features, ls + i);
      WalkTrace(ctx, trace, &state, &sink);
    }
  });
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  tvm::ffi::reflection::GlobalDef()
      .def("tcl.CandidateSteps", CandidateSteps)
      .def("tcl.CandidateFeaturizer", CandidateFeaturizer);
}
