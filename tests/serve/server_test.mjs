// `loom serve` against the official `openai` npm client and autocannon: completions, chat,
// streaming (usage chunk, [DONE]), n > 1, log-probabilities and token ids; malformed requests
// answered with OpenAI error objects while the server keeps serving; a bounded queue (429); a
// client that leaves frees its KV blocks; a load of concurrent streams leaks nothing; new weights
// between steps; profiling windows; SIGTERM finishing the running request. One small server for all of it, one
// for a hybrid model with Mamba-2 layers, two for speculative decoding and two for --dtype.
// Usage: node server_test.mjs LOOM_BINARY NPM_DIR   (exit 77: the npm clients are not installed)
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import assert from 'node:assert/strict';
import { checks, preparedCorpus, withoutProxies } from './serve_test_support.mjs';

const [loom, npmDir] = process.argv.slice(2).map((p) => path.resolve(p));
if (!fs.existsSync(path.join(npmDir, 'node_modules', 'openai')) || !fs.existsSync(path.join(npmDir, 'node_modules', 'autocannon'))) {
  console.log(`skipped: the test clients are not installed in ${npmDir} (run scripts/setup.sh)`);
  process.exit(77);
}
const require = createRequire(path.join(npmDir, 'package.json'));
const OpenAI = require('openai');
const autocannon = require('autocannon');
withoutProxies();

// A tiny GPT-2-style model trained for two steps on a byte corpus.
const dir = preparedCorpus(loom, 'loom-serve-');
fs.writeFileSync(path.join(dir, 'run.yaml'), `run: {dir: ${dir}/run}
model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, ffn_size: 64, norm: layer, activation: gelu, positions: learned, bias: true, tied_embeddings: true, max_seq_len: 256}
data: {tokenizer: byte, train_prefix: ${dir}/data/c_train, seq_len: 32}
train: {steps: 2, global_batch: 4, micro_batch: 4}
`);
execFileSync(loom, ['train', path.join(dir, 'run.yaml')]);
const checkpoint = path.join(dir, 'run/checkpoints');

function startServer(extra = [], served = checkpoint) {
  const child = spawn(loom, ['serve', served, '--port', '0', '--max-queue', '4', '--max-running', '4', '--block-size', '8', ...extra],
                      { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve({ child, base: `http://127.0.0.1:${m[1]}` });
    });
    child.on('exit', (code) => reject(new Error(`loom serve exited with ${code}: ${out}`)));
  });
}

const { child, base } = await startServer();
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
const post = (route, body) => fetch(base + route, { method: 'POST', headers: { 'content-type': 'application/json' },
                                                    body: typeof body === 'string' ? body : JSON.stringify(body) });
