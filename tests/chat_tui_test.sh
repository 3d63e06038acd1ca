#!/usr/bin/env bash
# tests/chat_tui_test.sh — `coli chat` driven through tmux (docs/serving.md §3.4).
#
#   tests/chat_tui_test.sh <coli> <demo-model>
#
# On the build's demo checkpoint (<build>/tests/demo-model: random weights, the real tokenizer;
# read-only here), starts `coli chat` in detached tmux panes on a private tmux server, and types at
# them. Session A (thinking on, --effort none): /help lists every command; /set and /show (a bad
# value names the value and the range); a reply stopped with Ctrl-C ("[interrupted]", the prompt
# comes back) and /retry, which reuses a kept checkpoint (cached > 0); /think off, whose next reply
# still reuses the first question; a follow-up (cached > 0); /undo and /edit, which resume at the
# start of the last question; /save and /load round-trip the conversation and the settings, and a
# missing, damaged or wrong file is an error naming the file and the line or field; Ctrl-C at an
# empty prompt (the hint); /new (the next footer shows cached 0); /exit (exit status 0). Session B
# (--ctx 400, no --ngen): /stats gives a reply budget within what the context leaves, and the 90 %
# context notice appears once per crossing. Replies are capped by --ngen, then by /set max_tokens.
# Nothing asserted depends on the generated text (it differs by ISA: K3_ISA=avx2 runs the same):
# where a reply may end before Ctrl-C, another question is asked.
# Every wait polls capture-pane every 0.2 s and gives up after CHAT_TEST_TIMEOUT seconds
# (default 90), printing the pane. Exit status: 0 pass, 1 fail (tmux missing is a failure:
# scripts/setup.sh installs it). CHAT_TEST_KEEP_GOING=1 records a failed check and goes on
# (the run still fails), to see every check that fails against an older `coli`.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 <coli> <demo-model>" >&2
  exit 2
fi
coli=$(readlink -f "$1")
model=$(readlink -f "$2")
timeout_s=${CHAT_TEST_TIMEOUT:-90}
keep_going=${CHAT_TEST_KEEP_GOING:-0}
((keep_going)) && set +e
if ! command -v tmux >/dev/null; then
  echo "FAIL: tmux is not installed (make setup installs it)"
  exit 1
fi

