// The steps of a batch of MetaSchedule candidates in one call:
// `tcl.CandidateSteps(candidates, begin, end, kinds) -> str`, a JSON array with, per candidate in
// [begin, end), the steps `tcl.records.metaschedule.trace_to_steps` makes of its trace's JSON
// (the JSON a database line holds), or null where an instruction kind is not in `kinds`.
//
// From Python, each FFI value of a trace costs its own call (hundreds a trace), and TVM's own
// TraceAsJSON builds an object per value and a name per variable. Here the trace's instructions,
// their arguments and the decisions are read in place through the FFI's reflection, the step
// rules applied as they go, and only the steps' text crosses over, to be parsed by orjson. Built
// against the TVM FFI headers only: TVM's objects (the variables, IntImm, FloatImm, IndexMap)
// are recognised by type key. An IndexMap is written as the string "<IndexMap>" (see Write).
// The FFI releases the GIL during the call, so two threads take a half of a batch each.
//
// Loaded by tcl/tuner/traces.py with ctypes; registering the function is the library's static
// initialiser. tests/test_tuner.py checks its steps, for every kind of operator of the networks,
// against those ingest reads from a database.

#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/accessor.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <charconv>
#include <cstdio>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

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
  tvm::ffi::reflection::FieldGetter trace_insts{"s_tir.Trace", "insts"};
  tvm::ffi::reflection::FieldGetter trace_decisions{"s_tir.Trace", "decisions"};
  tvm::ffi::reflection::FieldGetter inst_kind{"s_tir.Instruction", "kind"};
  tvm::ffi::reflection::FieldGetter inst_inputs{"s_tir.Instruction", "inputs"};
  tvm::ffi::reflection::FieldGetter inst_attrs{"s_tir.Instruction", "attrs"};
  tvm::ffi::reflection::FieldGetter inst_outputs{"s_tir.Instruction", "outputs"};
  tvm::ffi::reflection::FieldGetter kind_name{"s_tir.InstructionKind", "name"};
  Function get_trace = Function::GetGlobalRequired("s_tir.schedule.ScheduleGetTrace");
};

const Context& GetContext() {
  static Context ctx;  // after TVM registered its types and functions (first call, not load)
  return ctx;
}

void WriteString(const String& text, std::string* out) {
  std::string_view s(text.data(), text.size());
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

void WriteInt(int64_t v, std::string* out) {
  char buf[24];
  auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
  out->append(buf, end);
}

void WriteDouble(double v, std::string* out) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  std::string_view text(buf);
  *out += text;
  if (text.find_first_of(".eEn") == std::string_view::npos) *out += ".0";  // stays a float
}

void Write(const Context& ctx, const Any& value, std::string* out) {
  int32_t index = value.type_index();
  switch (index) {
    case kTVMFFINone: *out += "null"; return;
    case kTVMFFIBool: *out += (value.cast<bool>() ? "true" : "false"); return;
    case kTVMFFIInt: WriteInt(value.cast<int64_t>(), out); return;
    case kTVMFFIFloat: WriteDouble(value.cast<double>(), out); return;
    case kTVMFFISmallStr:
    case kTVMFFIStr: WriteString(value.cast<String>(), out); return;
    case kTVMFFIArray: {
      out->push_back('[');
      bool first = true;
      for (const Any& item : value.cast<Array<Any>>()) {
        if (!first) out->push_back(',');
        first = false;
        Write(ctx, item, out);
      }
      out->push_back(']');
      return;
    }
    default: break;
  }
  ObjectRef obj = value.cast<ObjectRef>();
  if (index == ctx.int_imm) {
    WriteInt(ctx.int_value(obj).cast<int64_t>(), out);
  } else if (index == ctx.float_imm) {
    WriteDouble(ctx.float_value(obj).cast<double>(), out);
  } else if (index == ctx.index_map) {
    // The database holds the map's JSON graph (C++ SaveJSON, indented), ~0.1 ms to write here;
    // the featurizer encodes any string outside its vocabulary as one token, so a fixed
    // string gives the same features (tests/test_tuner.py checks it) at no cost.
    *out += "\"<IndexMap>\"";
  } else {
    TVM_FFI_THROW(TypeError) << "unexpected object of type index " << index << " in a trace";
  }
}

// ---------------------------------------------------------------------------------------------
// tcl.records.metaschedule.trace_to_steps, the same rules on the FFI JSON (its docstring says why
// each is there): literal inputs and flattened attributes, a variable input replaced by its value
// (a loop: its position among the outputs that made it; a sampled tile or categorical pick: the
// value; a block: dropped), then the instruction's decision.

