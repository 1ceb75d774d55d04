// BullMQ's job cycle, the peer figure that benchmarks/peers.py (bullmq_cycle) asks for.
//
//   node peers_bullmq.mjs --modules DIR --port N --concurrency C --jobs J [--timeout S]
//   node peers_bullmq.mjs --modules DIR --versions
//
// DIR is the folder where `npm install bullmq@5 ioredis@5` ran: bullmq is loaded from it
// by path (ESM ignores NODE_PATH, and this script lives outside that folder). Redis is
// always 127.0.0.1:N. The script adds J no-op jobs to a fresh queue with addBulk
// (untimed), then times one Worker of concurrency C from its start until its J-th
// 'completed' (or 'failed') event, and prints one JSON line on stdout:
//   {"jobs_per_s", "jobs", "concurrency", "seconds", "server_cpu_s", "failed", "queue",
//    "bullmq", "ioredis", "node"}
// server_cpu_s: the Redis process's CPU seconds (INFO cpu used_cpu_sys + used_cpu_user,
// read over the Queue's connection) from just before the Worker starts to its last job.
// Whatever happens, the queue is obliterated afterwards. Errors go to stderr, exit 1.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

function parseArgs(argv) {
  const args = { timeout: 600, versions: false };
  for (let i = 0; i < argv.length; i += 1) {
    const flag = argv[i];
    if (flag === "--versions") {
      args.versions = true;
    } else if (["--modules", "--port", "--concurrency", "--jobs", "--timeout"].includes(flag)) {
      args[flag.slice(2)] = argv[i + 1];
      i += 1;
    } else {
      throw new Error(`unknown argument ${flag}`);
    }
  }
  if (!args.modules) throw new Error("--modules DIR is required");
  for (const name of ["port", "concurrency", "jobs", "timeout"]) {
    if (args[name] === undefined) continue;
    const value = Number(args[name]);
    if (!Number.isInteger(value) || value <= 0) throw new Error(`--${name} must be > 0`);
    args[name] = value;
  }
  if (!args.versions && (!args.port || !args.concurrency || !args.jobs)) {
    throw new Error("--port, --concurrency and --jobs are required");
  }
  return args;
}

// The package.json of the package that `name` resolves to from `fromRequire`.
function packageVersion(fromRequire, name) {
  let folder = dirname(fromRequire.resolve(name));
  for (;;) {
    try {
      const meta = JSON.parse(readFileSync(join(folder, "package.json"), "utf8"));
      if (meta.name === name) return meta.version;
    } catch {
      // no package.json at this level: go up
    }
    const parent = dirname(folder);
    if (parent === folder) throw new Error(`no package.json found for ${name}`);
    folder = parent;
  }
}

function load(modules) {
  const require = createRequire(join(modules, "package.json"));
  const bullmq = require("bullmq");
  // The ioredis that bullmq itself loads (it may keep its own copy under its folder).
  const fromBullmq = createRequire(require.resolve("bullmq"));
  const versions = {
    bullmq: packageVersion(require, "bullmq"),
    ioredis: packageVersion(fromBullmq, "ioredis"),
    node: process.version,
  };
  return { bullmq, versions };
}

async function cycle({ Queue, Worker }, args) {
  const connection = { host: "127.0.0.1", port: args.port };
  const name = `peers-${randomUUID()}`;
  const jobOpts = { removeOnComplete: true, removeOnFail: true };
  const queue = new Queue(name, { connection });
  let worker = null;
  try {
    await queue.waitUntilReady();
    for (let start = 0; start < args.jobs; start += 1000) {
      const count = Math.min(1000, args.jobs - start);
      await queue.addBulk(Array.from({ length: count }, () => (
        { name: "noop", data: {}, opts: jobOpts })));
    }

    let done = 0;
    let failed = 0;
    let finish;
    const finished = new Promise((resolve) => { finish = resolve; });
    worker = new Worker(name, async () => undefined, {
      connection,
      concurrency: args.concurrency,
      autorun: false,
    });
    const end = () => {
      done += 1;
      if (done === args.jobs) finish(performance.now());
    };
    worker.on("completed", end);
    worker.on("failed", () => { failed += 1; end(); });
    worker.on("error", (err) => { process.stderr.write(`worker error: ${err}\n`); });
    await worker.waitUntilReady();
    // The Redis process's CPU seconds (INFO cpu: sys + user), over the Queue's connection.
    const redis = await queue.client;
    const cpu = async () => {
      const text = await redis.info("cpu");
      const field = (name) => Number((text.match(new RegExp(`^${name}:([0-9.]+)`, "m")) || [])[1]);
      return field("used_cpu_sys") + field("used_cpu_user");
    };
    const cpuBefore = await cpu();

    const started = performance.now();
    const running = worker.run();
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(
        `timed out after ${args.timeout} s with ${done} of ${args.jobs} jobs done`)),
      args.timeout * 1000);
    });
    const ended = await Promise.race([finished, timeout]);
    clearTimeout(timer);
    const serverCpu = (await cpu()) - cpuBefore;
    const seconds = (ended - started) / 1000;
    await worker.close();
    await running;
    worker = null;
    return {
      jobs_per_s: args.jobs / seconds,
      jobs: args.jobs,
      concurrency: args.concurrency,
      seconds,
      server_cpu_s: serverCpu,
      failed,
      queue: name,
    };
  } finally {
    if (worker !== null) await worker.close(true).catch(() => undefined);
    await queue.obliterate({ force: true }).catch((err) => {
      process.stderr.write(`obliterate ${name} failed: ${err}\n`);
    });
    await queue.close();
  }
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  // ioredis retries a refused connection for ever: bound the whole run, not just the drain.
  setTimeout(() => {
    process.stderr.write(`gave up after ${args.timeout} s (is Redis on 127.0.0.1:${args.port}?)\n`);
    process.exit(1);
  }, args.timeout * 1000).unref();
  const { bullmq, versions } = load(args.modules);
  const result = args.versions ? versions : { ...(await cycle(bullmq, args)), ...versions };
  // Exit once the line is written: a lingering handle must not keep the process alive.
  process.stdout.write(`${JSON.stringify(result)}\n`, () => process.exit(0));
}

main().catch((err) => {
  process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
