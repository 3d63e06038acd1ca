// Tokenizer throughput: ours (k3_tokenizer_bench, C++, in process) against OpenAI's tiktoken (npm
// `tiktoken` 1.0.22, the WASM build of the Rust crate, in this process), same corpus, same
// pre-chunking (Moonshot's 400k/25k cuts), ordinary-text mode, one thread each. A benchmark, not
// a test.
//
//   node bench/tokenizer_bench.mjs <k3_tokenizer_bench> <model_dir> [--corpus FILE] [--passes N]
//
// The default corpus, <build>/tokenizer-corpus.txt (the build folder holding bench/), is rewritten
// deterministically by bench/tokenizer_corpus.mjs; --corpus FILE uses FILE as it is. Each side
// encodes it once to warm up, then N times (default 5); the best pass is the figure, the median is
// shown beside it. The ids of both sides must agree (count and FNV-1a hash), else exit status 1.
// MB = 10^6 bytes of UTF-8 input. Last line:
//   RESULT tokenizer ours X MB/s tiktoken Y MB/s ratio Z        (Z = ours / tiktoken)
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { KIMI_PATTERN, loadVocabulary, prechunk } from '../tests/node/kimi_k3.mjs';
import { writeCorpus } from './tokenizer_corpus.mjs';

const args = process.argv.slice(2);
const opt = (name, dflt) => { const i = args.indexOf(name); return i >= 0 ? args.splice(i, 2)[1] : dflt; };
const passes = Math.max(1, Number(opt('--passes', 5)));
const corpusOption = opt('--corpus', undefined);
const [benchBin, modelDir] = args;
if (!benchBin || !modelDir || args.length > 2) {
  console.error('usage: node bench/tokenizer_bench.mjs <k3_tokenizer_bench> <model_dir> [--corpus FILE] [--passes N]');
  process.exit(2);
}
const corpusPath = corpusOption ?? path.resolve(path.dirname(benchBin), '..', 'tokenizer-corpus.txt');

// The default corpus is rewritten every run (deterministic, under a second); --corpus is read as is.
const written = corpusOption ? { bytes: fs.statSync(corpusPath).size } : writeCorpus(corpusPath);
console.log(`corpus: ${corpusPath}, ${written.bytes} bytes${written.texts ? ` from ${written.texts} texts` : ''}`);
console.log(`machine: cpu "${os.cpus()[0]?.model ?? 'unknown'}", ${os.cpus().length} cores; node ${process.version}`);

// FNV-1a 32 over each id's four bytes, little-endian: what k3_tokenizer_bench hashes (util/hash.h).
const fnv1a = (h, id) => {
  for (let b = 0; b < 32; b += 8) h = Math.imul(h ^ ((id >>> b) & 0xff), 16777619) >>> 0;
  return h;
};
const median = (xs) => xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)];

// ---- tiktoken (WASM) ----
let theirs = null;
try {
  const { Tiktoken } = await import('tiktoken/lite');
  const { ranksText, specials } = loadVocabulary(modelDir);
  const t0 = performance.now();
  const enc = new Tiktoken(ranksText, specials, KIMI_PATTERN);
  const pkg = new URL('./node_modules/tiktoken/package.json', import.meta.url);
  console.log(`tiktoken ${JSON.parse(fs.readFileSync(pkg, 'utf8')).version}: ` +
              `loaded in ${(performance.now() - t0).toFixed(0)} ms`);
  const text = fs.readFileSync(corpusPath, 'utf8');
  const encodeAll = () => {
    let n = 0, h = 2166136261;
    for (const piece of prechunk(text)) {
      const ids = enc.encode_ordinary(piece);
      n += ids.length;
      for (let i = 0; i < ids.length; i++) h = fnv1a(h, ids[i]);
    }
    return { n, h };
  };
  // The hash loop is outside the timing: one warm-up pass computes it, timed passes only encode.
  const ref = encodeAll();
  const mbs = [];
  for (let p = 0; p < passes; p++) {
    const t = performance.now();
    for (const piece of prechunk(text)) enc.encode_ordinary(piece);
    const dt = (performance.now() - t) / 1000;
    mbs.push(written.bytes / dt / 1e6);
    console.log(`tiktoken pass ${p}: ${dt.toFixed(3)} s, ${mbs.at(-1).toFixed(2)} MB/s`);
  }
  theirs = { best: Math.max(...mbs), median: median(mbs), ids: ref.n, fnv: ref.h.toString(16).padStart(8, '0') };
  enc.free();
} catch (e) {
  if (e.code !== 'ERR_MODULE_NOT_FOUND') throw e;
  console.log('tiktoken: not installed (npm ci --prefix bench --ignore-scripts --no-audit --no-fund); ours only');
}

// ---- ours (C++) ----
const r = spawnSync(benchBin, [modelDir, corpusPath, String(passes)], { encoding: 'utf8', maxBuffer: 1 << 26 });
process.stdout.write(r.stdout ?? '');
if (r.status !== 0) {
  console.error(`${benchBin} failed: ${r.error ?? `exit ${r.status}`}\n${r.stderr ?? ''}`);
  process.exit(1);
}
const m = /^OURS mb_s=([\d.]+) median_mb_s=([\d.]+) bytes=(\d+) ids=(\d+) fnv=([0-9a-f]+)$/m.exec(r.stdout);
if (!m) { console.error('no OURS line in the output'); process.exit(1); }
const ours = { best: Number(m[1]), median: Number(m[2]), ids: Number(m[4]), fnv: m[5] };

if (theirs) {
  const same = theirs.ids === ours.ids && theirs.fnv === ours.fnv;
  console.log(`ids: ours ${ours.ids} (fnv ${ours.fnv}), tiktoken ${theirs.ids} (fnv ${theirs.fnv}): ${same ? 'identical' : 'DIFFERENT'}`);
  console.log(`median: ours ${ours.median.toFixed(2)} MB/s, tiktoken ${theirs.median.toFixed(2)} MB/s`);
  console.log(`RESULT tokenizer ours ${ours.best.toFixed(2)} MB/s tiktoken ${theirs.best.toFixed(2)} MB/s ` +
              `ratio ${(ours.best / theirs.best).toFixed(2)}`);
  if (!same) process.exit(1);
} else {
  console.log(`RESULT tokenizer ours ${ours.best.toFixed(2)} MB/s tiktoken unavailable ratio nan`);
}
