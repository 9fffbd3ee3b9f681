// The JSON text a MetaSchedule database line holds for each candidate's trace, for a whole
// batch in one call: `tcl.CandidateTracesJSON(candidates, begin, end) -> str`, a JSON array of
// `[instructions, decisions]`, one per candidate in [begin, end); an IndexMap attribute is written
// as the string "<IndexMap>" (see Write).
//
// Python reaches each FFI value of a trace by its own call (hundreds a trace); here the values
// are walked in C++ and only the text crosses over, to be parsed by orjson. Built against the
// TVM FFI headers only: the TVM objects met in a trace's JSON (IntImm, FloatImm, IndexMap) are
// recognised by type key and read through the FFI's reflection. The caller's thread
// does not hold the GIL meanwhile (the FFI releases it), so two threads convert two halves.
//
// Loaded by tcl/tuner/traces.py with ctypes; registering the function is the library's static
// initialiser.

#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/accessor.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <cstdio>
#include <string>

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

String CandidateTracesJSON(Array<Any> candidates, int64_t begin, int64_t end) {
  const Context& ctx = GetContext();
  std::string out = "[";
  for (int64_t i = begin; i < end; ++i) {
    if (i > begin) out.push_back(',');
    Any sch = ctx.candidate_sch(candidates[i].cast<ObjectRef>());
    Any trace = ctx.get_trace(sch);
    Write(ctx, ctx.trace_as_json(trace, false), &out);
  }
  out.push_back(']');
  return String(std::move(out));
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  tvm::ffi::reflection::GlobalDef().def("tcl.CandidateTracesJSON", CandidateTracesJSON);
}
