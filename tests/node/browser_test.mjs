// The chat page (GET /) in headless Chromium, driven over WebDriver (Debian's chromedriver; Node's
// own fetch speaks the protocol, so no npm package is needed), against a `cera serve` with an API
// key on the bundled model: the page loads without the key and asks for it; a message streams its
// reply into the page; Stop ends a long reply part-way; model text with markup and code fences is
// shown as text (no element, no script run) with the code in <pre><code>; copy, new chat, and no
// sideways scrolling at phone width. Screenshots go to OUT_DIR.
//
// node browser_test.mjs CERA_BIN OUT_DIR [VISION_MODEL MMPROJ IMAGE]
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import net from "node:net";
import { startServer } from "./cera_server.mjs";

const [ceraBin, outDir, visionModel, visionMmproj, visionImage] = process.argv.slice(2);
const apiKey = "page-key";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let server, driver, wd, session;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// One WebDriver command; the W3C protocol answers {value: ...}, with value.error on failure.
async function command(method, path, body) {
  const res = await fetch(wd + path, {
    method,
    headers: { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const j = await res.json();
  if (j.value && j.value.error) throw new Error(`${method} ${path}: ${j.value.error}: ${j.value.message}`);
  return j.value;
}
const s = (path) => `/session/${session}${path}`;
const run = (script, ...args) => command("POST", s("/execute/sync"), { script, args });
async function element(css) {
  const v = await command("POST", s("/element"), { using: "css selector", value: css });
  return Object.values(v)[0];
}
const click = async (css) => command("POST", s(`/element/${await element(css)}/click`), {});
const type = async (css, text) => command("POST", s(`/element/${await element(css)}/value`), { text });
async function waitFor(what, script, timeoutMs = 20000) {
  const t0 = Date.now();
  for (;;) {
    const v = await run(script);
    if (v) return v;
    if (Date.now() - t0 > timeoutMs) throw new Error("timed out waiting for " + what);
    await sleep(25);
  }
}
async function screenshot(name) {
  const png = await command("GET", s("/screenshot"));
  writeFileSync(`${outDir}/${name}.png`, Buffer.from(png, "base64"));
}
// The last assistant message: its state, its text as shown, and what the page keeps for Copy.
const lastReply = `const m = [...document.querySelectorAll('.msg.assistant')].pop();
  return m ? {state: m.dataset.state, shown: m.querySelector('.bubble').textContent, text: m.dataset.text,
              note: m.querySelector('.note').textContent} : null;`;

before(async () => {
  mkdirSync(outDir, { recursive: true });
  server = await startServer(ceraBin, ["--api-key", apiKey, "--alias", "tiny", "--max-seqs", "2"]);
  const port = await freePort();
  driver = spawn("chromedriver", [`--port=${port}`], { stdio: "ignore" });
  wd = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try {
      if ((await command("GET", "/status")).ready) break;
    } catch (e) {
      if (i > 200) throw e;
    }
    await sleep(50);
  }
  const caps = {
    browserName: "chrome",
    "goog:chromeOptions": {
      binary: "/usr/bin/chromium",
      args: ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1024,768"],
    },
  };
  session = (await command("POST", "/session", { capabilities: { alwaysMatch: caps } })).sessionId;
});

after(async () => {
  if (session) await command("DELETE", s("")).catch(() => {});
  if (driver) driver.kill();
  if (server) assert.equal(await server.stop(), 0);
});

test("the page loads without the key, asks for it, then shows the model", async () => {
  await command("POST", s("/url"), { url: server.url + "/" });
  assert.equal(await run("return document.title"), "cera chat");
  await waitFor("the key request", "return document.getElementById('model').textContent === 'needs an API key'");
  assert.equal(await run("return document.getElementById('settings').classList.contains('open')"), true);
  await type("#api-key", apiKey);
  await click("#input");  // leaving the field commits it
  await waitFor("the model name", "return document.getElementById('model').textContent === 'tiny'");
});

test("a message streams its reply into the page", async () => {
  await run("document.getElementById('temperature').value = '0'; document.getElementById('max-tokens').value = '48';");
  // The page records the reply's length at every change while it streams: it grows through several
  // lengths before it is done (the tiny model is too quick to sample from outside).
  await run(`window.__lengths = new Set();
    new MutationObserver(() => {
      const m = [...document.querySelectorAll('.msg.assistant')].pop();
      if (m && m.dataset.state === 'streaming') window.__lengths.add(m.dataset.text.length);
    }).observe(document.getElementById('messages'), {subtree: true, childList: true, attributes: true});`);
  await type("#input", "Once upon a time");
  await click("#send");
  const t0 = Date.now();
  let r;
  while ((r = await run(lastReply)) === null || r.state !== "done") {
    if (r && r.state === "error") assert.fail("the reply failed: " + r.note);
    if (Date.now() - t0 > 30000) assert.fail("no finished reply");
    await sleep(10);
  }
  const lengths = await run("return [...window.__lengths].filter((n) => n > 0).length");
  assert.ok(r.text.length > 0, "a reply came");
  assert.match(r.note, /tokens/);
  assert.equal(await run("return document.querySelectorAll('.msg.user').length"), 1);
  assert.equal(await run("return document.querySelector('.msg.user .bubble').textContent"), "Once upon a time");
  assert.equal(await run("return document.body.classList.contains('busy')"), false);
  // The page's reply is the API's reply for the same request.
  const api = await fetch(server.url + "/v1/chat/completions", {
    method: "POST",
    headers: { Authorization: "Bearer " + apiKey, "Content-Type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: "Once upon a time" }], temperature: 0, max_tokens: 48 }),
  }).then((x) => x.json());
  assert.equal(r.text, api.choices[0].message.content);
  console.log(`streamed reply seen at ${lengths} lengths while streaming`);
  assert.ok(lengths >= 2, "text appeared while the reply streamed");
  await screenshot("chat_page");
});

test("Stop ends a long reply part-way", async () => {
  // A reply of thousands of tokens: the test asks the API to ignore end-of-generation tokens.
  // The reply reaches the page a chunk every 20 ms, so that Stop lands while the page is streaming
  // however fast the server generates (a tiny model finishes thousands of tokens in a second or two).
  await run(`document.getElementById('max-tokens').value = '3000';
    const f = window.fetch;
    window.fetch = async (url, o) => {
      if (!String(url).endsWith('/chat/completions')) return f(url, o);
      const b = JSON.parse(o.body); b.ignore_eos = true; o = {...o, body: JSON.stringify(b)};
      const res = await f(url, o);
      const slow = new TransformStream({
        async transform(chunk, out) { await new Promise((r) => setTimeout(r, 20)); out.enqueue(chunk); },
      });
      return new Response(res.body.pipeThrough(slow), {status: res.status, headers: res.headers});
    };`);
  const mark = server.log.length;
  await type("#input", "Tell me a long story");
  await click("#send");
  await waitFor("streamed text", `const r = (() => { ${lastReply} })(); return r && r.state === 'streaming' && r.text.length > 20`);
  assert.equal(await run("return getComputedStyle(document.getElementById('stop')).display !== 'none'"), true);
  await click("#stop");
  const stopped = await waitFor("the stopped state", `const r = (() => { ${lastReply} })(); return r && r.state === 'stopped' ? r : null`);
  assert.equal(stopped.note, "stopped");
  await sleep(500);
  const later = await run(lastReply);
  assert.equal(later.text, stopped.text, "no text after Stop");
  // The server logs the request: ended where the page went away, or finished before that when it
  // generated faster than the page read.
  const t0 = Date.now();
  let line;
  while (!(line = server.log.slice(mark).match(/request \d+ chat \d+: \d+ tokens in, (\d+) out,[^\n]*\n/))) {
    if (Date.now() - t0 > 20000) throw new Error("no log line for the stopped request:\n" + server.log.slice(mark));
    await sleep(50);
  }
  if (/client gone|cancelled/.test(line[0])) assert.ok(Number(line[1]) < 3000, line[0]);
  assert.equal(await run("return document.body.classList.contains('busy')"), false);
  assert.equal(await run("return getComputedStyle(document.getElementById('send')).display !== 'none'"), true);
  await screenshot("chat_page_stopped");
});

test("model text is shown as text; code fences become <pre><code>", async () => {
  const reply = [
    "Here is <b>bold</b> and <img src=x onerror=\"window.__xss = 1\"> and `x < y`.",
    "",
    "```js",
    "const a = \"<script>window.__xss = 2</script>\";",
    "if (a && b) { f(); }",
    "```",
    "Done & **dusted**.",
  ].join("\n");
  // The reply comes through the page's own stream reader, split at awkward places.
  await run(`const reply = arguments[0];
    window.fetch = async () => {
      const enc = new TextEncoder();
      const pieces = reply.match(/[\\s\\S]{1,7}/g);
      const body = new ReadableStream({ start(c) {
        c.enqueue(enc.encode('data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\\n\\n'));
        for (const p of pieces) c.enqueue(enc.encode('data: ' + JSON.stringify({choices: [{index: 0, delta: {content: p}}]}) + '\\n\\n'));
        c.enqueue(enc.encode('data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\\n\\ndata: [DONE]\\n\\n'));
        c.close();
      }});
      return new Response(body, {status: 200, headers: {'Content-Type': 'text/event-stream'}});
    };`, reply);
  await type("#input", "Show me markup");
  await click("#send");
  const r = await waitFor("the rendered reply", `const r = (() => { ${lastReply} })(); return r && r.state === 'done' ? r : null`);
  assert.equal(r.text, reply, "the page keeps the text as it came");
  const dom = await run(`const b = [...document.querySelectorAll('.msg.assistant .bubble')].pop();
    return { img: b.querySelectorAll('img, script, b').length, pre: b.querySelectorAll('pre > code').length,
             code: b.querySelector('pre > code').textContent, lang: b.querySelector('pre').dataset.lang,
             inline: [...b.querySelectorAll(':not(pre) > code')].map((c) => c.textContent),
             strong: [...b.querySelectorAll('strong')].map((c) => c.textContent),
             p: [...b.querySelectorAll('p')].map((p) => p.textContent), xss: window.__xss === undefined ? null : window.__xss };`);
  assert.equal(dom.img, 0, "no element from the model's text");
  assert.equal(dom.xss, null, "no script ran");
  assert.equal(dom.pre, 1);
  assert.equal(dom.lang, "js");
  assert.equal(dom.code, "const a = \"<script>window.__xss = 2</script>\";\nif (a && b) { f(); }");
  assert.deepEqual(dom.inline, ["x < y"]);
  assert.deepEqual(dom.strong, ["dusted"]);
  assert.equal(dom.p[0], "Here is <b>bold</b> and <img src=x onerror=\"window.__xss = 1\"> and x < y.");
  assert.equal(dom.p[dom.p.length - 1], "Done & dusted.");
  await screenshot("chat_page_markdown");
});

test("a reply's reasoning shows apart, folded once the answer starts", async () => {
  const reasoning = "The user asks <why>.\nStep two.";
  const answer = "Because.";
  await run(`const [reasoning, answer] = arguments;
    window.fetch = async () => {
      const enc = new TextEncoder();
      const ev = (delta) => enc.encode('data: ' + JSON.stringify({choices: [{index: 0, delta}]}) + '\\n\\n');
      const body = new ReadableStream({ async start(c) {
        c.enqueue(ev({role: 'assistant', content: ''}));
        for (const p of reasoning.match(/[\\s\\S]{1,5}/g)) c.enqueue(ev({reasoning_content: p}));
        await new Promise((r) => setTimeout(r, 300));
        for (const p of answer.match(/[\\s\\S]{1,3}/g)) c.enqueue(ev({content: p}));
        c.enqueue(enc.encode('data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\\n\\ndata: [DONE]\\n\\n'));
        c.close();
      }});
      return new Response(body, {status: 200, headers: {'Content-Type': 'text/event-stream'}});
    };`, reasoning, answer);
  const thinking = `const m = [...document.querySelectorAll('.msg.assistant')].pop();
    const t = m && m.querySelector('.thinking');
    return t ? {hidden: t.hidden, open: t.open, text: t.querySelector('.text').textContent,
                elements: t.querySelector('.text').children.length} : null;`;
  await type("#input", "Why?");
  await click("#send");
  const during = await waitFor("the reasoning", `const t = (() => { ${thinking} })(); return t && t.text === arguments[0] ? t : null`.replace("arguments[0]", JSON.stringify(reasoning)));
  assert.equal(during.hidden, false);
  assert.equal(during.open, true, "open while it thinks");
  assert.equal(during.elements, 0, "shown as text");
  const r = await waitFor("the answer", `const r = (() => { ${lastReply} })(); return r && r.state === 'done' ? r : null`);
  assert.equal(r.text, answer, "the reply is the answer alone");
  assert.equal(r.shown.trim(), answer);
  const after = await run(thinking);
  assert.equal(after.text, reasoning);
  assert.equal(after.open, false, "folded once the answer came");
  await screenshot("chat_page_reasoning");
});

test("copy and new chat", async () => {
  await run("[...document.querySelectorAll('.msg.assistant .copy')].pop().click()");
  await waitFor("the copied mark", "return [...document.querySelectorAll('.msg.assistant .copy')].pop().textContent === 'Copied'");
  await click("#new-chat");
  assert.equal(await run("return document.querySelectorAll('.msg').length"), 0);
  assert.equal(await run("return getComputedStyle(document.getElementById('empty')).display !== 'none'"), true);
});

test("at phone width nothing scrolls sideways", async () => {
  await command("POST", s("/window/rect"), { width: 380, height: 760 });
  await command("POST", s("/refresh"), {});
  await waitFor("the model name", "return document.getElementById('model').textContent === 'tiny'");
  await run("document.getElementById('max-tokens').value = '40'; document.getElementById('temperature').value = '0';");
  await type("#input", "A message that is long enough to wrap over several lines at this width, with a_very_long_unbroken_word_that_must_wrap_too");
  await click("#send");
  await waitFor("the reply", `const r = (() => { ${lastReply} })(); return r && r.state === 'done'`);
  const w = await run("return {scroll: document.documentElement.scrollWidth, inner: window.innerWidth}");
  assert.ok(w.scroll <= w.inner, `page width ${w.scroll} > window ${w.inner}`);
  await screenshot("chat_page_narrow");
});

test("a refused request shows its error where the reply would be", async () => {
  await run("document.getElementById('api-key').value = 'wrong-key'; document.getElementById('settings').classList.remove('open');");
  await type("#input", "Hello?");
  await click("#send");
  const r = await waitFor("the error", `const r = (() => { ${lastReply} })(); return r && r.state === 'error' ? r : null`);
  assert.match(r.note, /invalid API key \(401\)/);
  assert.equal(await run("return document.getElementById('settings').classList.contains('open')"), true);
  assert.equal(await run("return document.body.classList.contains('busy')"), false);
});

// With a vision model (the LFM2-VL fixture and its projector, given as arguments), the page offers
// "+ Image": an attached file shows as a thumbnail, goes with the next message as an image_url part
// (a data: URL), and the reply is the API's reply to the same message with the same image. A text
// model's page does not offer it.
test("an attached image goes with the message", { skip: !visionModel && "no vision fixture given" }, async () => {
  assert.equal(await run("return getComputedStyle(document.getElementById('attach')).display"), "none");
  const vision = await startServer(ceraBin, ["-m", visionModel, "--mmproj", visionMmproj, "--alias", "vl", "--ctx", "512"]);
  try {
    await command("POST", s("/window/rect"), { width: 1024, height: 768 });
    await command("POST", s("/url"), { url: vision.url + "/" });
    await run("document.getElementById('api-key').value = ''; localStorage.clear();");
    await command("POST", s("/refresh"), {});
    await waitFor("the model name", "return document.getElementById('model').textContent === 'vl'");
    assert.notEqual(await run("return getComputedStyle(document.getElementById('attach')).display"), "none");
    await run("document.getElementById('temperature').value = '0'; document.getElementById('max-tokens').value = '24';");
    await type("#image-input", visionImage);  // WebDriver sets a file input's files from a path
    await waitFor("the thumbnail", "return document.querySelectorAll('#attachments img').length === 1");
    await type("#input", "What is in the picture?");
    await click("#send");
    const r = await waitFor("the reply", `const r = (() => { ${lastReply} })(); return r && (r.state === 'done' || r.state === 'error') ? r : null`, 60000);
    assert.equal(r.state, "done", r.note);
    assert.equal(await run("return document.querySelectorAll('.msg.user .bubble img').length"), 1);
    assert.equal(await run("return document.querySelectorAll('#attachments img').length"), 0);
    await screenshot("chat_page_image");
    const url = "data:image/png;base64," + readFileSync(visionImage).toString("base64");
    const api = await fetch(vision.url + "/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        messages: [{ role: "user", content: [{ type: "image_url", image_url: { url } }, { type: "text", text: "What is in the picture?" }] }],
        temperature: 0, max_tokens: 24,
      }),
    }).then((x) => x.json());
    assert.equal(r.text, api.choices[0].message.content);
  } finally {
    assert.equal(await vision.stop(), 0);
  }
});
