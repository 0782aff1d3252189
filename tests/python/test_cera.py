"""The Python module `cera` (src/python), run by CTest with Debian's python3.

CERA_TEST_MODEL names the model, CERA_BIN the cera binary whose `run` output greedy generation must
equal; PYTHONPATH holds the module.
"""
import os
import signal
import subprocess
import threading
import time
import unittest

import cera

MODEL = os.environ["CERA_TEST_MODEL"]
CERA_BIN = os.environ["CERA_BIN"]


class EngineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.engine = cera.Engine(MODEL, device="cpu", threads=1)

    def cera_run(self, prompt, n):
        out = subprocess.run([CERA_BIN, "run", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", "0",
                              "--threads", "1"], capture_output=True, check=True, stdin=subprocess.DEVNULL)
        return out.stdout.decode()

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


if __name__ == "__main__":
    unittest.main()
