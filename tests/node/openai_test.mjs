// The official `openai` npm client against a `cera serve` on the bundled model, as an application
// would use it: chat (plain and streamed), a reply's thinking as reasoning_content, text completions, the model list, embeddings where the
// server has the route, errors raised as the client's APIError subclasses with the right status,
// and a stream that the client aborts (the server logs the request as cancelled and goes on serving).
//
// node openai_test.mjs CERA_BIN
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer } from "./cera_server.mjs";

const ceraBin = process.argv[2];
const apiKey = "node-test-key";
let server, client;

before(async () => {
  server = await startServer(ceraBin, ["--api-key", apiKey, "--alias", "tiny", "--max-seqs", "4"]);
  client = new OpenAI({ apiKey, baseURL: server.url + "/v1", maxRetries: 0, timeout: 60000 });
});

after(async () => {
  assert.equal(await server.stop(), 0, "cera serve exits 0 on SIGTERM");
});

const question = [{ role: "user", content: "Once upon a time" }];

test("models lists the served model", async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, ["tiny"]);
  const m = await client.models.retrieve("tiny");
  assert.equal(m.id, "tiny");
  assert.equal(m.object, "model");
  await assert.rejects(client.models.retrieve("nope"), (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
});

test("chat completion", async () => {
  const r = await client.chat.completions.create({ model: "tiny", messages: question, max_tokens: 16, temperature: 0 });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.model, "tiny");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.ok(r.choices[0].message.content.length > 0);
  assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 16);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test("streamed chat gives the plain reply's text, then usage", async () => {
  const body = { model: "tiny", messages: question, max_tokens: 24, temperature: 0 };
  const plain = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = "", chunks = 0, finish = null, usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const c = chunk.choices[0];
    if (c.delta.content) {
      text += c.delta.content;
      chunks++;
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.ok(chunks > 1, "the text comes in several chunks");
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, plain.choices[0].finish_reason);
  assert.deepEqual(usage, plain.usage);
});

test("a reply's thinking comes as reasoning_content, plain and streamed", async () => {
  // llama.cpp's grammar field (passed through as is) makes the tiny model write a <think> block.
  const body = {
    model: "tiny", messages: question, max_tokens: 60, temperature: 0,
    grammar: 'root ::= "<think>" [a-z]{3,12} "</think>\\n\\n" [a-z]{2,10}',
  };
  const raw = await client.chat.completions.create({ ...body, reasoning_format: "none" });
  const m = raw.choices[0].message.content.match(/^<think>([a-z]*)<\/think>\n\n([a-z]*)$/);
  assert.ok(m, raw.choices[0].message.content);
  const plain = await client.chat.completions.create(body);
  assert.equal(plain.choices[0].message.reasoning_content, m[1]);
  assert.equal(plain.choices[0].message.content, m[2]);
  let reasoning = "", content = "";
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
    const d = chunk.choices.length ? chunk.choices[0].delta : {};
    if (d.reasoning_content) reasoning += d.reasoning_content;
    if (d.content) content += d.content;
  }
  assert.equal(reasoning, m[1]);
  assert.equal(content, m[2]);
});

test("text completion, plain and streamed", async () => {
  const body = { model: "tiny", prompt: "The little dog", max_tokens: 12, temperature: 0 };
  const r = await client.completions.create(body);
  assert.equal(r.object, "text_completion");
  assert.ok(r.choices[0].text.length > 0);
  let text = "";
  for await (const chunk of await client.completions.create({ ...body, stream: true })) text += chunk.choices[0]?.text ?? "";
  assert.equal(text, r.choices[0].text);
});

test("embeddings, where the server has the route", async (t) => {
  const probe = await fetch(server.url + "/v1/embeddings", {
    method: "POST",
    headers: { Authorization: "Bearer " + apiKey, "Content-Type": "application/json" },
    body: JSON.stringify({ model: "tiny", input: "hello" }),
  });
  if (probe.status === 404) {
    const body = await probe.json();
    if (body?.error?.message === "no such endpoint") return t.skip("this server has no /v1/embeddings");
  }
  const r = await client.embeddings.create({ model: "tiny", input: ["Once upon a time", "a red bird"] });
  assert.equal(r.data.length, 2);
  assert.equal(r.data[0].index, 0);
  assert.equal(r.data[1].index, 1);
  assert.ok(r.data[0].embedding.length > 0);
  assert.equal(r.data[0].embedding.length, r.data[1].embedding.length);
  assert.ok(r.data[0].embedding.every(Number.isFinite));
  assert.notDeepEqual(r.data[0].embedding, r.data[1].embedding);
  // base64 (the client's default when it asks for nothing) decodes to the same floats.
  const one = await client.embeddings.create({ model: "tiny", input: "Once upon a time" });
  const floats = await client.embeddings.create({ model: "tiny", input: "Once upon a time", encoding_format: "float" });
  assert.equal(one.data[0].embedding.length, floats.data[0].embedding.length);
  for (let i = 0; i < floats.data[0].embedding.length; i++)
    assert.ok(Math.abs(one.data[0].embedding[i] - floats.data[0].embedding[i]) < 1e-6);
});

test("an unknown model raises NotFoundError (404)", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "no-such-model", messages: question, max_tokens: 4 }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && /no-such-model/.test(e.message),
  );
});

test("a wrong key raises AuthenticationError (401)", async () => {
  const bad = new OpenAI({ apiKey: "wrong", baseURL: server.url + "/v1", maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});

test("a bad field raises BadRequestError (400)", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "tiny", messages: question, temperature: 7 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "temperature",
  );
});

test("aborting a stream cancels the request on the server", async () => {
  const controller = new AbortController();
  // ignore_eos keeps the reply going long enough to be cut part-way.
  const stream = await client.chat.completions.create(
    { model: "tiny", messages: question, max_tokens: 4000, temperature: 0, stream: true, ignore_eos: true },
    { signal: controller.signal },
  );
  let chunks = 0;
  try {
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta?.content && ++chunks === 5) {
        controller.abort();
        break;
      }
    }
  } catch (e) {
    // The client ends the iteration quietly on an abort, or raises its abort error.
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === "AbortError", String(e));
  }
  assert.equal(chunks, 5);
  // The server logs the request when it sees the client go away, with the tokens made until then.
  const m = await server.waitForLog(/request \d+ chat \d+: \d+ tokens in, (\d+) out,[^\n]*(client gone|cancelled)\n/);
  assert.ok(Number(m[1]) >= 5 && Number(m[1]) < 4000, "the server stopped generating: " + m[0]);
  // The server goes on answering.
  const r = await client.chat.completions.create({ model: "tiny", messages: question, max_tokens: 4, temperature: 0 });
  assert.ok(r.choices[0].message.content.length > 0);
});