async function metrics() {
  const text = await (await fetch(`${base}/metrics`)).text();
  const value = (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))[1]);
  return { blocks: value('loom_kv_blocks_in_use'), running: value('loom_running_sequences'), queue: value('loom_queue_depth'), text };
}
async function settled() {
  for (let i = 0; i < 100; ++i) {
    const m = await metrics();
    if (m.blocks === 0 && m.running === 0 && m.queue === 0) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail(`KV blocks still in use: ${(await metrics()).text}`);
}
const { check, failures: failedChecks } = checks();

// Greedy with presence and frequency penalties: every token is the best of its 20 reported
// alternatives once their raw log-probabilities lose frequency x count + presence for the tokens
// already generated (and beats every alternative left out, whose raw value is lower still).
await check('presence and frequency penalties: each token the best of the penalised alternatives', async () => {
  const ask = (penalties) => client.completions.create({ model: 'loom', prompt: 'It is a truth', max_tokens: 16,
                                                         temperature: 0, logprobs: 20, ignore_eos: true,
                                                         return_tokens_as_token_ids: true, ...penalties });
  const r = await ask({ presence_penalty: 1.5, frequency_penalty: 1 });
  const plain = await ask({});
  const c = r.choices[0];
  assert.equal(c.logprobs.tokens.length, 16);
  const counts = new Map();
  const id = (token) => Number(token.split(':')[1]);
  for (let i = 0; i < c.logprobs.tokens.length; ++i) {
    let best = null, bestValue = -Infinity, lowest = Infinity;
    for (const [key, lp] of Object.entries(c.logprobs.top_logprobs[i])) {
      const n = counts.get(id(key)) ?? 0;
      const v = lp - 1 * n - (n > 0 ? 1.5 : 0);
      if (v > bestValue) [best, bestValue] = [id(key), v];
      lowest = Math.min(lowest, lp);
    }
    const chosen = id(c.logprobs.tokens[i]);
    assert.equal(chosen, best, `token ${i}`);
    assert.ok(bestValue >= lowest, `token ${i}: an alternative left out could have won`);
    counts.set(chosen, (counts.get(chosen) ?? 0) + 1);
  }
  assert.notDeepEqual(c.logprobs.tokens, plain.choices[0].logprobs.tokens);
  await settled();
});

await check('completions with logprobs and token ids', async () => {
  const r = await client.completions.create({ model: 'loom', prompt: 'It is a truth', max_tokens: 12, temperature: 0,
                                              logprobs: 3, ignore_eos: true, return_token_ids: true });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'length');
  assert.equal(c.logprobs.token_logprobs.length, 12);
  assert.equal(c.token_ids.length, 12);
  assert.deepEqual(c.prompt_token_ids, [...Buffer.from('It is a truth')]);
  assert.equal(c.logprobs.top_logprobs[0] && Object.keys(c.logprobs.top_logprobs[0]).length > 0, true);
  assert.ok(c.logprobs.token_logprobs.every((x) => x <= 0));
  assert.equal(r.usage.prompt_tokens, 13);
  assert.equal(r.usage.completion_tokens, 12);
  assert.equal(typeof r.weight_version, 'string');
  // Streaming gives the same greedy tokens and text.
  const stream = await client.completions.create({ model: 'loom', prompt: 'It is a truth', max_tokens: 12, temperature: 0,
                                                   ignore_eos: true, stream: true, stream_options: { include_usage: true },
                                                   return_token_ids: true });
  let streamed = '', ids = [], usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) { streamed += ch.text; ids.push(...(ch.token_ids ?? [])); }
  }
  assert.equal(streamed, c.text);
  assert.deepEqual(ids, c.token_ids);
  assert.equal(usage.completion_tokens, 12);
});

await check('tokens as ids, n > 1 with a seed', async () => {
  const r = await client.completions.create({ model: 'loom', prompt: [[73, 116, 32]], max_tokens: 6, n: 3, seed: 5,
                                              temperature: 1, logprobs: 0, ignore_eos: true, return_tokens_as_token_ids: true });
  assert.equal(r.choices.length, 3);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  for (const c of r.choices) assert.ok(c.logprobs.tokens.every((t) => /^token_id:\d+$/.test(t)));
  const again = await client.completions.create({ model: 'loom', prompt: [[73, 116, 32]], max_tokens: 6, n: 3, seed: 5,
                                                  temperature: 1, logprobs: 0, ignore_eos: true, return_tokens_as_token_ids: true });
  assert.deepEqual(again.choices.map((c) => c.logprobs.tokens), r.choices.map((c) => c.logprobs.tokens));
});

await check('chat, streamed and not, with logprobs', async () => {
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello' }];
  const r = await client.chat.completions.create({ model: 'loom', messages, max_tokens: 8, temperature: 0, logprobs: true,
                                                   top_logprobs: 2, n: 2 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 2);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, r.choices[1].message.content);
  assert.equal(r.choices[0].logprobs.content[0].top_logprobs.length, 2);
  const stream = await client.chat.completions.create({ model: 'loom', messages, max_tokens: 8, temperature: 0, stream: true,
                                                        stream_options: { include_usage: true } });
  let content = '', role = null, usage = null, finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) {
      role = role ?? ch.delta.role;
      content += ch.delta.content ?? '';
      finish = ch.finish_reason ?? finish;
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(content, r.choices[0].message.content);
  assert.ok(finish === 'length' || finish === 'stop');
  assert.equal(usage.prompt_tokens, r.usage.prompt_tokens);
  // The raw stream ends with data: [DONE].
  const raw = await (await post('/v1/chat/completions', { model: 'loom', messages, max_tokens: 3, stream: true })).text();
  assert.ok(raw.trimEnd().endsWith('data: [DONE]'), raw);
});

