// The steps of a batch of MetaSchedule candidates in one call:
// `tcl.CandidateSteps(candidates, begin, end, kinds) -> str`, a JSON array with, per candidate in
// [begin, end), the steps `tcl.records.metaschedule.trace_to_steps` makes of its trace's JSON
// (the JSON a database line holds), or null where an instruction kind is not in `kinds`.
//
// From Python, each FFI value of a trace costs its own call (hundreds a trace); here the trace's
// JSON (TVM's TraceAsJSON) is walked in C++ and only the steps' text crosses over, to be parsed
// by orjson. Built against the TVM FFI headers only: the TVM objects met in a trace's JSON
// (IntImm, FloatImm, IndexMap) are recognised by type key and read through the FFI's
// reflection; an IndexMap is written as the string "<IndexMap>" (see Write). The FFI releases
// the GIL during the call, so two threads take a half of a batch each.
//
// Loaded by tcl/tuner/traces.py with ctypes; registering the function is the library's static
// initialiser. tests/test_tuner.py checks its steps against those ingest reads from a database.

#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/accessor.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

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
  Function get_trace = Function::GetGlobalRequired("s_tir.schedule.ScheduleGetTrace");
  Function trace_as_json = Function::GetGlobalRequired("s_tir.schedule.TraceAsJSON");
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
    case kTVMFFIInt: *out += std::to_string(value.cast<int64_t>()); return;
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
    *out += std::to_string(ctx.int_value(obj).cast<int64_t>());
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

bool LooksLikeVariable(std::string_view s) {  // ^[a-z]\d+$
  if (s.size() < 2 || s[0] < 'a' || s[0] > 'z') return false;
  for (size_t i = 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}

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
  bool drop = false;
  Any value;
};

// Steps of one trace's JSON as a JSON list, or `null` for an unknown instruction kind.
void WriteSteps(const Context& ctx, const Array<Any>& trace, const std::unordered_set<std::string>& kinds,
                std::string* out) {
  Array<Any> insts = trace[0].cast<Array<Any>>();
  std::unordered_map<int64_t, Any> decided;
  for (const Any& d : trace[1].cast<Array<Any>>()) {
    Array<Any> pair = d.cast<Array<Any>>();
    if (auto index = AsInt(ctx, pair[0])) decided[*index] = pair[1];
  }
  std::unordered_map<std::string, Slot> values;
  size_t start = out->size();
  out->push_back('[');
  StepWriter w{ctx, out};
  for (int64_t index = 0; index < static_cast<int64_t>(insts.size()); ++index) {
    Array<Any> inst = insts[index].cast<Array<Any>>();
    String kind = inst[0].cast<String>();
    std::string kind_name(kind.data(), kind.size());
    if (!kinds.count(kind_name)) {
      out->resize(start);
      *out += "null";
      return;
    }
    if (index) out->push_back(',');
    out->push_back('[');
    WriteString(kind, out);
    for (const Any& x : inst[1].cast<Array<Any>>()) {
      if (IsString(x)) {
        String name = x.cast<String>();
        std::string key(name.data(), name.size());
        auto found = values.find(key);
        if (found != values.end()) {
          if (!found->second.drop) w.Item(found->second.value);
        } else if (!LooksLikeVariable(key)) {
          w.Item(x);
        }
      } else if (x.type_index() == kTVMFFIArray) {
        w.Flatten(x);
      } else {
        w.Item(x);
      }
    }
    Array<Any> attrs = inst[2].cast<Array<Any>>();
    for (const Any& a : attrs) w.Flatten(a);
    Array<Any> outputs = inst[3].cast<Array<Any>>();
    if (!outputs.empty()) {  // an instruction makes variables of one sort: loops, blocks or exprs
      String first = outputs[0].cast<String>();
      bool loops = first.size() && first.data()[0] == 'l';
      int64_t position = 0;
      for (const Any& o : outputs) {
        String name = o.cast<String>();
        Slot& slot = values[std::string(name.data(), name.size())];
        slot.drop = !loops;
        slot.value = loops ? Any(position++) : Any();
      }
    }
    auto decision = decided.find(index);
    if (decision != decided.end() && decision->second.type_index() != kTVMFFINone) {
      const Any& d = decision->second;
      w.Flatten(d);
      bool is_list = d.type_index() == kTVMFFIArray;
      if ((kind_name == "SamplePerfectTile" || kind_name == "SamplePartitionedTile") && is_list) {
        Array<Any> sampled = d.cast<Array<Any>>();
        for (size_t i = 0; i < outputs.size() && i < sampled.size(); ++i) {
          String name = outputs[i].cast<String>();
          values[std::string(name.data(), name.size())] = Slot{false, sampled[i]};
        }
      } else if (kind_name == "SampleCategorical" && !attrs.empty() && !outputs.empty()) {
        Array<Any> candidates = attrs[0].cast<Array<Any>>();
        auto pick = AsInt(ctx, d);
        if (pick && *pick >= 0 && *pick < static_cast<int64_t>(candidates.size())) {
          String name = outputs[0].cast<String>();
          values[std::string(name.data(), name.size())] = Slot{false, candidates[*pick]};
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
  std::string out = "[";
  for (int64_t i = begin; i < end; ++i) {
    if (i > begin) out.push_back(',');
    Any sch = ctx.candidate_sch(candidates[i].cast<ObjectRef>());
    Any trace = ctx.get_trace(sch);
    WriteSteps(ctx, ctx.trace_as_json(trace, false).cast<Array<Any>>(), kinds, &out);
  }
  out.push_back(']');
  return String(std::move(out));
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  tvm::ffi::reflection::GlobalDef()
      .def("tcl.CandidateSteps", CandidateSteps);
}