tmp=$(mktemp -d)
sock="coli-chat-test-$$-$RANDOM"
sess="chat"
failures=0
unset TMUX
export LANG=C.UTF-8 LC_ALL=C.UTF-8
t() { tmux -L "$sock" "$@"; }
cleanup() {
  t kill-server >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# The whole pane, scroll-back included, wrapped lines joined.
pane() { t capture-pane -p -J -S - -t "$sess" 2>/dev/null || true; }
fail() {
  echo "FAIL: $*" >&2
  if ((keep_going)); then
    failures=$((failures + 1))
    return 0
  fi
  echo "----- pane -----" >&2
  pane >&2
  echo "----- stderr -----" >&2
  cat "$tmp/stderr.$sess" >&2 2>/dev/null || true
  exit 1
}
# "ok: ..." when no check failed since the last ok (CHAT_TEST_KEEP_GOING=1 goes on after one).
reported=0
ok() {
  ((failures == reported)) && echo "ok: $*"
  reported=$failures
}
# wait_for DESCRIPTION COMMAND...: polls until COMMAND succeeds (it reads "$screen"); 1 when it
# gave up (only with CHAT_TEST_KEEP_GOING=1: otherwise the run ends there).
wait_for() {
  local what=$1
  shift
  local deadline=$((SECONDS + timeout_s))
  while :; do
    screen=$(pane)
    if "$@"; then return 0; fi
    if ! t has-session -t "$sess" 2>/dev/null; then
      fail "the chat ended (exit status $(cat "$tmp/exit.$sess" 2>/dev/null || echo unknown)) while waiting for $what"
      exit 1
    fi
    if ((SECONDS >= deadline)); then
      fail "timed out after ${timeout_s} s waiting for $what"
      return 1
    fi
    sleep 0.2
  done
}
last_line() { printf '%s\n' "$screen" | sed -e 's/[[:space:]]*$//' -e '/^$/d' | tail -n 1; }
prompt_ready() { [[ "$(last_line)" == ">" ]]; }
count() { printf '%s\n' "$screen" | grep -c -F -- "$1" || true; }
footers() { count "tok/s · prompt"; }
last_footer() { printf '%s\n' "$screen" | grep -F "tok/s · prompt" | tail -n 1; }
# cached count and prompt size of the last footer
last_cached() { last_footer | sed -n 's/.*(cached \([0-9]*\)).*/\1/p'; }
last_prompt() { last_footer | sed -n 's/.* prompt \([0-9]*\) (cached.*/\1/p'; }
# the last status line above the prompt: "think off · 3 turns · context 123/8192"
last_header() { printf '%s\n' "$screen" | grep -E '^think (on|off)' | tail -n 1; }
header_turns() { last_header | sed -n 's/.* \([0-9]*\) turns\{0,1\} · .*/\1/p'; }
header_used() { last_header | sed -n 's/.*context \([0-9]*\)\/.*/\1/p'; }
# the pane after the last line equal to "> $1" (what a command printed)
after() { printf '%s\n' "$screen" | awk -v q="> $1" '$0 == q { n = NR; out = "" } n && NR > n { out = out $0 "\n" } END { printf "%s", out }'; }
# the prompt is back and the pane shows every TEXT given
prompt_with() {
  prompt_ready || return 1
  local text
  for text in "$@"; do [[ $screen == *"$text"* ]] || return 1; done
}
# the prompt is back and the output of command $1 shows every TEXT given
answered_with() {
  prompt_ready || return 1
  local out text
  out=$(after "$1")
  shift
  for text in "$@"; do [[ $out == *"$text"* ]] || return 1; done
}
replied() { (($(footers) >= $1)) && prompt_ready; }
# waits for footer number $1 and the prompt after it
wait_reply() { wait_for "reply $1 (its footer and the prompt)" replied "$1"; }
# text after the last line "> QUESTION" that is not the status spinner
reply_started() {
  printf '%s\n' "$screen" | awk -v q="> $1" '$0 == q { n = NR } n && NR > n { print }' |
    grep -v -E '^[-|/\\] (waiting|prefill|generating|thinking)' | grep -q '[^[:space:]]'
}
send() { t send-keys -t "$sess" -l -- "$1"; t send-keys -t "$sess" Enter; }
# start NAME ARGS...: `coli chat ARGS` in a new tmux session NAME (the current one from now on)
start() {
  sess=$1
  shift
  local args="" a
  for a in "$@"; do args+=" '$a'"; done
  t new-session -d -x 200 -y 50 -s "$sess" \
    "'$coli' chat$args 2>'$tmp/stderr.$sess'; echo \$? >'$tmp/exit.$sess'"
}
# /exit ends the program and so the tmux session, with exit status 0 and no crash on stderr.
finish() {
  send "/exit"
  local deadline=$((SECONDS + timeout_s))
  while t has-session -t "$sess" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "/exit did not end the chat"
    ((SECONDS < deadline)) || return 0
    sleep 0.2
  done
  local status
  status=$(cat "$tmp/exit.$sess" 2>/dev/null || echo missing)
  [[ "$status" == 0 ]] || {
    cat "$tmp/stderr.$sess" >&2 || true
    fail "coli chat ($sess) exited with status $status"
  }
  if grep -q -i -E "terminate called|exception|abort|segmentation" "$tmp/stderr.$sess"; then
    cat "$tmp/stderr.$sess" >&2
    fail "coli chat ($sess) wrote a crash to stderr"
  fi
  ok "/exit ended $sess (exit status 0)"
}

[[ -f "$model/config.json" ]] || {
  fail "the demo model is missing at $model (build the k3_test_demo_model target)"
  exit 1
}

# ---- Session A ------------------------------------------------------------------------------
# Thinking on (with random weights a thinking reply never leaves the reasoning channel, which
# streams like any reply), --effort none: no effort message leads the prompt (see /think below).
start A --model "$model" --token-delay-ms 30 --ngen 32 --temp 0 --effort none
wait_for "the model to load and the prompt" prompt_with "loaded "
ok "loaded, prompt shown"

# /help lists every command.
send "/help"
wait_for "/help listing every command" answered_with "/help" /new /retry /undo /edit /system \
  "/think on|off" /effort /set /show /stats /save /load /help /exit &&
  ok "/help lists every command"

# /set and /show; a bad value is refused naming the value and the range.
send "/set temp 0.3"
wait_for "/set temp 0.3" answered_with "/set temp 0.3" "temp 0.3"
send "/show"
wait_for "/show" answered_with "/show" "max_tokens" &&
  { after "/show" | grep -q -E '^temp +0\.3$' || fail "/show does not show temp 0.3: $(after /show)"; } &&
  ok "/set temp 0.3, /show shows it"
send "/set temp abc"
wait_for "/set temp abc refused" answered_with "/set temp abc" "error: /set temp abc" "[0, 100]" &&
  ok "/set temp abc: $(after "/set temp abc" | head -n 1)"
send "/set top_p 2"
wait_for "/set top_p 2 refused" answered_with "/set top_p 2" "error: /set top_p 2" "(0, 1]" &&
  ok "/set top_p 2 refused"
send "/set temp 0"
wait_for "/set temp 0" answered_with "/set temp 0" "temp 0"

# A reply stopped with Ctrl-C: the partial answer stays, marked, and the prompt returns. Then
# /retry asks the same prompt again. It is the first turn of the conversation, which has no anchor
# (with no system prompt the last message starts at 0), so what serves it is the checkpoint the
# chat keeps at the end of the question: only the generation prompt is read again (cached > 0).
# A random-weight model may end a reply at once; then /new and another question (3 tries).
interrupted=0
for question in "Write a long poem about the sea." "Please count from one to one hundred." "Explain everything in detail."; do
  if ((interrupted == 0 && $(count "[interrupted]") == 0 && $(footers) > 0)); then
    send "/new"
    wait_for "/new" answered_with "/new" "new conversation"
  fi
  before_footers=$(footers)
  before_marks=$(count "[interrupted]")
  send "$question"
  # streaming started: text after the question line that is not the status spinner
  wait_for "the reply to '$question' to start" reply_started "$question"
  t send-keys -t "$sess" C-c
  wait_reply $((before_footers + 1))
  if (($(count "[interrupted]") > before_marks)); then
    interrupted=1
    break
  fi
  echo "note: the reply to '$question' ended before Ctrl-C; trying another"
done
((interrupted)) || fail "no reply could be interrupted"
t has-session -t "$sess" 2>/dev/null || fail "the chat exited on Ctrl-C during a reply"
ok "Ctrl-C stopped the reply: $(last_footer)"
turn1_prompt=$(last_prompt)
# From here on replies are short: what is checked is the prompt side.
send "/set max_tokens 8"
wait_for "/set max_tokens 8" answered_with "/set max_tokens 8" "max_tokens 8"
n=$(footers)
send "/retry"
wait_reply $((n + 1))
[[ $screen == *"regenerating the last answer"* ]] || fail "/retry said nothing"
[[ "$(last_prompt)" == "$turn1_prompt" ]] || fail "/retry did not send the same prompt: '$(last_footer)'"
retry_cached=$(last_cached)
[[ -n "$retry_cached" && "$retry_cached" -gt 0 ]] ||
  fail "/retry after an interrupted first turn re-read the whole prompt: '$(last_footer)'"
ok "/retry: $(last_footer)"

# /think off, then a turn. Every earlier answer now renders without its think block, so the new
# prompt shares with what the engine holds only the first question and the opening of the first
# answer (<|open|>message role="assistant"<|sep|><|open|>, then "response" where it was "think").
# No effort message leads the prompt (--effort none), so the checkpoint kept at the end of the
# first question serves: the same one /retry resumed from.
send "/think off"
wait_for "/think off" answered_with "/think off" "thinking off"
n=$(footers)
send "Tell me more about that."
wait_reply $((n + 1))
[[ "$(last_cached)" -gt 0 && "$(last_cached)" == "$retry_cached" ]] ||
  fail "after /think off the reply did not resume at the end of the first question ($retry_cached): '$(last_footer)'"
ok "/think off, next turn: $(last_footer)"

# A follow-up: the history's prefix is reused.
n=$(footers)
send "And what else?"
wait_reply $((n + 1))
cached=$(last_cached)
[[ -n "$cached" && "$cached" -gt 0 ]] || fail "the follow-up reused nothing: '$(last_footer)'"
ok "follow-up: $(last_footer)"

# /undo drops the last question and its answer; the next question resumes at the checkpoint kept
# at the start of the dropped question. /edit replaces the last question and answers it again,
# from the same checkpoint.
turns=$(header_turns)
send "/undo"
wait_for "/undo" answered_with "/undo" "removed the last question and its answer"
[[ "$(header_turns)" == $((turns - 1)) ]] || fail "/undo left the turns at '$(last_header)' (was $turns)"
n=$(footers)
send "Something different, then."
wait_reply $((n + 1))
undo_cached=$(last_cached)
[[ -n "$undo_cached" && "$undo_cached" -gt 0 && "$(last_footer)" == *"restored checkpoint @$undo_cached"* ]] ||
  fail "the question after /undo did not resume at a kept checkpoint: '$(last_footer)'"
ok "/undo, next turn: $(last_footer)"
n=$(footers)
send "/edit Something else entirely."
wait_reply $((n + 1))
[[ $screen == *"answering the edited question"* ]] || fail "/edit said nothing"
[[ "$(last_cached)" == "$undo_cached" && "$(header_turns)" == "$turns" ]] ||
  fail "/edit did not resume at the start of the last question ($undo_cached) with $turns turns: '$(last_footer)' '$(last_header)'"
ok "/edit: $(last_footer)"

# /save and /load: the conversation and the settings come back (top_k 7 saved, 3 after).
send "/set top_k 7"
wait_for "/set top_k 7" answered_with "/set top_k 7" "top_k 7"
send "/save $tmp/conv.json"
wait_for "/save" answered_with "/save $tmp/conv.json" "saved"
saved_turns=$(header_turns)
[[ "$(grep -c '"role": "user"' "$tmp/conv.json")" == "$saved_turns" ]] ||
  fail "/save wrote $(grep -c '"role": "user"' "$tmp/conv.json") questions for $saved_turns turns"
send "/set top_k 3"
wait_for "/set top_k 3" answered_with "/set top_k 3" "top_k 3"
n=$(footers)
send "One more question."
wait_reply $((n + 1))
more_prompt=$(last_prompt)
send "/load $tmp/conv.json"
wait_for "/load" answered_with "/load $tmp/conv.json" "loaded" "and the settings"
[[ "$(header_turns)" == "$saved_turns" ]] || fail "/load left '$(last_header)', not $saved_turns turns"
send "/show"
wait_for "/show" answered_with "/show" "max_tokens" &&
  { after "/show" | grep -q -E '^top_k +7$' || fail "/load did not restore top_k 7: $(after /show)"; }
n=$(footers)
send "One more question."
wait_reply $((n + 1))
[[ "$(last_prompt)" == "$more_prompt" ]] ||
  fail "after /load the same question made a prompt of $(last_prompt) tokens, not $more_prompt"
ok "/save + /load round-trip ($saved_turns turns, top_k 7; the same prompt again: $(last_footer))"

# /load of a missing, a damaged and a wrong file: errors naming the file and the line or field;
# the conversation stays.
turns=$(header_turns)
send "/load $tmp/missing.json"
wait_for "/load of a missing file" answered_with "/load $tmp/missing.json" \
  "error: cannot read $tmp/missing.json"
printf '{\n  "messages": [\n    {"role": "user", "content": "hi"},,\n  ]\n}\n' >"$tmp/damaged.json"
send "/load $tmp/damaged.json"
wait_for "/load of a damaged file" answered_with "/load $tmp/damaged.json" \
  "error: $tmp/damaged.json: line 3"
printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}\n' >"$tmp/wrong.json"
send "/load $tmp/wrong.json"
wait_for "/load of a wrong field" answered_with "/load $tmp/wrong.json" \
  "error: $tmp/wrong.json: messages[1].role"
