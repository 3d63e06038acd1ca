#!/usr/bin/env bash
# tests/chat_tui_test.sh — `coli chat` driven through tmux (docs/serving.md §3.4).
#
#   tests/chat_tui_test.sh <coli> <k3_synth>
#
# Makes a demo model (random weights, the real tokenizer), starts `coli chat` in a detached
# tmux pane on a private tmux server, and types at it: a turn (footer with tok/s, cached 0), a
# second turn (cached > 0), /retry, a long reply stopped with Ctrl-C ("[interrupted]", the prompt
# comes back), Ctrl-C at an empty prompt (the hint), /new (the next footer shows cached 0), /exit
# (the session ends, exit status 0). Thinking is off (/think off): with random weights a
# thinking reply never leaves the reasoning channel. Replies are capped by --ngen.
# Every wait polls capture-pane every 0.2 s and gives up after CHAT_TEST_TIMEOUT seconds
# (default 90), printing the pane. Exit status: 0 pass, 1 fail (tmux missing is a failure:
# scripts/setup.sh installs it).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 <coli> <k3_synth>" >&2
  exit 2
fi
coli=$(readlink -f "$1")
synth=$(readlink -f "$2")
timeout_s=${CHAT_TEST_TIMEOUT:-90}
if ! command -v tmux >/dev/null; then
  echo "FAIL: tmux is not installed (make setup installs it)"
  exit 1
fi

tmp=$(mktemp -d)
sock="coli-chat-test-$$-$RANDOM"
sess="chat"
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
  echo "----- pane -----" >&2
  pane >&2
  echo "----- stderr -----" >&2
  cat "$tmp/stderr" >&2 2>/dev/null || true
  exit 1
}
# wait_for DESCRIPTION COMMAND...: polls until COMMAND succeeds (it reads "$screen").
wait_for() {
  local what=$1
  shift
  local deadline=$((SECONDS + timeout_s))
  while :; do
    screen=$(pane)
    if "$@"; then return 0; fi
    t has-session -t "$sess" 2>/dev/null ||
      fail "the chat ended (exit status $(cat "$tmp/exit" 2>/dev/null || echo unknown)) while waiting for $what"
    ((SECONDS < deadline)) || fail "timed out after ${timeout_s} s waiting for $what"
    sleep 0.2
  done
}
last_line() { printf '%s\n' "$screen" | sed -e 's/[[:space:]]*$//' -e '/^$/d' | tail -n 1; }
prompt_ready() { [[ "$(last_line)" == ">" ]]; }
count() { printf '%s\n' "$screen" | grep -c -F -- "$1" || true; }
footers() { count "tok/s · prompt"; }
last_footer() { printf '%s\n' "$screen" | grep -F "tok/s · prompt" | tail -n 1; }
# cached count of the last footer
last_cached() { last_footer | sed -n 's/.*(cached \([0-9]*\)).*/\1/p'; }
# the prompt is back and the pane shows every TEXT given
prompt_with() {
  prompt_ready || return 1
  local text
  for text in "$@"; do [[ $screen == *"$text"* ]] || return 1; done
}
replied() { (($(footers) >= $1)) && prompt_ready; }
# waits for footer number $1 and the prompt after it
wait_reply() { wait_for "reply $1 (its footer and the prompt)" replied "$1"; }
# text after the last line "> QUESTION" that is not the status spinner
reply_started() {
  printf '%s\n' "$screen" | awk -v q="> $1" '$0 == q { n = NR } n && NR > n { print }' |
    grep -v -E '^[-|/\\] (waiting|prefill|generating)' | grep -q '[^[:space:]]'
}
send() { t send-keys -t "$sess" -l -- "$1"; t send-keys -t "$sess" Enter; }

"$synth" --preset demo --out "$tmp/model" >/dev/null 2>"$tmp/synth.log" || {
  cat "$tmp/synth.log" >&2
  fail "k3_synth could not make the demo model"
}

