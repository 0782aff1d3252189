// Tool calling through the official `openai` npm client, on two models whose own output is not tool
// calls (the bundled tiny LFM2 and a random-weight Qwen2 fixture): the grammar is what makes every
// call valid. Across seeds at temperature 1, with tool_choice "required" and a named function, every
// reply has tool calls whose arguments parse as JSON and validate (ajv) against the tool's parameters
// schema, with finish_reason "tool_calls"; streamed and plain replies give the same calls for a seed;
// tool_choice "none" gives plain content; malformed tools are a 400 naming the problem.
//
// node tools_test.mjs CERA_BIN QWEN2_FIXTURE_GGUF QWEN25_TEMPLATE
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import OpenAI from "openai";
import Ajv from "ajv";
import { startServer } from "./cera_server.mjs";

const [ceraBin, qwenModel, qwenTemplate] = process.argv.slice(2);
const servers = {};
const clients = {};

before(async () => {
  servers.lfm2 = await startServer(ceraBin, ["--alias", "tiny", "--max-seqs", "4"]);
  if (qwenModel && existsSync(qwenModel))
    servers.hermes = await startServer(ceraBin, ["-m", qwenModel, "--chat-template", qwenTemplate, "--alias", "tiny"]);
  for (const [k, s] of Object.entries(servers))
    clients[k] = new OpenAI({ apiKey: "x", baseURL: s.url + "/v1", maxRetries: 0, timeout: 120000 });
});

after(async () => {
  for (const s of Object.values(servers)) assert.equal(await s.stop(), 0);
});

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", minLength: 1, maxLength: 16 },
          days: { type: "integer", minimum: 1, maximum: 7 },
          unit: { enum: ["celsius", "fahrenheit"] },
        },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "add_event",
      parameters: {
        type: "object",
        properties: {
          title: { type: "string", maxLength: 24 },
          when: { type: "string", format: "date" },
          guests: { type: "array", items: { $ref: "#/$defs/guest" }, maxItems: 2 },
        },
        required: ["title", "when"],
        $defs: {
          guest: {
            type: "object",
            properties: { name: { type: "string", maxLength: 10 }, vip: { type: "boolean" } },
            required: ["name"],
          },
        },
      },
    },
  },
];
const ajv = new Ajv({ strict: false });
ajv.addFormat("date", /^\d{4}-\d{2}-\d{2}$/);
const validators = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
const messages = [{ role: "user", content: "What is the weather in Paris, and add a picnic on Sunday." }];
const seeds = [1, 2, 3, 4, 5, 6];

function checkCalls(msg, finish, only) {
  assert.equal(finish, "tool_calls", JSON.stringify(msg));
  assert.ok(msg.tool_calls?.length >= 1, JSON.stringify(msg));
  for (const c of msg.tool_calls) {
    assert.equal(c.type, "function");
    assert.match(c.id, /^call_/);
    if (only) assert.equal(c.function.name, only);
    const validate = validators[c.function.name];
    assert.ok(validate, "a known tool: " + c.function.name);
    const args = JSON.parse(c.function.arguments);
    assert.ok(validate(args), `${c.function.arguments}: ${ajv.errorsText(validate.errors)}`);
  }
}

// A streamed reply put together: content, calls by index, finish reason, and how many argument
// fragments came (they come as the arguments are written, not all at the end).
async function streamed(client, body) {
  const out = { content: "", calls: [], finish: null, fragments: 0 };
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.content) out.content += c.delta.content;
    for (const d of c.delta.tool_calls ?? []) {
      if (d.id) {
        assert.equal(d.index, out.calls.length, "a call's first delta comes once, in order");
        assert.equal(d.type, "function");
        out.calls.push({ id: d.id, type: "function", function: { name: d.function.name, arguments: "" } });
      }
      if (d.function?.arguments) {
        out.calls[d.index].function.arguments += d.function.arguments;
        out.fragments++;
      }
    }
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}