[[ "$(header_turns)" == "$turns" ]] || fail "a failed /load changed the conversation: '$(last_header)'"
ok "/load errors name the file and the line or field"

# Ctrl-C at an empty prompt: a hint, and the chat stays.
t send-keys -t "$sess" C-c
wait_for "the Ctrl-C hint" prompt_with "Ctrl-C again within 2 s"
sleep 2.2  # a later Ctrl-C would start over; none is sent
t has-session -t "$sess" 2>/dev/null || fail "one Ctrl-C at the prompt ended the chat"
ok "Ctrl-C at the prompt shows the hint"

# /new: a fresh conversation with nothing cached.
n=$(footers)
send "/new"
wait_for "/new" prompt_with "new conversation"
send "Hello, who are you?"
wait_reply $((n + 1))
[[ "$(last_cached)" == 0 ]] || fail "after /new the footer shows cached tokens: '$(last_footer)'"
ok "/new: $(last_footer)"
finish

# ---- Session B: a small context, no --ngen --------------------------------------------------
start B --model "$model" --ctx 400 --no-think --temp 0
wait_for "the model to load and the prompt" prompt_with "loaded "

# /stats: the reply budget is what the context leaves (max_tokens is 16384 here), and says so.
send "/stats"
wait_for "/stats" answered_with "/stats" "reply budget"
line=$(after "/stats" | grep -F "reply budget" | head -n 1)
used=$(sed -n 's/.*context \([0-9]*\)\/.*/\1/p' <<<"$line")
capacity=$(sed -n 's/.*context [0-9]*\/\([0-9]*\) .*/\1/p' <<<"$line")
budget=$(sed -n 's/.*reply budget \([0-9]*\) tok.*/\1/p' <<<"$line")
[[ -n "$budget" && -n "$capacity" && -n "$used" ]] && ((budget <= capacity - used)) &&
  [[ $line == *"limited by the context"* ]] ||
  fail "/stats: the reply budget is not within the context: '$line'"
