#!/usr/bin/env python3
"""Cross-checks the expected renderings in expected/ with Python's jinja2, set up
the way Hugging Face transformers renders chat templates (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, a no-op {% generation %} block, tojson as
json.dumps(ensure_ascii=False), raise_exception, strftime_now).

    python3 make_expected.py           # compare, report differences
    python3 make_expected.py --write   # (re)write expected/*.txt
"""
import json
import os
import sys
from datetime import datetime, timezone

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


class GenerationTag(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(now, timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def message_value(m):
    """The dict a template sees for one message (as ChatTemplate::render builds it)."""
    v = {"role": m["role"], "content": m["content"]}
    if m.get("tool_calls"):
        calls = []
        for c in m["tool_calls"]:
            call = {}
            if c.get("id"):
                call["id"] = c["id"]
            call["type"] = "function"
            try:
                args = json.loads(c["arguments"])
            except ValueError:
                args = c["arguments"]
            call["function"] = {"name": c["name"], "arguments": args}
            calls.append(call)
        v["tool_calls"] = calls
    for key in ("tool_call_id", "name", "reasoning_content"):
        if m.get(key):
            v[key] = m[key]
    return v


def render(case, data):
    opts = case.get("options", {})
    now = opts.get("now", 1721952000)
    env = make_env(now)
    with open(os.path.join(HERE, case["template"]), encoding="utf-8") as f:
        tmpl = env.from_string(f.read())
    ctx = {
        "messages": [message_value(m) for m in data["conversations"][case["conversation"]]],
        "add_generation_prompt": opts.get("add_generation_prompt", True),
        "bos_token": opts.get("bos_token", ""),
        "eos_token": opts.get("eos_token", ""),
    }
    if "tools" in case:
        ctx["tools"] = data["tools"][case["tools"]]
    if opts.get("date_string"):
        ctx["date_string"] = opts["date_string"]
    for k, v in opts.get("kwargs", {}).items():
        ctx[k] = {"true": True, "false": False}.get(v, v)
    return tmpl.render(**ctx)


def main():
    write = "--write" in sys.argv
    with open(os.path.join(HERE, "conversations.json"), encoding="utf-8") as f:
        data = json.load(f)
    bad = 0
    for case in data["cases"]:
        out = render(case, data)
        path = os.path.join(HERE, "expected", case["name"] + ".txt")
        if write:
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(out)
            continue
        with open(path, encoding="utf-8", newline="") as f:
            if f.read() != out:
                print("DIFFERS:", case["name"])
                bad += 1
    print("%d cases, %d differ" % (len(data["cases"]), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