await check('models, tokenize, detokenize, health', async () => {
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'loom');
  const t = await (await post('/tokenize', { prompt: 'abc' })).json();
  assert.deepEqual(t.tokens, [97, 98, 99]);
  const d = await (await post('/detokenize', { tokens: [97, 98, 99] })).json();
  assert.equal(d.prompt, 'abc');
  assert.equal((await fetch(`${base}/health`)).status, 200);
});

await check('malformed requests get their 4xx error and the server keeps serving', async () => {
  const long = 'x'.repeat(300);
  const cases = [
    ['/v1/completions', '{"model": "loom", "prompt": ', 400, null],
    ['/v1/completions', '[1, 2]', 400, null],
    ['/v1/completions', { model: 'nope', prompt: 'a' }, 400, 'model'],
    ['/v1/completions', { model: 7, prompt: 'a' }, 400, 'model'],
    ['/v1/completions', { model: 'loom' }, 400, 'prompt'],
    ['/v1/completions', { model: 'loom', prompt: 5 }, 400, 'prompt'],
    ['/v1/completions', { model: 'loom', prompt: '' }, 400, 'prompt'],
    ['/v1/completions', { model: 'loom', prompt: [1, -3] }, 400, 'prompt'],
    ['/v1/completions', { model: 'loom', prompt: [99999] }, 400, 'prompt'],
    ['/v1/completions', { model: 'loom', prompt: long }, 400, 'prompt'],
    ['/v1/completions', { model: 'loom', prompt: 'a', max_tokens: 0 }, 400, 'max_tokens'],
    ['/v1/completions', { model: 'loom', prompt: 'a', max_tokens: 'ten' }, 400, 'max_tokens'],
    ['/v1/completions', { model: 'loom', prompt: 'a'.repeat(200), max_tokens: 100 }, 400, 'max_tokens'],
    ['/v1/completions', { model: 'loom', prompt: 'a', temperature: -1 }, 400, 'temperature'],
    ['/v1/completions', { model: 'loom', prompt: 'a', temperature: 'hot' }, 400, 'temperature'],
    ['/v1/completions', { model: 'loom', prompt: 'a', top_p: 1.5 }, 400, 'top_p'],
    ['/v1/completions', { model: 'loom', prompt: 'a', top_k: 2.5 }, 400, 'top_k'],
    ['/v1/completions', { model: 'loom', prompt: 'a', min_p: 2 }, 400, 'min_p'],
    ['/v1/completions', { model: 'loom', prompt: 'a', n: 0 }, 400, 'n'],
    ['/v1/completions', { model: 'loom', prompt: 'a', n: 1000 }, 400, 'n'],
    ['/v1/completions', { model: 'loom', prompt: 'a', logprobs: 50 }, 400, 'logprobs'],
    ['/v1/completions', { model: 'loom', prompt: 'a', stop: [3] }, 400, 'stop'],
    ['/v1/completions', { model: 'loom', prompt: 'a', stream: 'yes' }, 400, 'stream'],
    ['/v1/completions', { model: 'loom', prompt: 'a', stream_options: { include_usage: true } }, 400, 'stream_options'],
    ['/v1/completions', { model: 'loom', prompt: 'a', seed: 'x' }, 400, 'seed'],
    ['/v1/completions', { model: 'loom', prompt: 'a', presence_penalty: 3 }, 400, 'presence_penalty'],
    ['/v1/completions', { model: 'loom', prompt: 'a', frequency_penalty: -2.5 }, 400, 'frequency_penalty'],
    ['/v1/completions', { model: 'loom', prompt: 'a', repetition_penalty: 0 }, 400, 'repetition_penalty'],
    ['/v1/completions', { model: 'loom', prompt: 'a', stop_token_ids: 'x' }, 400, 'stop_token_ids'],
    ['/v1/chat/completions', { model: 'loom' }, 400, 'messages'],
    ['/v1/chat/completions', { model: 'loom', messages: [] }, 400, 'messages'],
    ['/v1/chat/completions', { model: 'loom', messages: [{ content: 'hi' }] }, 400, 'messages[0].role'],
    ['/v1/chat/completions', { model: 'loom', messages: [{ role: 'wizard', content: 'hi' }] }, 400, 'messages[0].role'],
    ['/v1/chat/completions', { model: 'loom', messages: [{ role: 'user' }] }, 400, 'messages[0].content'],
    ['/v1/chat/completions', { model: 'loom', messages: [{ role: 'user', content: 'hi' }], top_logprobs: 3 }, 400, 'top_logprobs'],
    ['/v1/chat/completions', { model: 'loom', messages: [{ role: 'user', content: long }] }, 400, 'messages'],
    ['/v1/chat/completions', { model: 'loom', messages: [{ role: 'user', content: [{ type: 5, text: 'hi' }] }] }, 400,
      'messages[0].content[0]'],
    ['/tokenize', { messages: [{ role: 'user', content: [{ type: ['text'], text: 'hi' }] }] }, 400,
      'messages[0].content[0]'],
    ['/tokenize', { tokens: 1 }, 400, 'prompt'],
    ['/detokenize', { tokens: ['a'] }, 400, 'tokens'],
    ['/load_weights', { path: '/nonexistent/checkpoint' }, 400, null],
    ['/v1/nothing', {}, 404, null],
  ];
  for (const [route, body, status, param] of cases) {
    const r = await post(route, body);
    const what = `${route} ${typeof body === 'string' ? body : JSON.stringify(body)}`;
    assert.equal(r.status, status, what);
    const e = (await r.json()).error;
    for (const key of ['message', 'type', 'param', 'code']) assert.ok(key in e, `${what}: error lacks ${key}`);
    if (param !== null) assert.equal(e.param, param, `${what}: ${e.message}`);
    assert.ok(e.message.length > 0);
  }
  const ok = await client.completions.create({ model: 'loom', prompt: 'still', max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
});

await check('a full queue answers 429', async () => {
  const results = await Promise.all(Array.from({ length: 24 }, () =>
    post('/v1/completions', { model: 'loom', prompt: 'queue', max_tokens: 150, ignore_eos: true }).then(async (r) => {
      const body = await r.json();
      if (r.status === 429) assert.equal(body.error.type, 'rate_limit_error');
      return r.status;
    })));
  assert.ok(results.includes(429), `statuses: ${results}`);
  assert.ok(results.every((s) => s === 200 || s === 429), `statuses: ${results}`);
  await settled();
});

await check('a client that leaves has its request cancelled and its blocks freed', async () => {
  const controller = new AbortController();
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', signal: controller.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'loom', prompt: 'leave', max_tokens: 240, ignore_eos: true, stream: true }) });
  const reader = r.body.getReader();
  await reader.read();
  controller.abort();
  const m = await settled();
  assert.match(m.text, /loom_requests_finished_total \d+/);
});

await check('autocannon: concurrent streams finish with no error and no leaked blocks', async () => {
  const result = await autocannon({
    url: `${base}/v1/completions`, method: 'POST', connections: 4, amount: 80, timeout: 60,
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'loom', prompt: 'load test', max_tokens: 24, stream: true, ignore_eos: true }),
  });
  assert.equal(result.errors, 0);
  assert.equal(result.timeouts, 0);
  assert.equal(result.non2xx, 0);
  assert.ok(result['2xx'] >= 60, `2xx: ${result['2xx']} of ${result.requests.sent} sent`);
  console.log(`autocannon: ${result['2xx']} streams answered 200 (${result.requests.sent} sent), ${result.errors} errors`);
  await settled();
});

