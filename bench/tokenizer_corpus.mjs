// The multilingual tokenizer-benchmark corpus, written deterministically:
//
//   node bench/tokenizer_corpus.mjs [out_file] [bytes]
//   (defaults: build/tokenizer-corpus.txt, 8,000,000 bytes)
//
// The texts of tests/data/text/tokenizer_cases.jsonl and the message contents (strings, text
// parts, reasoning) of tests/data/text/chat_cases.jsonl, without the long_ cases of either (their
// 25,000-character runs measure BPE on one giant piece, not throughput), shuffled with a fixed
// seed (a new shuffle per round), one text per line, repeated until `bytes` of UTF-8.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { mulberry32 } from '../tests/node/kimi_k3.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const DEFAULT_CORPUS_BYTES = 8_000_000;

function corpusTexts() {
  const texts = [];
  const lines = (f) => fs.readFileSync(path.join(ROOT, 'tests/data/text', f), 'utf8').split('\n').filter((l) => l.trim());
  for (const line of lines('tokenizer_cases.jsonl')) {
    const c = JSON.parse(line);
    if (typeof c.text === 'string' && c.text && !c.name.startsWith('long_')) texts.push(c.text);
  }
  for (const line of lines('chat_cases.jsonl')) {
    const c = JSON.parse(line);
    if (c.name.startsWith('long_')) continue;
    for (const m of c.messages ?? []) {
      if (typeof m.content === 'string' && m.content) texts.push(m.content);
      if (Array.isArray(m.content)) for (const p of m.content) if (typeof p?.text === 'string' && p.text) texts.push(p.text);
      if (typeof m.reasoning_content === 'string' && m.reasoning_content) texts.push(m.reasoning_content);
    }
  }
  return texts;
}


export function makeCorpus(bytes = DEFAULT_CORPUS_BYTES) {
  const texts = corpusTexts();
  const rand = mulberry32(0x6b33_c0de);
  const parts = [];
  let size = 0;
  while (size < bytes) {
    const order = texts.slice();
    for (let i = order.length - 1; i > 0; i--) {
      const j = Math.floor(rand() * (i + 1));
      [order[i], order[j]] = [order[j], order[i]];
    }
    for (const t of order) {
      parts.push(t, '\n');
      size += Buffer.byteLength(t, 'utf8') + 1;
      if (size >= bytes) break;
    }
  }
  return { text: parts.join(''), texts: texts.length };
}

export function writeCorpus(out, bytes = DEFAULT_CORPUS_BYTES) {
  const { text, texts } = makeCorpus(bytes);
  fs.mkdirSync(path.dirname(out), { recursive: true });
  fs.writeFileSync(out, text);
  return { bytes: Buffer.byteLength(text, 'utf8'), texts };
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const out = process.argv[2] ?? path.join(ROOT, 'build/tokenizer-corpus.txt');
  const r = writeCorpus(out, Number(process.argv[3] ?? DEFAULT_CORPUS_BYTES));
  console.log(`${out}: ${r.bytes} bytes from ${r.texts} texts`);
}
