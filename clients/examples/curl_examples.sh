#!/usr/bin/env bash
# curl examples against a running specdec server.
#
#   bash clients/examples/curl_examples.sh            # runs every example in turn
#   bash clients/examples/curl_examples.sh chat       # only one of: health models completion stream chat chat-stream no-spec metrics
#
# Environment: SPECDEC_URL (default http://127.0.0.1:8000), SPECDEC_API_KEY (sent as a Bearer
# token when set; needed when the server was started with --api-key), SPECDEC_MODEL (default: the
# first model listed by /v1/models).
set -euo pipefail

URL="${SPECDEC_URL:-http://127.0.0.1:8000}"
AUTH=()
if [[ -n "${SPECDEC_API_KEY:-}" ]]; then
  AUTH=(-H "Authorization: Bearer ${SPECDEC_API_KEY}")
fi

model() {
  if [[ -n "${SPECDEC_MODEL:-}" ]]; then
    printf '%s' "$SPECDEC_MODEL"
  else
    curl -fsS "${AUTH[@]}" "$URL/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"], end="")'
  fi
}

section() { printf '\n===== %s =====\n' "$1"; }

health() {
  section "GET /health (200 = ready, 503 = loading)"
  curl -sS -w '\nHTTP %{http_code}\n' "$URL/health"
}

models() {
  section "GET /v1/models"
  curl -fsS "${AUTH[@]}" "$URL/v1/models"
  echo
}

completion() {
  section "POST /v1/completions (non-streamed; note the \"speculative\" object next to \"usage\")"
  curl -fsS "${AUTH[@]}" "$URL/v1/completions" \
    -H "Content-Type: application/json" \
    -d "{\"model\": \"$(model)\", \"prompt\": \"def fibonacci(n):\", \"max_tokens\": 48, \"temperature\": 0}"
  echo
}

stream() {
  section "POST /v1/completions, streamed (SSE; ends with data: [DONE])"
  curl -fsS -N "${AUTH[@]}" "$URL/v1/completions" \
    -H "Content-Type: application/json" \
    -d "{\"model\": \"$(model)\", \"prompt\": \"The capital of France is\", \"max_tokens\": 32,
         \"temperature\": 0, \"stream\": true, \"stream_options\": {\"include_usage\": true}}"
}

chat() {
  section "POST /v1/chat/completions (non-streamed)"
  curl -fsS "${AUTH[@]}" "$URL/v1/chat/completions" \
    -H "Content-Type: application/json" \
    -d "{\"model\": \"$(model)\", \"max_tokens\": 64, \"temperature\": 0,
         \"messages\": [{\"role\": \"user\", \"content\": \"What is speculative decoding, in one sentence?\"}]}"
  echo
}

chat_stream() {
  section "POST /v1/chat/completions, streamed"
  curl -fsS -N "${AUTH[@]}" "$URL/v1/chat/completions" \
    -H "Content-Type: application/json" \
    -d "{\"model\": \"$(model)\", \"max_tokens\": 64, \"temperature\": 0.7, \"seed\": 1, \"stream\": true,
         \"messages\": [{\"role\": \"user\", \"content\": \"Write a haiku about autumn.\"}]}"
}

no_spec() {
  section "Per-request extensions: speculation off, then k = 2"
  curl -fsS "${AUTH[@]}" "$URL/v1/completions" \
    -H "Content-Type: application/json" \
    -d "{\"model\": \"$(model)\", \"prompt\": \"def add(a, b):\", \"max_tokens\": 24, \"temperature\": 0,
         \"speculative\": false}"
  echo
  curl -fsS "${AUTH[@]}" "$URL/v1/completions" \
    -H "Content-Type: application/json" \
    -d "{\"model\": \"$(model)\", \"prompt\": \"def add(a, b):\", \"max_tokens\": 24, \"temperature\": 0,
         \"num_speculative_tokens\": 2}"
  echo
}

metrics() {
  section "GET /metrics (Prometheus text; first lines)"
  local body
  body="$(curl -fsS "$URL/metrics")"
  sed -n '1,40p' <<<"$body"
}

main() {
  if [[ $# -eq 0 ]]; then
    set -- health models completion stream chat chat-stream no-spec metrics
  fi
  for name in "$@"; do
    case "$name" in
      health) health ;;
      models) models ;;
      completion) completion ;;
      stream) stream ;;
      chat) chat ;;
      chat-stream) chat_stream ;;
      no-spec) no_spec ;;
      metrics) metrics ;;
      *) echo "unknown example: $name" >&2; exit 2 ;;
    esac
  done
}

main "$@"