await check('new weights between steps, with their version in every response', async () => {
  const r = await (await post('/load_weights', { path: checkpoint, version: 'v2' })).json();
  assert.equal(r.weight_version, 'v2');
  const c = await client.completions.create({ model: 'loom', prompt: 'after', max_tokens: 2 });
  assert.equal(c.weight_version, 'v2');
});

await check('profiling: /start_profile and /stop_profile record the engine steps between them', async () => {
  // Off without --profile-dir: a 400 saying how to turn it on; a POST without a body is told to send one.
  const off = await post('/start_profile', {});
  assert.equal(off.status, 400);
  assert.match((await off.json()).error.message, /--profile-dir/);
  const bodiless = await fetch(`${base}/start_profile`, { method: 'POST' });
  if (bodiless.status === 400) assert.match((await bodiless.json()).error.message, /needs a body|--profile-dir/);
  const traces = path.join(dir, 'serve-traces');
  const profiled = await startServer(['--profile-dir', traces]);
  try {
    const at = (route) => fetch(profiled.base + route,
                                { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    assert.equal((await at('/stop_profile')).status, 400);  // none started
    assert.deepEqual(await (await at('/start_profile')).json(), { profiling: true });
    assert.equal((await at('/start_profile')).status, 400);  // one at a time
    const c = new OpenAI({ baseURL: `${profiled.base}/v1`, apiKey: 'none', maxRetries: 0 });
    await c.completions.create({ model: 'loom', prompt: 'profile me', max_tokens: 3, ignore_eos: true });
    const stopped = await (await at('/stop_profile')).json();
    assert.equal(stopped.trace, path.join(traces, 'serve-1.json'));
    const names = JSON.parse(fs.readFileSync(stopped.trace, 'utf8')).traceEvents.filter((e) => e.ph === 'X')
      .map((e) => e.name);
    assert.equal(names.length, stopped.ranges);
    // The prompt's step and a step per further token, each with its forward (2 blocks) and sampling.
    assert.equal(names.filter((n) => n === 'engine step').length, 3);
    assert.equal(names.filter((n) => n === 'block 1 paged forward').length, 3);
    assert.equal(names.filter((n) => n === 'engine sampling').length, 3);
  } finally {
    profiled.child.kill('SIGKILL');
  }
});

await check('SIGTERM finishes the running request, then the server exits', async () => {
  const response = post('/v1/completions', { model: 'loom', prompt: 'finish me', max_tokens: 200, ignore_eos: true });
  await new Promise((r) => setTimeout(r, 100));
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  child.kill('SIGTERM');
  const body = await (await response).json();
  assert.equal(body.choices[0].finish_reason, 'length');
  assert.equal(body.usage.completion_tokens, 200);
  assert.equal(await exited, 0);
});

if (child.exitCode === null) child.kill('SIGKILL');

// A hybrid model (Mamba-2, attention, MLP and MoE layers) served with its Mamba state pool.
fs.writeFileSync(path.join(dir, 'hybrid.yaml'), `run: {dir: ${dir}/hybrid}
model: {vocab_size: 0, d_model: 32, layers: 4, layer_pattern: 'M*EM', heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: relu2, positions: rope, tied_embeddings: false, max_seq_len: 128, moe_experts: 4, moe_top_k: 2, moe_ffn_size: 24, moe_router: sigmoid, mamba: {state_size: 8, heads: 4, head_dim: 8, groups: 2, conv_kernel: 4, chunk_size: 8}}
data: {tokenizer: byte, train_prefix: ${dir}/data/c_train, seq_len: 32}
train: {steps: 2, global_batch: 4, micro_batch: 4}
`);
execFileSync(loom, ['train', path.join(dir, 'hybrid.yaml')]);
const hybridCheckpoint = path.join(dir, 'hybrid/checkpoints');
const hybrid = await startServer([], hybridCheckpoint);
await check('a hybrid model: n = 2 greedy samples equal `loom generate`, streaming too; state slots freed', async () => {
  const hybridClient = new OpenAI({ baseURL: `${hybrid.base}/v1`, apiKey: 'none', maxRetries: 0 });
  const prompt = 'It is a truth';
  const c = await hybridClient.completions.create({ model: 'loom', prompt, max_tokens: 16, temperature: 0, n: 2,
                                                    logprobs: 1, return_token_ids: true });
  assert.equal(c.choices.length, 2);
  assert.deepEqual(c.choices[1].token_ids, c.choices[0].token_ids);
  assert.deepEqual(c.choices[1].logprobs.token_logprobs, c.choices[0].logprobs.token_logprobs);
  // The byte tokenizer: ids are the bytes `loom generate` prints after the prompt (its end of text, 0, ends both).
  const ids = c.choices[0].token_ids.filter((id) => id !== 0);
  assert.ok(ids.length >= 8, `only ${ids.length} tokens before the end of text`);
  const generated = execFileSync(loom, ['generate', hybridCheckpoint, '--prompt', prompt, '--max-tokens', '16', '--temperature', '0']);
  assert.deepEqual([...generated.subarray(prompt.length, generated.length - 1)], ids);
  const stream = await hybridClient.completions.create({ model: 'loom', prompt, max_tokens: 16, temperature: 0, stream: true,
                                                         return_token_ids: true });
  const streamed = [];
  for await (const chunk of stream) for (const ch of chunk.choices) streamed.push(...(ch.token_ids ?? []));
  assert.deepEqual(streamed, c.choices[0].token_ids);
  const gauges = async () => {
    const text = await (await fetch(`${hybrid.base}/metrics`)).text();
    return (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))[1]);
  };
  let value = await gauges();
  assert.equal(value('loom_mamba_state_slots_total'), 4);
  assert.ok(value('loom_mamba_state_pool_bytes') > 0);
  for (let i = 0; i < 100 && value('loom_mamba_state_slots_in_use') + value('loom_kv_blocks_in_use') !== 0; ++i) {
    await new Promise((r) => setTimeout(r, 50));
    value = await gauges();
  }
  assert.equal(value('loom_mamba_state_slots_in_use'), 0);
  assert.equal(value('loom_kv_blocks_in_use'), 0);
});
hybrid.child.kill('SIGKILL');

