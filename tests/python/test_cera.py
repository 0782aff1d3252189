"""The Python module `cera` (src/python), run by CTest with Debian's python3.

CERA_TEST_MODEL names the model, CERA_BIN the cera binary whose `run` output greedy generation must
equal; CERA_TESTDATA the unpacked test data (fixtures with LoRA adapters and a vision model, and their
transformers references); PYTHONPATH holds the module.
"""
import json
import os
import pathlib
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import cera

MODEL = os.environ["CERA_TEST_MODEL"]
CERA_BIN = os.environ["CERA_BIN"]
TESTDATA = os.environ.get("CERA_TESTDATA", "")


def fixture(rel):
    return os.path.join(TESTDATA, "fixtures", rel)


def cera_run(model, prompt, n, *flags):
    out = subprocess.run([CERA_BIN, "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "--threads", "1",
                          *flags], capture_output=True, check=True, stdin=subprocess.DEVNULL)
    return out.stdout.decode()


class EngineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.engine = cera.Engine(MODEL, device="cpu", threads=1)

    def cera_run(self, prompt, n):
        return cera_run(MODEL, prompt, n)

    def test_greedy_generate_equals_cera_run(self):
        for prompt in ["Once upon a time", "The cat sat"]:
            got = self.engine.generate(prompt, max_tokens=40, temperature=0)
            self.assertTrue(got)
            self.assertEqual(got, self.cera_run(prompt, 40))

    def test_stream_pieces_join_to_generate(self):
        want = self.engine.generate("Once upon a time", max_tokens=32, temperature=0)
        pieces = list(self.engine.stream("Once upon a time", max_tokens=32, temperature=0))
        self.assertGreater(len(pieces), 1)
        self.assertEqual("".join(pieces), want)
        # Leaving a stream early cancels it.
        s = self.engine.stream("Once upon a time", max_tokens=-1, temperature=0, ignore_eos=True)
        next(s)
        s.close()

    def test_sampling_options(self):
        a = self.engine.generate("Once upon a time", max_tokens=24, temperature=1.0, top_p=0.9, top_k=20,
                                 min_p=0.0, seed=7)
        b = self.engine.generate("Once upon a time", max_tokens=24, temperature=1.0, top_p=0.9, top_k=20,
                                 min_p=0.0, seed=7)
        self.assertEqual(a, b)
        full = self.engine.generate("Once upon a time", max_tokens=32, temperature=0)
        stop = full[5:8]
        cut = self.engine.generate("Once upon a time", max_tokens=32, temperature=0, stop=[stop])
        self.assertEqual(cut, full[:full.index(stop)])
        with self.assertRaises(cera.Error) as ctx:
            self.engine.generate("x", temperature=1.0, top_p=-1.0)
        self.assertEqual(ctx.exception.code, "invalid argument")

    def test_structured_output_equals_cera_run(self):
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                   "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                  "required": ["name", "age"], "additionalProperties": False}
        got = self.engine.generate("Once upon a time", max_tokens=60, temperature=0, json_schema=schema)
        value = json.loads(got)
        self.assertEqual(set(value), {"name", "age"})
        self.assertTrue(0 <= value["age"] <= 120)
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(schema, f)
            f.flush()
            self.assertEqual(got, cera_run(MODEL, "Once upon a time", 60, "--json-schema", f.name))
        self.assertEqual(self.engine.generate("Once upon a time", max_tokens=60, temperature=0,
                                              json_schema=json.dumps(schema)), got)
        gbnf = 'root ::= ("yes" | "no") " " [a-z]{1,8}'
        answer = self.engine.generate("Is it?", max_tokens=12, temperature=0, grammar=gbnf)
        self.assertRegex(answer, r"^(yes|no) [a-z]{1,8}$")
        self.assertEqual(answer, cera_run(MODEL, "Is it?", 12, "--grammar", gbnf))
        self.assertEqual("".join(self.engine.stream("Is it?", max_tokens=12, temperature=0, grammar=gbnf)), answer)
        for kwargs, code in [({"grammar": gbnf, "json_schema": schema}, "invalid argument"),
                             ({"json_schema": {"type": "object", "patternProperties": {"^a": {}}}}, "unsupported"),
                             ({"json_schema": "{nope"}, "parse error"),
                             ({"grammar": "root ::= missing"}, "parse error")]:
            with self.assertRaises(cera.Error) as ctx:
                self.engine.generate("x", max_tokens=4, **kwargs)
            self.assertEqual(ctx.exception.code, code, kwargs)

    def test_prompt_lookup_keeps_greedy_output(self):
        prompt = "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog"
        plain = self.engine.generate(prompt, max_tokens=40, temperature=0)
        self.assertEqual(self.engine.generate(prompt, max_tokens=40, temperature=0, lookup_ngram=3), plain)
        self.assertEqual(cera_run(MODEL, prompt, 40, "--lookup-ngram", "3"), plain)

    def test_chat(self):
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": [{"type": "text", "text": "What is a cat?"}]}]
        text = self.engine.apply_chat_template(messages)
        self.assertIn("What is a cat?", text)
        reply = self.engine.chat(messages, max_tokens=16, temperature=0)
        self.assertIsInstance(reply, str)
        self.assertEqual("".join(self.engine.chat(messages, max_tokens=16, temperature=0, stream=True)), reply)

    def test_tokenize_detokenize_embed(self):
        ids = self.engine.tokenize("Hello world")
        self.assertTrue(all(isinstance(i, int) for i in ids))
        self.assertEqual(self.engine.detokenize(ids), "Hello world")
        self.assertEqual(ids[0], self.engine.bos_token)
        self.assertNotEqual(self.engine.tokenize("Hello world", add_bos=False)[0], self.engine.bos_token)
        e = self.engine.embed("Hello world")
        self.assertEqual(len(e), self.engine.n_embd)
        try:
            import numpy
            self.assertIsInstance(e, numpy.ndarray)
            rows = self.engine.embed("Hello world", pooling="none")
            self.assertEqual(rows.shape, (len(ids), self.engine.n_embd))
            self.assertTrue(numpy.allclose(rows.mean(axis=0), e, atol=1e-5))
        except ImportError:
            self.assertIsInstance(e, list)
        with self.assertRaises(cera.Error):
            self.engine.detokenize([-1])

    def test_session_continues_and_its_state_round_trips(self):
        s = cera.Session(self.engine)
        s.append("Once upon a time")
        first = s.generate(max_tokens=8, temperature=0)
        state = s.save_state()
        self.assertIsInstance(state, bytes)
        rest = s.generate(max_tokens=8, temperature=0)
        self.assertEqual(first + rest, self.engine.generate("Once upon a time", max_tokens=16, temperature=0))
        t = cera.Session(self.engine)
        t.load_state(state)
        self.assertEqual(t.generate(max_tokens=8, temperature=0), rest)
        self.assertEqual(len(s.logits()), self.engine.n_vocab)
        with self.assertRaises(cera.Error) as ctx:
            t.load_state(b"not a state")
        self.assertEqual(ctx.exception.code, "invalid file")

    def test_errors(self):
        with self.assertRaises(cera.Error) as ctx:
            cera.Engine("/nonexistent/model.gguf")
        self.assertIn("/nonexistent/model.gguf", str(ctx.exception))
        self.assertIsInstance(ctx.exception, RuntimeError)
        with self.assertRaises(cera.Error):
            cera.Engine(MODEL, device="tpu")

    def setUp(self):
        # A test runner started in the background may inherit SIGINT ignored, and Python then installs
        # no KeyboardInterrupt handler: install it for the tests that send SIGINT.
        self.old_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)

    def tearDown(self):
        signal.signal(signal.SIGINT, self.old_sigint)

    def test_keyboard_interrupt_cancels_generation(self):
        # Generation to a full context takes seconds; SIGINT arrives well before it ends.
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        start = time.monotonic()
        timer.start()
        with self.assertRaises(KeyboardInterrupt):
            self.engine.generate("Once upon a time", max_tokens=-1, temperature=0, ignore_eos=True)
        self.assertLess(time.monotonic() - start, 5.0)
        # The engine still works afterwards.
        self.assertTrue(self.engine.generate("Once upon a time", max_tokens=4, temperature=0))

    def test_keyboard_interrupt_cancels_stream(self):
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        with self.assertRaises(KeyboardInterrupt):
            for _ in self.engine.stream("Once upon a time", max_tokens=-1, temperature=0, ignore_eos=True):
                time.sleep(0.001)

    def test_generation_on_another_thread(self):
        out = []
        t = threading.Thread(target=lambda: out.append(self.engine.generate("Once upon a time", max_tokens=16,
                                                                            temperature=0)))
        t.start()
        t.join()
        self.assertEqual(out, [self.engine.generate("Once upon a time", max_tokens=16, temperature=0)])

    def test_gil_is_released_while_generating(self):
        ticks = []
        done = threading.Event()

        def tick():
            while not done.is_set():
                ticks.append(1)
                time.sleep(0.001)

        t = threading.Thread(target=tick)
        t.start()
        try:
            self.engine.generate("Once upon a time", max_tokens=200, temperature=0, ignore_eos=True)
        finally:
            done.set()
            t.join()
        self.assertGreater(len(ticks), 5)


