// Greedy generation of a GGUF export in llama.cpp (node-llama-cpp's prebuilt CPU binaries): for
// each prompt of PROMPTS.json (an array of strings), llama.cpp's tokens of the prompt, its
// detokenization of them and the generated token ids, printed as one JSON array, to compare with
// loom's tokenizer and `loom generate`. Each prompt runs in a fresh context.
// Usage: node gguf_llama_cpp.mjs NPM_DIR MODEL.gguf PROMPTS.json MAX_TOKENS   (exit 77: not installed)
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [npmDir, modelPath, promptsFile, maxTokens] = process.argv.slice(2);
const prompts = JSON.parse(fs.readFileSync(promptsFile, 'utf8'));
const entry = path.resolve(npmDir, 'node_modules/node-llama-cpp/dist/index.js');
if (!fs.existsSync(entry)) {
  console.log(`skipped: node-llama-cpp is not installed in ${npmDir} (run scripts/setup.sh)`);
  process.exit(77);
}
const { getLlama } = await import(pathToFileURL(entry).href);
const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' });
const model = await llama.loadModel({ modelPath });
const results = [];
for (const prompt of prompts) {
  const context = await model.createContext({ contextSize: model.trainContextSize, threads: 1, batchSize: 128 });
  const sequence = context.getSequence();
  const input = model.tokenize(prompt);
  const generated = [];
  for await (const token of sequence.evaluate(input, { temperature: 0 })) {
    if (model.isEogToken(token)) break;
    generated.push(token);
    if (generated.length >= Number(maxTokens)) break;
  }
  results.push({ prompt: Array.from(input), text: model.detokenize(input), generated });
  await context.dispose();
}
console.log(JSON.stringify(results));
await model.dispose();
process.exit(0);