// Speculative decoding: a hybrid model with one multi-token prediction depth's weights at two
// depths (Nemotron 3 Super's), trained long enough that its drafts are often right.
fs.writeFileSync(path.join(dir, 'mtp.yaml'), `run: {dir: ${dir}/mtp}
model: {vocab_size: 0, d_model: 32, layers: 4, layer_pattern: 'M*EM', heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: relu2, positions: rope, tied_embeddings: false, max_seq_len: 128, moe_experts: 4, moe_top_k: 2, moe_ffn_size: 24, moe_router: sigmoid, mtp_depths: 2, mtp_use_repeated_layer: true, mamba: {state_size: 8, heads: 4, head_dim: 8, groups: 2, conv_kernel: 4, chunk_size: 8}}
data: {tokenizer: byte, train_prefix: ${dir}/data/c_train, seq_len: 32}
optim: {lr: 1.0e-2}
train: {steps: 40, global_batch: 8, micro_batch: 8}
`);
execFileSync(loom, ['train', path.join(dir, 'mtp.yaml')]);
const mtpCheckpoint = path.join(dir, 'mtp/checkpoints');
await check('--speculative-config mtp: the same greedy tokens and log-probabilities, drafts counted in /metrics', async () => {
  const plain = await startServer([], mtpCheckpoint);
  const drafting = await startServer(['--speculative-config', '{"method": "mtp", "num_speculative_tokens": 2}'],
                                     mtpCheckpoint);
  try {
    const ask = async (server, stream) => {
      const c = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'none', maxRetries: 0 });
      const body = { model: 'loom', prompt: 'It is a truth universally', max_tokens: 24, temperature: 0, logprobs: 1,
                     return_token_ids: true, ignore_eos: true };
      if (!stream) return (await c.completions.create(body)).choices[0];
      const ids = [];
      for await (const chunk of await c.completions.create({ ...body, stream: true })) {
        for (const ch of chunk.choices) ids.push(...(ch.token_ids ?? []));
      }
      return { token_ids: ids };
    };
    const [expected, got] = [await ask(plain, false), await ask(drafting, false)];
    assert.equal(got.token_ids.length, 24);
    assert.deepEqual(got.token_ids, expected.token_ids);
    got.logprobs.token_logprobs.forEach((x, i) => assert.ok(Math.abs(x - expected.logprobs.token_logprobs[i]) < 1e-4,
                                                             `token ${i}: ${x} against ${expected.logprobs.token_logprobs[i]}`));
    assert.deepEqual((await ask(drafting, true)).token_ids, expected.token_ids);
    const text = await (await fetch(`${drafting.base}/metrics`)).text();
    const value = (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))[1]);
    assert.ok(value('loom_spec_decode_draft_tokens_total') > 0);
    assert.ok(value('loom_spec_decode_accepted_tokens_total') > 0, 'no draft was kept');
    assert.ok(value('loom_spec_decode_drafts_total') < 2 * 24, 'no step was saved');
    assert.match(text, /^loom_spec_decode_accepted_tokens_per_position_total\{position="1"\} \d+$/m);
  } finally {
    plain.child.kill('SIGKILL');
    drafting.child.kill('SIGKILL');
  }
  const refusal = (config) => {
    try {
      execFileSync(loom, ['serve', mtpCheckpoint, '--speculative-config', config], { stdio: 'pipe' });
    } catch (e) {
      return e;
    }
    return null;
  };
  const ngram = refusal('{"method": "ngram", "num_speculative_tokens": 2}');
  assert.ok(ngram && ngram.status !== 0, 'method ngram was accepted');
  assert.match(ngram.stderr.toString(), /'method' must be "mtp"/);
  const deep = refusal('{"method": "mtp", "num_speculative_tokens": 3}');
  assert.ok(deep && deep.status !== 0, '3 drafts from 2 depths were accepted');
  assert.match(deep.stderr.toString(), /num_speculative_tokens/);
  assert.match(deep.stderr.toString(), /model\.mtp_depths/);
});

