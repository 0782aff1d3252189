// Grammars that make a model's output a valid tool call in its format (chat/tool_calls.h), with
// arguments that the tool's `parameters` JSON Schema accepts:
//
//   LFM2      <|tool_call_start|>[get_weather(city="Paris", days=3), ...]<|tool_call_end|>
//             (keyword arguments in the schema's property order; a `parameters` schema that is not a
//             plain object of properties is written as the JSON form [{"name": ..., "arguments": ...}])
//   Hermes    <tool_call>\n{"name": "get_weather", "arguments": {...}}\n</tool_call>   (repeated, one per line)
//   Llama 3   {"name": "get_weather", "parameters": {...}}   (several separated by "; ")
//   Granite   <|tool_call|>[{"name": "get_weather", "arguments": {...}}, ...]
//
// tool_choice "required" and a named function constrain the output from its first byte; "auto" gives
// a lazy grammar (cera::Grammar::lazy) whose trigger is the format's opening marker, so the model
// writes free text until it starts a call.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cera/grammar.h"
#include "chat/tool_calls.h"

namespace cera {

// One function the model may call: its name ([A-Za-z0-9_-], 1 to 64 characters, as OpenAI allows)
// and its parameters as JSON Schema text ("" for none: no arguments).
struct ToolDef {
    std::string name;
    std::string parameters_json;
};

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolGrammarOptions {
    ToolChoice choice = ToolChoice::kAuto;
    std::string function;  // kNamed: the one function to call
    bool parallel = true;  // false: exactly one call
};

// The GBNF of the calls (root rule `root`; every call of the output matches one tool's schema).
// Throws cera::Error: kInvalidArgument for a bad name, an unknown named function or no tools,
// kUnsupported / kParse / kInvalidArgument for a parameters schema outside the JSON Schema subset
// (the message names the tool).
std::string tool_call_gbnf(ToolCallFormat format, const std::vector<ToolDef>& tools, const ToolGrammarOptions& options);

// The grammar for a request: null for kNone; lazy (triggered by the format's opening text) for kAuto;
// from the first byte for kRequired and kNamed.
std::shared_ptr<const Grammar> tool_call_grammar(ToolCallFormat format, const std::vector<ToolDef>& tools,
                                                 const ToolGrammarOptions& options);

// The text a lazy tool grammar waits for in a format (Llama 3's plain JSON calls start with {"name").
const char* tool_call_grammar_trigger(ToolCallFormat format);

}  // namespace cera
