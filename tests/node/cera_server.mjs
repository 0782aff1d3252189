// Starts `cera serve` on a free port for a test and stops it: the server's stderr is kept (its log
// line per request is what shows that a request was cancelled), and the URL comes from its
// "listening on" line.
import { spawn } from "node:child_process";

export async function startServer(ceraBin, args = []) {
  const proc = spawn(ceraBin, ["serve", "--port", "0", "--threads", "2", ...args], {
    stdio: ["ignore", "inherit", "pipe"],
  });
  const server = {
    proc,
    log: "",
    url: null,
    // Waits until the log has a line matching `re` (a request's log line is written as it ends).
    async waitForLog(re, timeoutMs = 10000) {
      const t0 = Date.now();
      while (!re.test(server.log)) {
        if (Date.now() - t0 > timeoutMs) throw new Error(`no log line matching ${re} in:\n${server.log}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      return server.log.match(re);
    },
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      const exited = new Promise((r) => proc.once("exit", (code) => r(code)));
      proc.kill("SIGTERM");
      return exited;
    },
  };
  proc.stderr.setEncoding("utf8");
  proc.stderr.on("data", (d) => {
    server.log += d;
    process.stderr.write(d);
  });
  const t0 = Date.now();
  while (!server.url) {
    const m = server.log.match(/listening on (http:\/\/[^\s]+)/);
    if (m) server.url = m[1];
    else if (proc.exitCode !== null) throw new Error("cera serve exited: " + server.log);
    else if (Date.now() - t0 > 60000) throw new Error("cera serve did not start: " + server.log);
    else await new Promise((r) => setTimeout(r, 50));
  }
  return server;
}