await check('--dtype bf16 serves with bf16 GEMMs; an unknown dtype is refused naming the valid ones', async () => {
  const prompt = 'It is a truth';
  const ask = async (base) => {
    const c = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
    const r = await c.completions.create({ model: 'loom', prompt, max_tokens: 8, temperature: 0, logprobs: 1,
                                           ignore_eos: true });
    return r.choices[0].logprobs.token_logprobs;
  };
  const fp32 = await startServer(['--dtype', 'fp32']);
  const bf16 = await startServer(['--dtype', 'bf16']);
  try {
    const [a, b] = [await ask(fp32.base), await ask(bf16.base)];
    assert.equal(b.length, 8);
    // The same tokens' log-probabilities, rounded differently: close, not equal.
    assert.ok(a.some((x, i) => x !== b[i]), 'bf16 answered exactly as fp32');
  } finally {
    fp32.child.kill('SIGKILL');
    bf16.child.kill('SIGKILL');
  }
  let refused = null;
  try {
    execFileSync(loom, ['serve', checkpoint, '--dtype', 'fp8'], { stdio: 'pipe' });
  } catch (e) {
    refused = e;
  }
  assert.ok(refused && refused.status !== 0, 'loom serve --dtype fp8 was accepted');
  const text = refused.stderr.toString();
  assert.match(text, /--dtype/);
  assert.match(text, /fp8/);
  assert.match(text, /bf16/);
});

fs.rmSync(dir, { recursive: true, force: true });
const failures = failedChecks();
console.log(failures === 0 ? 'all server checks passed' : `${failures} server checks failed`);
process.exit(failures === 0 ? 0 : 1);