ok "/stats: $line"

# The 90 % notice: a saved conversation of about half the context, then questions until it
# fills. A prompt is refused only when the conversation and the next question with its tags
# (about 30 tokens, less than 10 % of 400) exceed the context, i.e. when the conversation is
# already above 90 %: it crosses 90 % with a reply before any prompt is refused.
send "/set max_tokens 4"
wait_for "/set max_tokens 4" answered_with "/set max_tokens 4" "max_tokens 4"
{
  printf '{"messages": ['
  for i in 1 2 3 4 5; do
    ((i > 1)) && printf ','
    printf '{"role": "user", "content": "Tell me about ship number %d."},' "$i"
    printf '{"role": "assistant", "content": "Ships sail on the sea, number %d."}' "$i"
  done
  printf ']}\n'
} >"$tmp/half.json"
send "/load $tmp/half.json"
wait_for "/load" answered_with "/load $tmp/half.json" "loaded 10 messages"
(($(header_used) < 360)) || fail "the loaded conversation already fills 90 %: '$(last_header)'"
notice="context tokens ("
noticed=0
for i in $(seq 1 20); do
  n=$(footers)
  refusals=$(count "and the context holds")
  send "Tell me more about the sea, please."
  wait_for "turn $i (a footer or a refusal)" eval '(($(footers) > n || $(count "and the context holds") > refusals)) && prompt_ready'
  (($(count "$notice") == 0)) || { noticed=1; break; }
  (($(count "and the context holds") == refusals)) || break
