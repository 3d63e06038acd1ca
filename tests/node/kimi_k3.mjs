// The Kimi K3 tokenizer's definition as OpenAI's tiktoken needs it (docs/tokenizer.md §1.3, §2.1,
// §2.5): the split pattern, the 256 special tokens, and Moonshot's pre-chunking. No npm imports:
// shared by tests/node/tiktoken_fuzz.mjs and bench/tokenizer_bench.mjs.
import fs from 'node:fs';
import path from 'node:path';

// TikTokenTokenizer.pat_str, exactly (fancy-regex: `&&` intersection, \p{Han} = Script=Han).
export const KIMI_PATTERN = String.raw`[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

export const SLICE_CODE_POINTS = 400_000;  // TIKTOKEN_MAX_ENCODE_CHARS
export const MAX_RUN = 25_000;             // MAX_NO_WHITESPACES_CHARS

// tiktoken.model's text, its lines, and the special-token table: ids [ranks, ranks + 256), named
// from tokenizer_config.json added_tokens_decoder, the others `<|reserved_token_<id>|>`.
export function loadVocabulary(modelDir) {
  const ranksText = fs.readFileSync(path.join(modelDir, 'tiktoken.model'), 'utf8');
  const config = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8'));
  const rankLines = ranksText.split('\n').filter(Boolean);
  const specials = {};
  for (let id = rankLines.length; id < rankLines.length + 256; id++) {
    specials[config.added_tokens_decoder?.[String(id)]?.content ?? `<|reserved_token_${id}|>`] = id;
  }
  return { ranksText, rankLines, baseVocabSize: rankLines.length, specials };
}

// Python str.isspace (differs from \s: adds U+001C–001F).
export function isPySpace(cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp === 0x85 || cp === 0xa0 ||
         cp === 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp === 0x2028 || cp === 0x2029 ||
         cp === 0x202f || cp === 0x205f || cp === 0x3000;
}

// TikTokenTokenizer._encode_text_piece's cuts: slices of 400,000 code points, each cut again
// before the code point that would make a run of one isspace class 25,001 long. JavaScript
// strings are UTF-16, so this walks code points, not string indices.
export function prechunk(text) {
  const pieces = [];
  let pieceStart = 0, inSlice = 0, runSpace = false, runLen = 0;
  for (let i = 0; i < text.length;) {
    const cp = text.codePointAt(i);
    if (inSlice === SLICE_CODE_POINTS) {
      pieces.push(text.slice(pieceStart, i));
      pieceStart = i;
      inSlice = 0;
    }
    const space = isPySpace(cp);
    if (inSlice === 0) { runSpace = space; runLen = 0; }
    if (space !== runSpace) {
      runSpace = space;
      runLen = 1;
    } else if (++runLen > MAX_RUN) {
      pieces.push(text.slice(pieceStart, i));
      pieceStart = i;
      runLen = 1;
    }
    inSlice++;
    i += cp > 0xffff ? 2 : 1;
  }
  if (pieceStart < text.length) pieces.push(text.slice(pieceStart));
  return pieces;
}

// A small seeded PRNG (mulberry32): the same sequence on every run and machine. Returns a
// function giving floats in [0, 1).
export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