for (const model of ["lfm2", "hermes"]) {
  test(`${model}: tool_choice required and named give valid calls, streamed as plain`, async (t) => {
    const client = clients[model];
    if (!client) return t.skip("the Qwen2 fixture is not unpacked");
    let checked = 0;
    for (const seed of seeds) {
      for (const tool_choice of ["required", { type: "function", function: { name: "add_event" } }]) {
        const body = {
          model: "tiny",
          messages,
          tools,
          tool_choice,
          parallel_tool_calls: seed % 2 === 0,
          temperature: 1,
          seed,
          max_tokens: 400,
        };
        const r = await client.chat.completions.create(body);
        const msg = r.choices[0].message;
        const only = typeof tool_choice === "object" ? "add_event" : undefined;
        if (r.choices[0].finish_reason === "length") {
          assert.ok(body.parallel_tool_calls, "one call always ends: " + JSON.stringify(msg));
          continue;  // parallel calls may go on to max_tokens: the reply is then cut off
        }
        checkCalls(msg, r.choices[0].finish_reason, only);
        if (!body.parallel_tool_calls) assert.equal(msg.tool_calls.length, 1);
        const s = await streamed(client, body);
        assert.equal(s.finish, r.choices[0].finish_reason);
        assert.equal(s.content, msg.content ?? "");
        assert.deepEqual(
          s.calls.map((c) => [c.function.name, c.function.arguments]),
          msg.tool_calls.map((c) => [c.function.name, c.function.arguments]),
        );
        assert.ok(s.fragments >= 2, "arguments stream in several fragments");
        checked++;
      }
    }
    assert.ok(checked >= seeds.length, `${checked} replies checked`);
  });

  test(`${model}: tool_choice auto gives text, or text and valid calls, never call markup as content`, async (t) => {
    const client = clients[model];
    if (!client) return t.skip("the Qwen2 fixture is not unpacked");
    for (const seed of seeds) {
      const body = { model: "tiny", messages, tools, temperature: 1, seed, max_tokens: 60, parallel_tool_calls: false };
      const r = await client.chat.completions.create(body);
      const msg = r.choices[0].message;
      if (msg.tool_calls) checkCalls(msg, r.choices[0].finish_reason);
      else assert.doesNotMatch(msg.content, /<\|tool_call_start\|>|<tool_call>/, "a started call ends valid");
      const s = await streamed(client, body);
      assert.equal(s.content, msg.content ?? "");
      assert.equal(s.calls.length, msg.tool_calls?.length ?? 0);
    }
  });

  test(`${model}: several choices stream their calls apart`, async (t) => {
    const client = clients[model];
    if (!client) return t.skip("the Qwen2 fixture is not unpacked");
    const body = {
      model: "tiny", messages, tools, tool_choice: "required", parallel_tool_calls: false, n: 3, temperature: 1,
      seed: 11, max_tokens: 400,
    };
    const r = await client.chat.completions.create(body);
    const calls = [[], [], []];
    for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
      for (const c of chunk.choices) {
        for (const d of c.delta.tool_calls ?? []) {
          if (d.id) calls[c.index].push({ name: d.function.name, arguments: "" });
          if (d.function?.arguments) calls[c.index][d.index].arguments += d.function.arguments;
        }
      }
    }
    for (const c of r.choices) {
      checkCalls(c.message, c.finish_reason);
      assert.deepEqual(calls[c.index], c.message.tool_calls.map((x) => ({ name: x.function.name, arguments: x.function.arguments })));
    }
  });

  test(`${model}: tool_choice none gives plain content`, async (t) => {
    const client = clients[model];
    if (!client) return t.skip("the Qwen2 fixture is not unpacked");
    const r = await client.chat.completions.create({
      model: "tiny", messages, tools, tool_choice: "none", max_tokens: 12, temperature: 1, seed: 1,
    });
    assert.equal(r.choices[0].message.tool_calls, undefined);
    assert.equal(typeof r.choices[0].message.content, "string");
    assert.notEqual(r.choices[0].finish_reason, "tool_calls");
  });
}

test("hermes: the tools go into the model's template (Qwen2.5's own tools section)", async (t) => {
  const client = clients.hermes;
  if (!client) return t.skip("the Qwen2 fixture is not unpacked");
  const base = { model: "tiny", max_tokens: 1, temperature: 0 };
  const plain = await client.chat.completions.create({ ...base, messages });
  const withTools = await client.chat.completions.create({ ...base, messages, tools });
  const none = await client.chat.completions.create({ ...base, messages, tools, tool_choice: "none" });
  assert.ok(withTools.usage.prompt_tokens > plain.usage.prompt_tokens + 50, "the tool definitions are in the prompt");
  assert.equal(none.usage.prompt_tokens, plain.usage.prompt_tokens, "tool_choice none leaves them out");
  // An assistant's call and the tool's answer, sent back as OpenAI clients send them, render too.
  const history = [
    ...messages,
    { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
    { role: "tool", tool_call_id: "call_1", content: "sunny, 24 C" },
  ];
  const after = await client.chat.completions.create({ ...base, messages: history, tools });
  assert.ok(after.usage.prompt_tokens > withTools.usage.prompt_tokens + 10);
});

test("malformed tools are a 400 naming the problem", async () => {
  const client = clients.lfm2;
  const bad = [
    [{ tools: { get_weather: {} } }, /'tools' must be a non-empty list/],
    [{ tools: [{ type: "function", function: { parameters: {} } }] }, /needs a 'function.name'/],
    [{ tools: [{ type: "function", function: { name: "bad name!" } }] }, /tool name 'bad name!'/],
    [{ tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { a: { type: "strng" } } } } }] }, /tool 'f' parameters/],
    [{ tools: [{ type: "function", function: { name: "f", parameters: "{}" } }] }, /must be a JSON Schema object/],
    [{ tools, tool_choice: { type: "function", function: { name: "nope" } } }, /'nope'/],
    [{ tools, tool_choice: "sometimes" }, /'tool_choice' must be/],
    [{ tool_choice: "required" }, /'tool_choice' needs 'tools'/],
  ];
  for (const [extra, re] of bad) {
    await assert.rejects(
      client.chat.completions.create({ model: "tiny", messages, max_tokens: 4, ...extra }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && re.test(e.message),
      JSON.stringify(extra),
    );
  }
});
