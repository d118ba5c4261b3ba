// `loom serve --tp 2` with its ranks as MPI processes (mpirun -np 2) against one rank and against
// two rank threads, through the HTTP API: the same greedy tokens and log-probabilities (fp32,
// relative 1e-5) for a batch of prompts of different lengths decoded together, greedy and seeded sampling (chunked prefill,
// small blocks, n = 2 forking a shared partial block), before and after /load_weights (each
// rank loading its slice; the served digest equals `loom ckpt digest` of the checkpoint);
// SIGTERM on rank 0 finishing a running request and ending both processes with status 0; a
// follower killed, or stopped, making rank 0 fail rather than hang; a hybrid model (Mamba-2
// state slots) under MPI decoding as one rank, also drafting with its multi-token prediction depths.
// Usage: node mpi_tp_test.mjs LOOM_BINARY MPIEXEC   (exit 77: no mpirun)
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import assert from 'node:assert/strict';
import { checks, preparedCorpus, withoutProxies } from './serve_test_support.mjs';

const [loom, mpiexec] = [path.resolve(process.argv[2]), process.argv[3] || 'mpirun'];
try {
  execFileSync(mpiexec, ['--version'], { stdio: 'ignore' });
} catch {
  console.log(`skipped: '${mpiexec}' cannot run (no MPI launcher installed; scripts/setup.sh installs Open MPI)`);
  process.exit(77);
}
withoutProxies();

// A small Llama-style model (GQA: each rank holds one of the two kv heads), checkpoints at steps 30 and 60.
const dir = preparedCorpus(loom, 'loom-serve-mpi-');
fs.writeFileSync(path.join(dir, 'run.yaml'), `run: {dir: ${dir}/run}
model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 64, max_seq_len: 128}
data: {tokenizer: byte, train_prefix: ${dir}/data/c_train, seq_len: 32}
optim: {lr: 1.0e-2, warmup_steps: 2}
train: {steps: 60, global_batch: 8, micro_batch: 8}
checkpoint: {interval: 30, keep: 2}
log: {progress: false}
`);
execFileSync(loom, ['train', path.join(dir, 'run.yaml')], { stdio: 'ignore' });
const first = path.join(dir, 'run/checkpoints/step-00000030');
const second = path.join(dir, 'run/checkpoints/step-00000060');
const flags = ['--port', '0', '--block-size', '4', '--max-batch-tokens', '12', '--max-running', '8'];

// Resolves when the server prints its port; `exited` resolves with the launcher's exit status.
function start(command, args) {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stderr.on('data', (d) => { err += d; });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal, err: () => err })));
  const ready = new Promise((resolve, reject) => {
    child.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve({ child, exited, base: `http://127.0.0.1:${m[1]}` });
    });
    exited.then(({ code }) => reject(new Error(`${command} exited with ${code}: ${out}${err}`)));
  });
  return ready;
}
const serveArgs = (tp) => ['serve', first, '--tp', String(tp), ...flags];
const mpiServer = (extra = []) =>
  start(mpiexec, ['--allow-run-as-root', '--oversubscribe', '-np', '2', loom, ...serveArgs(2), ...extra]);

// The launcher's children: the loom processes, by MPI rank.
function ranksOf(launcher) {
  const ranks = {};
  for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) !== launcher.pid) continue;
      const env = fs.readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
      const rank = env.find((e) => e.startsWith('OMPI_COMM_WORLD_RANK=') || e.startsWith('PMI_RANK='));
      if (rank) ranks[Number(rank.split('=')[1])] = Number(pid);
    } catch { /* a process that ended meanwhile */ }
  }
  return ranks;
}