bool IsString(const Any& v) {
  int32_t i = v.type_index();
  return i == kTVMFFIStr || i == kTVMFFISmallStr;
}

bool IsQuoted(std::string_view s) { return s.size() >= 2 && s.front() == '"' && s.back() == '"'; }

std::optional<int64_t> AsInt(const Context& ctx, const Any& v) {
  if (v.type_index() == kTVMFFIInt) return v.cast<int64_t>();
  if (v.type_index() == ctx.int_imm) return ctx.int_value(v.cast<ObjectRef>()).cast<int64_t>();
  return std::nullopt;
}

struct StepWriter {
  const Context& ctx;
  std::string* out;

  void Item(const Any& v) {  // one argument of the step being written
    out->push_back(',');
    if (IsString(v)) {
      String text = v.cast<String>();
      std::string_view sv(text.data(), text.size());
      if (IsQuoted(sv)) {  // a string literal is stored quoted
        WriteString(String(std::string(sv.substr(1, sv.size() - 2))), out);
        return;
      }
    }
    Write(ctx, v, out);
  }

  void Flatten(const Any& v) {
    if (v.type_index() == kTVMFFIArray) {
      for (const Any& item : v.cast<Array<Any>>()) Flatten(item);
    } else {
      Item(v);
    }
  }
};

struct Slot {
  bool drop = false;  // a block: it names, it carries no number
  Any value;          // a loop's position among its maker's outputs, or a sampled value
  char prefix = 0;    // its name, as TraceAsJSON writes it: prefix (b/l/v) + `number`,
  size_t number = 0;  // the count of variables made before it
};

// What the step rules need of an instruction kind, looked up once per kind.
struct KindInfo {
  bool known = false;  // in the kinds trace_to_steps reads
  bool tile = false;   // SamplePerfectTile / SamplePartitionedTile
  bool categorical = false;
};

using Slots = std::unordered_map<const tvm::ffi::Object*, Slot>;

// A variable of the trace (SBlockRV, LoopRV or an expression's Var), or nullptr.
const tvm::ffi::Object* Variable(const Context& ctx, const Any& v) {
  int32_t i = v.type_index();
  if (i == ctx.block_rv || i == ctx.loop_rv || i == ctx.var) return v.cast<ObjectRef>().get();
  return nullptr;
}

// One input of an instruction as TraceAsJSON writes it then trace_to_steps reads it: a string is
// a literal; None is the string "None"; a known variable is its value (a block: nothing), an
// unknown one nothing; a list is flattened (a variable in it: its name).
void WriteInput(const Context& ctx, const Any& x, const Slots& slots, StepWriter* w, bool nested) {
  int32_t i = x.type_index();
  if (i == kTVMFFINone) {
    w->out->push_back(',');
    *w->out += "\"None\"";
  } else if (IsString(x)) {
    w->out->push_back(',');
    WriteString(x.cast<String>(), w->out);
  } else if (i == kTVMFFIArray) {
    for (const Any& item : x.cast<Array<Any>>()) WriteInput(ctx, item, slots, w, true);
  } else if (const tvm::ffi::Object* var = Variable(ctx, x)) {
    auto found = slots.find(var);
    if (found == slots.end()) {
      if (nested) TVM_FFI_THROW(ValueError) << "a variable no instruction made, in a list";
      return;
    }
    w->out->push_back(',');
    if (nested) {
      WriteString(String(found->second.prefix + std::to_string(found->second.number)), w->out);
    } else if (!found->second.drop) {
      Write(ctx, found->second.value, w->out);
    } else {
      w->out->pop_back();
    }
  } else if (i == kTVMFFIInt || i == kTVMFFIBool || i == kTVMFFIFloat || i == ctx.int_imm ||
             i == ctx.float_imm || i == ctx.index_map) {
    w->Item(x);
  } else {  // an expression of variables: TraceAsJSON prints it; not met in MetaSchedule's spaces
    TVM_FFI_THROW(TypeError) << "unsupported input of type index " << i << " in a trace";
  }
}