@unittest.skipUnless(TESTDATA, "CERA_TESTDATA is not set")
class LoraTest(unittest.TestCase):
    """LoRA adapters against `cera run --lora` (the C++ API) and transformers + peft's greedy tokens."""

    MODEL = fixture("tiny-lfm2/model.gguf")
    GGUF = fixture("tiny-lfm2/lora/lora.gguf")
    PEFT = fixture("tiny-lfm2/lora/peft")

    @classmethod
    def setUpClass(cls):
        cls.engine = cera.Engine(cls.MODEL, device="cpu", threads=1)
        cls.engine.load_adapter("story", cls.GGUF)
        cls.engine.load_adapter("half", pathlib.Path(cls.PEFT), 0.5)

    def test_default_adapters_equal_cera_run(self):
        e = cera.Engine(self.MODEL, device="cpu", threads=1, lora=[self.GGUF])
        want = cera_run(self.MODEL, "Once upon a time", 24, "--lora", self.GGUF)
        self.assertEqual(e.generate("Once upon a time", max_tokens=24, temperature=0), want)
        plain = cera_run(self.MODEL, "Once upon a time", 24)
        self.assertNotEqual(plain, want)
        self.assertEqual(e.generate("Once upon a time", max_tokens=24, temperature=0, adapter="base"), plain)
        half = cera.Engine(self.MODEL, device="cpu", threads=1, lora=[(pathlib.Path(self.PEFT), 0.5)])
        self.assertEqual(half.generate("Once upon a time", max_tokens=24, temperature=0),
                         cera_run(self.MODEL, "Once upon a time", 24, "--lora", self.PEFT + ":0.5"))

    def test_named_adapters_equal_cera_run(self):
        e = self.engine
        self.assertEqual([(a["name"], a["scale"], a["rank"]) for a in e.adapters()], [("half", 0.5, 8), ("story", 1.0, 8)])
        self.assertEqual(e.adapters()[1]["path"], self.GGUF)
        self.assertGreater(e.adapters()[1]["n_tensors"], 0)
        self.assertEqual(e.generate("Once upon a time", max_tokens=24, temperature=0, adapter="story"),
                         cera_run(self.MODEL, "Once upon a time", 24, "--lora", self.GGUF))
        self.assertEqual(e.generate("Once upon a time", max_tokens=24, temperature=0, adapter="half"),
                         cera_run(self.MODEL, "Once upon a time", 24, "--lora", self.PEFT + ":0.5"))
        self.assertEqual(e.generate("Once upon a time", max_tokens=24, temperature=0),
                         cera_run(self.MODEL, "Once upon a time", 24))
        streamed = "".join(e.stream("Once upon a time", max_tokens=24, temperature=0, adapter="story"))
        self.assertEqual(streamed, e.generate("Once upon a time", max_tokens=24, temperature=0, adapter="story"))
        messages = [{"role": "user", "content": "Tell me a story."}]
        self.assertNotEqual(e.chat(messages, max_tokens=12, temperature=0, adapter="story"),
                            e.chat(messages, max_tokens=12, temperature=0))

    def test_session_with_adapter_gives_transformers_greedy_tokens(self):
        with open(fixture("tiny-lfm2/lora/greedy_0.json")) as f:
            ref = json.load(f)
        s = cera.Session(self.engine)
        s.append_tokens(ref["prompt_ids"])
        text = s.generate(max_tokens=len(ref["generated_ids"]), temperature=0, ignore_eos=True, adapter="story")
        self.assertEqual(s.tokens[len(ref["prompt_ids"]):], ref["generated_ids"])
        self.assertEqual(text, self.engine.detokenize(ref["generated_ids"]))

    def test_bad_adapters(self):
        e = self.engine
        with self.assertRaises(cera.Error) as ctx:
            e.generate("Once upon a time", max_tokens=4, adapter="nope")
        self.assertEqual(ctx.exception.code, "missing")
        self.assertIn("nope", str(ctx.exception))
        with self.assertRaises(cera.Error) as ctx:
            e.load_adapter("qwen", fixture("tiny-qwen3/lora/peft"))
        self.assertEqual(ctx.exception.code, "invalid file")
        self.assertNotIn("\n", str(ctx.exception))
        with self.assertRaises(cera.Error) as ctx:
            e.load_adapter("x", fixture("tiny-lfm2/lora/missing.gguf"))
        self.assertEqual(ctx.exception.code, "i/o error")
        with self.assertRaises(cera.Error) as ctx:
            e.load_adapter("story", self.PEFT)
        self.assertEqual(ctx.exception.code, "invalid argument")
        with self.assertRaises(cera.Error) as ctx:
            cera.Engine(self.MODEL, device="cpu", threads=1, lora=[fixture("tiny-qwen3/lora/lora.gguf")])
        self.assertEqual(ctx.exception.code, "invalid file")
        with self.assertRaises(cera.Error):
            cera.Engine(self.MODEL, device="cpu", threads=1, lora=self.GGUF)  # a list is expected
        e.load_adapter("gone", self.GGUF)
        self.assertTrue(e.unload_adapter("gone"))
        self.assertFalse(e.unload_adapter("gone"))
        self.assertEqual([a["name"] for a in e.adapters()], ["half", "story"])