const post = async (base, route, body) => {
  const res = await fetch(base + route, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const json = await res.json();
  assert.equal(res.status, 200, `${route}: ${JSON.stringify(json)}`);
  return json;
};
const prompts = ['It', 'It is a truth universally', 'item 14', 'It is a truth universally acknowledged, item 2', '\n\nIt is'];
// Every prompt at once (decoded together): greedy (n = 2 on one of them), and sampled with a seed
// (the same logits draw the same tokens).
async function decode(base) {
  const requests = prompts.map((prompt, i) => ({ prompt, temperature: 0, n: i === 1 ? 2 : 1 }));
  requests.push({ prompt: prompts[1], temperature: 1, seed: 7, n: 2 }, { prompt: prompts[3], temperature: 0.8, seed: 3 });
  const answers = await Promise.all(requests.map((r) => post(base, '/v1/completions', {
    model: 'loom', max_tokens: 12, logprobs: 1, return_token_ids: true, ignore_eos: true, ...r,
  })));
  return answers.map((a) => ({ version: a.weight_version, choices: a.choices.map((c) => ({ ids: c.token_ids, logprobs: c.logprobs.token_logprobs })) }));
}
function same(name, got, want) {
  assert.equal(got.length, want.length);
  for (let p = 0; p < want.length; ++p) {
    assert.equal(got[p].version, want[p].version, `${name}: weight_version`);
    for (let c = 0; c < want[p].choices.length; ++c) {
      const g = got[p].choices[c], w = want[p].choices[c];
      assert.deepEqual(g.ids, w.ids, `${name}: prompt ${p} sample ${c}: tokens`);
      for (let t = 0; t < w.logprobs.length; ++t) {
        const rel = Math.abs(g.logprobs[t] - w.logprobs[t]) / Math.max(1, Math.abs(w.logprobs[t]));
        assert.ok(rel <= 1e-5, `${name}: prompt ${p} sample ${c} token ${t}: logprob ${g.logprobs[t]} vs ${w.logprobs[t]} (relative ${rel})`);
      }
    }
  }
}

const { check, failures: failedChecks } = checks();
const digestOf = (checkpoint) => execFileSync(loom, ['ckpt', 'digest', checkpoint]).toString().trim();
const within = (promise, ms, what) =>
  Promise.race([promise, new Promise((_, reject) => setTimeout(() => reject(new Error(`${what}: still running after ${ms} ms`)), ms))]);

const servers = { one: await start(loom, serveArgs(1)), threads: await start(loom, serveArgs(2)), mpi: await mpiServer() };
await check('tp 2 as MPI processes decodes as one rank and as two rank threads', async () => {
  const want = await decode(servers.one.base);
  assert.equal(want[1].choices.length, 2);
  same('threads', await decode(servers.threads.base), want);
  same('mpi', await decode(servers.mpi.base), want);
});
await check('/load_weights reaches every MPI rank', async () => {
  for (const s of Object.values(servers)) {
    assert.equal((await post(s.base, '/load_weights', { path: second, version: 'v2' })).weight_version, 'v2');
  }
  const want = await decode(servers.one.base);
  assert.equal(want[0].version, 'v2');
  same('threads', await decode(servers.threads.base), want);
  same('mpi', await decode(servers.mpi.base), want);
  for (const [name, s] of Object.entries(servers)) {
    const digest = await (await fetch(`${s.base}/weights_digest`)).json();
    assert.equal(digest.digest, digestOf(second), `${name}: /weights_digest`);
  }
});
await check('SIGTERM on rank 0 finishes the running request; both processes exit 0', async () => {
  const ranks = ranksOf(servers.mpi.child);
  assert.ok(ranks[0] && ranks[1], `the launcher's ranks: ${JSON.stringify(ranks)}`);
  const running = post(servers.mpi.base, '/v1/completions', { model: 'loom', prompt: 'It is', max_tokens: 100, temperature: 0, ignore_eos: true });
  await new Promise((r) => setTimeout(r, 100));
  process.kill(ranks[0], 'SIGTERM');
  const answer = await running;
  assert.equal(answer.choices[0].finish_reason, 'length');
  const { code, signal, err } = await within(servers.mpi.exited, 30000, 'mpirun');
  assert.equal(code, 0, `mpirun exited with ${code} (${signal}): ${err()}`);
});
for (const s of [servers.one, servers.threads]) s.child.kill('SIGTERM');
await check('the threads servers exit 0 too', async () => {
  for (const s of [servers.one, servers.threads]) assert.equal((await within(s.exited, 30000, 'loom serve')).code, 0);
});
await check('a follower killed ends the job (rank 0 does not hang)', async () => {
  const s = await mpiServer();
  process.kill(ranksOf(s.child)[1], 'SIGKILL');
  const { code } = await within(s.exited, 30000, 'mpirun after its follower was killed');
  assert.notEqual(code, 0);
});
await check('a follower that stops answering makes rank 0 fail, naming it', async () => {
  const s = await mpiServer(['--comm-timeout-s', '3']);
  const follower = ranksOf(s.child)[1];
  process.kill(follower, 'SIGSTOP');
  const { code, err } = await within(s.exited, 30000, 'mpirun after its follower stopped');
  try { process.kill(follower, 'SIGCONT'); } catch { /* already gone */ }
  assert.notEqual(code, 0);
  // Stopped before it entered the broadcast rank 0 waits in, rank 1 never arrived; stopped just
  // after entering it, its handshake polls stand still. Either way it is named.
  assert.match(err(), /the engine failed.*timed out.*(never arrived|stopped making progress)[^:]*: 1 \(world rank 1/);
});
await check('a hybrid model (Mamba-2 state slots copied for n = 2) under MPI decodes as one rank, with drafts too', async () => {
  fs.writeFileSync(path.join(dir, 'hybrid.yaml'), `run: {dir: ${dir}/hybrid}
model: {vocab_size: 0, d_model: 32, layers: 4, layer_pattern: 'M*EM', heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: relu2, positions: rope, tied_embeddings: false, max_seq_len: 128, moe_experts: 4, moe_top_k: 2, moe_ffn_size: 24, moe_router: sigmoid, mtp_depths: 2, mtp_use_repeated_layer: true, mamba: {state_size: 8, heads: 4, head_dim: 8, groups: 2, conv_kernel: 4, chunk_size: 8}}
data: {tokenizer: byte, train_prefix: ${dir}/data/c_train, seq_len: 32}
train: {steps: 4, global_batch: 4, micro_batch: 4}
log: {progress: false}
`);
  execFileSync(loom, ['train', path.join(dir, 'hybrid.yaml')], { stdio: 'ignore' });
  const checkpoint = path.join(dir, 'hybrid/checkpoints');
  const one = await start(loom, ['serve', checkpoint, '--tp', '1', ...flags]);
  const mpi = await start(mpiexec, ['--allow-run-as-root', '--oversubscribe', '-np', '2', loom, 'serve', checkpoint, '--tp', '2', ...flags]);
  try {
    same('hybrid mpi', await decode(mpi.base), await decode(one.base));
  } finally {
    one.child.kill('SIGTERM');
    process.kill(ranksOf(mpi.child)[0], 'SIGTERM');
  }
  assert.equal((await within(mpi.exited, 30000, 'mpirun')).code, 0);
  assert.equal((await within(one.exited, 30000, 'loom serve')).code, 0);
  // Speculative decoding with its multi-token prediction depths: every drafting depth a step
  // message of its own, the followers' snapshot slots restored as rank 0's.
  const drafting = ['--speculative-config', '{"method": "mtp", "num_speculative_tokens": 2}'];
  const oneDrafting = await start(loom, ['serve', checkpoint, '--tp', '1', ...flags, ...drafting]);
  const mpiDrafting = await start(mpiexec, ['--allow-run-as-root', '--oversubscribe', '-np', '2', loom, 'serve',
                                            checkpoint, '--tp', '2', ...flags, ...drafting]);
  try {
    same('hybrid mpi drafting', await decode(mpiDrafting.base), await decode(oneDrafting.base));
  } finally {
    oneDrafting.child.kill('SIGTERM');
    process.kill(ranksOf(mpiDrafting.child)[0], 'SIGTERM');
  }
  assert.equal((await within(mpiDrafting.exited, 30000, 'mpirun')).code, 0);
});
fs.rmSync(dir, { recursive: true, force: true });
const failures = failedChecks();
if (failures > 0) {
  console.log(`${failures} check(s) failed`);
  process.exit(1);
}
console.log('all checks passed');