// Steps of one trace as a JSON list, or `null` for an instruction kind not in `kinds`. The
// instructions, their arguments and the decisions are read through the FFI's reflection (no
// JSON is built): the same steps tcl.records.metaschedule.trace_to_steps makes of the trace's JSON.
void WriteSteps(const Context& ctx, const ObjectRef& trace, const std::unordered_set<std::string>& kinds,
                std::unordered_map<const tvm::ffi::Object*, KindInfo>* kind_info, std::string* out) {
  Array<Any> insts = ctx.trace_insts(trace).cast<Array<Any>>();
  tvm::ffi::Map<Any, Any> decisions = ctx.trace_decisions(trace).cast<tvm::ffi::Map<Any, Any>>();
  Slots slots;
  size_t n_names = 0;
  size_t start = out->size();
  out->push_back('[');
  StepWriter w{ctx, out};
  bool first_step = true;
  for (const Any& inst_any : insts) {
    ObjectRef inst = inst_any.cast<ObjectRef>();
    ObjectRef kind_obj = ctx.inst_kind(inst).cast<ObjectRef>();
    String kind = ctx.kind_name(kind_obj).cast<String>();
    auto cached = kind_info->find(kind_obj.get());  // kinds are registered once: stable pointers
    if (cached == kind_info->end()) {
      std::string name(kind.data(), kind.size());
      KindInfo info{kinds.count(name) > 0, name == "SamplePerfectTile" || name == "SamplePartitionedTile",
                    name == "SampleCategorical"};
      cached = kind_info->emplace(kind_obj.get(), info).first;
    }
    const KindInfo& info = cached->second;
    if (!info.known) {
      out->resize(start);
      *out += "null";
      return;
    }
    if (!first_step) out->push_back(',');
    first_step = false;
    out->push_back('[');
    WriteString(kind, out);
    for (const Any& x : ctx.inst_inputs(inst).cast<Array<Any>>()) WriteInput(ctx, x, slots, &w, false);
    Array<Any> attrs = ctx.inst_attrs(inst).cast<Array<Any>>();
    for (const Any& a : attrs) w.Flatten(a);
    Array<Any> outputs = ctx.inst_outputs(inst).cast<Array<Any>>();
    bool loops = !outputs.empty() && outputs[0].type_index() == ctx.loop_rv;
    int64_t position = 0;
    for (const Any& o : outputs) {  // an instruction makes variables of one sort
      int32_t t = o.type_index();
      char prefix = t == ctx.block_rv ? 'b' : t == ctx.loop_rv ? 'l' : t == ctx.var ? 'v' : 0;
      if (!prefix) TVM_FFI_THROW(TypeError) << "an output of type index " << t << " in a trace";
      Slot& slot = slots[o.cast<ObjectRef>().get()];
      slot.prefix = prefix;
      slot.number = n_names++;
      slot.drop = !loops;
      slot.value = loops ? Any(position++) : Any();
    }
    auto decision = decisions.find(inst_any);
    if (decision != decisions.end() && (*decision).second.type_index() != kTVMFFINone) {
      const Any& d = (*decision).second;
      w.Flatten(d);
      if (info.tile && d.type_index() == kTVMFFIArray) {
        Array<Any> sampled = d.cast<Array<Any>>();
        for (size_t i = 0; i < outputs.size() && i < sampled.size(); ++i) {
          Slot& slot = slots[outputs[i].cast<ObjectRef>().get()];
          slot.drop = false;
          slot.value = sampled[i];
        }
      } else if (info.categorical && !attrs.empty() && !outputs.empty()) {
        Array<Any> candidates = attrs[0].cast<Array<Any>>();
        auto pick = AsInt(ctx, d);
        if (pick && *pick >= 0 && *pick < static_cast<int64_t>(candidates.size())) {
          Slot& slot = slots[outputs[0].cast<ObjectRef>().get()];
          slot.drop = false;
          slot.value = candidates[*pick];
        }
      }
    }
    out->push_back(']');
  }
  out->push_back(']');
}

String CandidateSteps(Array<Any> candidates, int64_t begin, int64_t end, Array<String> kind_names) {
  const Context& ctx = GetContext();
  std::unordered_set<std::string> kinds;
  for (const String& k : kind_names) kinds.emplace(k.data(), k.size());
  std::unordered_map<const tvm::ffi::Object*, KindInfo> kind_info;
  std::string out = "[";
  for (int64_t i = begin; i < end; ++i) {
    if (i > begin) out.push_back(',');
    Any sch = ctx.candidate_sch(candidates[i].cast<ObjectRef>());
    WriteSteps(ctx, ctx.get_trace(sch).cast<ObjectRef>(), kinds, &kind_info, &out);
  }
  out.push_back(']');
  return String(std::move(out));
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  tvm::ffi::reflection::GlobalDef()
      .def("tcl.CandidateSteps", CandidateSteps);
}