done
((noticed)) || fail "no notice before the context was full: '$(last_header)'"
note_line=$(printf '%s\n' "$screen" | grep -F "$notice" | tail -n 1)
[[ $note_line == *"of 400 context tokens"* && $note_line == *"/clear"* && $note_line == *"--ctx"* ]] ||
  fail "the notice does not say the tokens used, the context and what to do: '$note_line'"
(($(header_used) >= 360)) || fail "the notice came below 90 %: '$(last_header)'"
ok "the 90 % notice: $note_line"
# Once per crossing: not again at the next prompt; again after going below 90 % (/undo) and
# crossing once more (the same question: the same greedy reply).
send "/show"
wait_for "/show" answered_with "/show" "max_tokens"
(($(count "$notice") == 1)) || fail "the notice came again without a new crossing"
send "/undo"
wait_for "/undo" answered_with "/undo" "removed the last question"
(($(header_used) < 360)) || fail "/undo did not go below 90 %: '$(last_header)'"
n=$(footers)
send "Tell me more about the sea, please."
wait_reply $((n + 1))
(($(count "$notice") == 2)) || fail "no notice on the second crossing"
ok "the notice comes once per crossing"
finish

if ((failures > 0)); then
  echo "FAIL: $failures checks failed"
  exit 1
fi
echo "PASS"
