// BullMQ's job cycle, the peer figure that benchmarks/peers.py (bullmq_cycle) asks for;
// and BullMQ's jobs left in a queue, whose memory bench_memory.py weighs (bullmq_add).
//
//   node peers_bullmq.mjs --modules DIR --port N --concurrency C --jobs J [--timeout S]
//        [--data-bytes B]
//   node peers_bullmq.mjs --modules DIR --add --port N --queue Q --jobs J [--delay MS]
//        [--data-bytes B] [--timeout S]
//   node peers_bullmq.mjs --modules DIR --versions
//
// DIR is the folder where `npm install bullmq@6.7.0 ioredis@5.11.1` ran: bullmq and
// ioredis are loaded from it by path (ESM ignores NODE_PATH, and this script lives outside
// that folder). Redis is always 127.0.0.1:N. The script adds J no-op jobs to a fresh queue
// with addBulk (untimed; each job's data an object of B bytes as JSON, default 100, the
// size of the redisstore rows' records), then times one Worker of concurrency C from its
// run() until its J-th 'completed' (or 'failed') event, and prints one JSON line on stdout:
//   {"jobs_per_s", "jobs", "concurrency", "seconds", "server_cpu_s", "server_usec",
//    "client_cpu_s", "failed", "queue", "bullmq", "ioredis", "node"}
// Over the same window: server_cpu_s, the Redis process's CPU seconds (INFO cpu
// used_cpu_sys + used_cpu_user); server_usec, the usec INFO commandstats gives the
// commands clients send (EVALSHA and the blocking pops; not those the scripts call, which
// are counted inside their script's time); client_cpu_s, this Node process's CPU seconds
// (process.cpuUsage: user + system, every thread). INFO is read over a connection of this
// script's own (plain ioredis), idle while the Worker runs, so nothing depends on how a
// BullMQ version exposes its clients. Whatever happens, the queue is obliterated
// afterwards.
//
// --add: adds J jobs to queue Q (default prefix "bull") with addBulk, 1,000 a call, each
// with jobId a fresh uuid4 string (crypto.randomUUID), data of B bytes as JSON (default
// 100), the cycle's removeOnComplete and removeOnFail, and delay MS when MS > 0 (a delayed
// job; else a waiting one); BullMQ's defaults otherwise. It checks that the queue counts J
// jobs in that state, closes the queue (its connections) and leaves the jobs there for the
// caller to measure and remove. Prints one JSON line: {"jobs", "queue", "delay", "state",
// "counted", "bullmq", "ioredis", "node"}.
//
// Errors go to stderr, exit 1.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

