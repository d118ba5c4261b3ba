// Shared set-up of the server tests: no proxy for local HTTP, and a temporary directory holding a
// small byte corpus prepared for training (`DIR/data/c_train`).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export function withoutProxies() {
  for (const k of ['http_proxy', 'https_proxy', 'HTTP_PROXY', 'HTTPS_PROXY', 'all_proxy', 'ALL_PROXY']) delete process.env[k];
}

// A new temporary directory (name starting with `prefix`) with the corpus prepared in it.
export function preparedCorpus(loom, prefix) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  let text = '';
  for (let i = 0; i < 200; ++i) text += `It is a truth universally acknowledged, item ${i * 7}.\n\n`;
  fs.writeFileSync(path.join(dir, 'corpus.txt'), text);
  execFileSync(loom, ['data', 'prepare', path.join(dir, 'corpus.txt'), '--output', path.join(dir, 'data/c'), '--val-fraction', '0']);
  return dir;
}

// Named checks that go on after a failure: check(name, async body) prints ok or FAILED with the
// stack; failures() counts the failed ones.
export function checks() {
  let failed = 0;
  return {
    async check(name, body) {
      try {
        await body();
        console.log(`ok: ${name}`);
      } catch (e) {
        ++failed;
        console.log(`FAILED: ${name}: ${e.stack}`);
      }
    },
    failures: () => failed,
  };
}