t new-session -d -x 200 -y 50 -s "$sess" \
  "'$coli' chat --model '$tmp/model' --token-delay-ms 20 --ngen 48 --temp 0 2>'$tmp/stderr'; echo \$? >'$tmp/exit'"

# Start-up: the model loads, the prompt comes.
wait_for "the model to load and the prompt" prompt_with "loaded "
echo "ok: loaded, prompt shown"

send "/think off"
wait_for "/think off" prompt_with "thinking off"
send "/help"
wait_for "/help" prompt_with "/retry" "/effort"

# Turn 1: a footer with the rate, nothing cached.
send "Hello, who are you?"
wait_reply 1
[[ "$(last_footer)" =~ ^[0-9]+\ tok\ ·\ [0-9.]+\ s\ ·\ [0-9.]+\ tok/s\ ·\ prompt\ [0-9]+\ \(cached\ 0\) ]] ||
  fail "turn 1 footer: '$(last_footer)'"
echo "ok: turn 1: $(last_footer)"

# Turn 2: the history's prefix is reused.
send "Tell me more about that."
wait_reply 2
cached=$(last_cached)
[[ -n "$cached" && "$cached" -gt 0 ]] || fail "turn 2 reused nothing: '$(last_footer)'"
echo "ok: turn 2: $(last_footer)"

# /retry regenerates the last answer (same prompt as turn 2; whether any of it is cached
# depends on the photos left: the one at the prompt boundary cannot serve the same prompt).
send "/retry"
wait_reply 3
[[ $screen == *"regenerating the last answer"* ]] || fail "/retry said nothing"
[[ "$(last_footer)" == *"prompt $(printf '%s\n' "$screen" | grep -F "tok/s · prompt" | sed -n '2s/.*prompt \([0-9]*\).*/\1/p') "* ]] ||
  fail "/retry did not send the turn-2 prompt again: '$(last_footer)'"
echo "ok: /retry: $(last_footer)"

# Ctrl-C in the middle of a reply: the partial answer stays, marked, and the prompt returns.
# A random-weight model may end a reply at once; then another question is asked (3 tries).
interrupted=0
for question in "Write a long poem about the sea." "Please count from one to one hundred." "Explain everything in detail."; do
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
echo "ok: Ctrl-C stopped the reply: $(last_footer)"

# Ctrl-C at an empty prompt: a hint, and the chat stays.
t send-keys -t "$sess" C-c
wait_for "the Ctrl-C hint" prompt_with "Ctrl-C again within 2 s"
sleep 2.2  # a later Ctrl-C would start over; none is sent
t has-session -t "$sess" 2>/dev/null || fail "one Ctrl-C at the prompt ended the chat"
echo "ok: Ctrl-C at the prompt shows the hint"

# /new: a fresh conversation with nothing cached.
n=$(footers)
send "/new"
wait_for "/new" prompt_with "new conversation"
send "Hello, who are you?"
wait_reply $((n + 1))
[[ "$(last_cached)" == 0 ]] || fail "after /new the footer shows cached tokens: '$(last_footer)'"
echo "ok: /new: $(last_footer)"

# /exit ends the program and so the tmux session.
send "/exit"
deadline=$((SECONDS + timeout_s))
while t has-session -t "$sess" 2>/dev/null; do
  ((SECONDS < deadline)) || fail "/exit did not end the chat"
  sleep 0.2
done
status=$(cat "$tmp/exit" 2>/dev/null || echo missing)
[[ "$status" == 0 ]] || {
  cat "$tmp/stderr" >&2 || true
  echo "FAIL: coli chat exited with status $status" >&2
  exit 1
}
if grep -q -i -E "terminate called|exception|abort|segmentation" "$tmp/stderr"; then
  cat "$tmp/stderr" >&2
  echo "FAIL: coli chat wrote a crash to stderr" >&2
  exit 1
fi
echo "ok: /exit ended the session (exit status 0)"
echo "PASS"