function parseArgs(argv) {
  const args = { timeout: 600, versions: false, add: false, "data-bytes": 100, delay: 0 };
  for (let i = 0; i < argv.length; i += 1) {
    const flag = argv[i];
    if (flag === "--versions" || flag === "--add") {
      args[flag.slice(2)] = true;
    } else if (["--modules", "--port", "--concurrency", "--jobs", "--timeout", "--data-bytes",
      "--queue", "--delay"].includes(flag)) {
      args[flag.slice(2)] = argv[i + 1];
      i += 1;
    } else {
      throw new Error(`unknown argument ${flag}`);
    }
  }
  if (!args.modules) throw new Error("--modules DIR is required");
  for (const name of ["port", "concurrency", "jobs", "timeout", "data-bytes"]) {
    if (args[name] === undefined) continue;
    const value = Number(args[name]);
    if (!Number.isInteger(value) || value <= 0) throw new Error(`--${name} must be > 0`);
    args[name] = value;
  }
  const delay = Number(args.delay);
  if (!Number.isInteger(delay) || delay < 0) throw new Error("--delay must be >= 0");
  args.delay = delay;
  if (args.versions) return args;
  if (args.add) {
    if (!args.port || !args.jobs || !args.queue) {
      throw new Error("--add needs --port, --queue and --jobs");
    }
  } else if (!args.port || !args.concurrency || !args.jobs) {
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
  // INFO is read through the ioredis installed beside bullmq (bullmq 6 loads it too).
  const IORedis = require("ioredis");
  // The ioredis that bullmq itself loads (it may keep its own copy under its folder).
  const fromBullmq = createRequire(require.resolve("bullmq"));
  const versions = {
    bullmq: packageVersion(require, "bullmq"),
    ioredis: packageVersion(fromBullmq, "ioredis"),
    node: process.version,
  };
  return { bullmq, IORedis: IORedis.default || IORedis, versions };
}

// A job's data: an object that is `bytes` long as JSON (at least {"step":1,"pad":""}).
function jobData(bytes) {
  const base = JSON.stringify({ step: 1, pad: "" }).length;
  return { step: 1, pad: "x".repeat(Math.max(0, bytes - base)) };
}

// The commands clients send, as bench_throughput.py's TOP_LEVEL counts them for
// redisstore, plus the blocking pops a BullMQ Worker waits on.
const TOP_LEVEL = new Set(["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "script",
  "bzpopmin", "bzpopmax", "blmove", "brpoplpush"]);

// { cpu: INFO cpu sys + user seconds, usec: commandstats usec of TOP_LEVEL commands }.
async function serverStats(redis) {
  const cpu = await redis.info("cpu");
  const field = (name) => Number((cpu.match(new RegExp(`^${name}:([0-9.]+)`, "m")) || [])[1]);
  const stats = await redis.info("commandstats");
  let usec = 0;
  for (const match of stats.matchAll(/^cmdstat_([a-z_|-]+):calls=\d+,usec=(\d+)/gm)) {
    if (TOP_LEVEL.has(match[1].split("|")[0])) usec += Number(match[2]);
  }
  return { cpu: field("used_cpu_sys") + field("used_cpu_user"), usec };
}

async function cycle({ Queue, Worker }, IORedis, args) {
  const connection = { host: "127.0.0.1", port: args.port };
  const name = `peers-${randomUUID()}`;
  const jobOpts = { removeOnComplete: true, removeOnFail: true };
  const data = jobData(args["data-bytes"]);
  const queue = new Queue(name, { connection });
  const probe = new IORedis({ ...connection, lazyConnect: true, maxRetriesPerRequest: 1 });
  let worker = null;
  try {
    await probe.connect();
    await queue.waitUntilReady();
    for (let start = 0; start < args.jobs; start += 1000) {
      const count = Math.min(1000, args.jobs - start);
      await queue.addBulk(Array.from({ length: count }, () => (
        { name: "noop", data, opts: jobOpts })));
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
      if (done === args.jobs) finish([performance.now(), process.cpuUsage()]);
    };
    worker.on("completed", end);
    worker.on("failed", () => { failed += 1; end(); });
    worker.on("error", (err) => { process.stderr.write(`worker error: ${err}\n`); });
    await worker.waitUntilReady();
    const before = await serverStats(probe);

    const cpuStarted = process.cpuUsage();
    const started = performance.now();
    const running = worker.run();
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(
        `timed out after ${args.timeout} s with ${done} of ${args.jobs} jobs done`)),
      args.timeout * 1000);
    });
    const [ended, cpuEnded] = await Promise.race([finished, timeout]);
    clearTimeout(timer);
    const after = await serverStats(probe);
    const seconds = (ended - started) / 1000;
    await worker.close();
    await running;
    worker = null;
    return {
      jobs_per_s: args.jobs / seconds,
      jobs: args.jobs,
      concurrency: args.concurrency,
      seconds,
      server_cpu_s: after.cpu - before.cpu,
      server_usec: after.usec - before.usec,
      client_cpu_s: (cpuEnded.user - cpuStarted.user + cpuEnded.system - cpuStarted.system) / 1e6,
      failed,
      queue: name,
    };
  } finally {
    if (worker !== null) await worker.close(true).catch(() => undefined);
    await queue.obliterate({ force: true }).catch((err) => {
      process.stderr.write(`obliterate ${name} failed: ${err}\n`);
    });
    await queue.close();
    probe.disconnect();
  }
}

// Leaves args.jobs jobs in queue args.queue (waiting, or delayed by args.delay ms).
async function addJobs({ Queue }, args) {
  const connection = { host: "127.0.0.1", port: args.port };
  const jobOpts = { removeOnComplete: true, removeOnFail: true };
  if (args.delay > 0) jobOpts.delay = args.delay;
  const data = jobData(args["data-bytes"]);
  const state = args.delay > 0 ? "delayed" : "waiting";
  const queue = new Queue(args.queue, { connection });
  try {
    await queue.waitUntilReady();
    for (let start = 0; start < args.jobs; start += 1000) {
      const count = Math.min(1000, args.jobs - start);
      await queue.addBulk(Array.from({ length: count }, () => (
        { name: "noop", data, opts: { ...jobOpts, jobId: randomUUID() } })));
    }
    const counted = await queue.getJobCountByTypes(state);
    if (counted !== args.jobs) {
      throw new Error(`the queue counts ${counted} ${state} jobs, not ${args.jobs}`);
    }
    return { jobs: args.jobs, queue: args.queue, delay: args.delay, state, counted };
  } finally {
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
  const { bullmq, IORedis, versions } = load(args.modules);
  let result = versions;
  if (args.add) result = { ...(await addJobs(bullmq, args)), ...versions };
  else if (!args.versions) result = { ...(await cycle(bullmq, IORedis, args)), ...versions };
  // Exit once the line is written: a lingering handle must not keep the process alive.
  process.stdout.write(`${JSON.stringify(result)}\n`, () => process.exit(0));
}

main().catch((err) => {
  process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