@unittest.skipUnless(TESTDATA, "CERA_TESTDATA is not set")
class VisionTest(unittest.TestCase):
    """Images against transformers' greedy continuation of fixtures/tiny-lfm2vl."""

    MODEL = fixture("tiny-lfm2vl/model.gguf")
    MMPROJ = fixture("tiny-lfm2vl/mmproj.gguf")
    IMAGE = fixture("tiny-lfm2vl/ref/test_image.png")

    @classmethod
    def setUpClass(cls):
        cls.engine = cera.Engine(cls.MODEL, device="cpu", threads=1, n_ctx=2048, mmproj=pathlib.Path(cls.MMPROJ))
        with open(fixture("tiny-lfm2vl/ref/prompt_vl.json")) as f:
            cls.prompt = json.load(f)
        with open(fixture("tiny-lfm2vl/ref/greedy_vl.json")) as f:
            cls.want = json.load(f)["generated_ids"]

    def test_session_image_gives_transformers_greedy_tokens(self):
        self.assertTrue(self.engine.has_vision)
        before, after = self.prompt["prompt_text_before_expansion"].split("<image>")
        with open(self.IMAGE, "rb") as f:
            data = f.read()
        for image in [data, bytearray(data), self.IMAGE, pathlib.Path(self.IMAGE)]:
            s = cera.Session(self.engine)
            s.append_tokens(self.engine.tokenize(before, add_bos=False))
            s.append_image(image)
            s.append_tokens(self.engine.tokenize(after, add_bos=False))
            self.assertEqual(s.tokens, self.prompt["ids"])
            text = s.generate(max_tokens=len(self.want), temperature=0, ignore_eos=True)
            self.assertEqual(s.tokens[len(self.prompt["ids"]):], self.want)
            self.assertEqual(text, self.engine.detokenize(self.want))

    def test_chat_with_an_image_part(self):
        with open(self.IMAGE, "rb") as f:
            data = f.read()
        messages = [{"role": "user", "content": [{"type": "image", "image": data},
                                                 {"type": "text", "text": "What is in the picture?"}]}]
        self.assertEqual(self.engine.apply_chat_template(messages), self.prompt["prompt_text_before_expansion"])
        want = self.engine.detokenize(self.want)
        self.assertEqual(self.engine.chat(messages, max_tokens=len(self.want), temperature=0, ignore_eos=True), want)
        streamed = self.engine.chat(messages, max_tokens=len(self.want), temperature=0, ignore_eos=True, stream=True)
        self.assertEqual("".join(streamed), want)

    def test_bad_images(self):
        s = cera.Session(self.engine)
        for bad in [b"not an image", b""]:
            with self.assertRaises(cera.Error) as ctx:
                s.append_image(bad)
            self.assertEqual(ctx.exception.code, "invalid argument")
            self.assertNotIn("\n", str(ctx.exception))
        with self.assertRaises(cera.Error) as ctx:
            s.append_image(fixture("tiny-lfm2vl/ref/no-such-image.png"))
        self.assertEqual(ctx.exception.code, "i/o error")
        with self.assertRaises(cera.Error) as ctx:
            s.append_image(42)
        self.assertEqual(ctx.exception.code, "invalid argument")
        self.assertEqual(s.tokens, [])
        # A marker typed in the text besides the image's own: two markers for one image.
        messages = [{"role": "user", "content": [{"type": "text", "text": "<image> and"},
                                                 {"type": "image", "image": self.IMAGE}]}]
        with self.assertRaises(cera.Error) as ctx:
            self.engine.chat(messages, max_tokens=1)
        self.assertEqual(ctx.exception.code, "invalid argument")
        # An engine without a projector.
        text_only = cera.Engine(self.MODEL, device="cpu", threads=1)
        self.assertFalse(text_only.has_vision)
        with self.assertRaises(cera.Error) as ctx:
            cera.Session(text_only).append_image(self.IMAGE)
        self.assertEqual(ctx.exception.code, "invalid argument")


if __name__ == "__main__":
    unittest.main()
