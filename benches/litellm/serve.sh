#!/usr/bin/env bash
# Run the LiteLLM proxy in the foreground as a plain pass-through to one
# OpenAI-compatible upstream, for the rollcall benchmark.
#
#   serve.sh UPSTREAM_BASE_URL PORT [VENV_DIR]
#
#   UPSTREAM_BASE_URL  e.g. http://127.0.0.1:8000/v1 (include the /v1)
#   PORT               port to listen on (127.0.0.1 only)
#   VENV_DIR           venv with litellm[proxy] installed
#                      (default: .venv-litellm in the repo root)
#
# Any model name the client sends is forwarded to openai/<model> at the
# upstream (wildcard route), with a dummy upstream api key.
#
# Before exec'ing the proxy it prints two lines to stdout:
#   LITELLM_MASTER_KEY=<key>      use as "Authorization: Bearer <key>"
#   LITELLM_CONFIG_DIR=<dir>      temp dir holding the config; the caller
#                                 may delete it once the proxy has exited
# Then it execs litellm (1 uvicorn worker), so the script's pid is the
# proxy's pid: killing it stops the proxy. Ready when
#   GET http://127.0.0.1:PORT/health/liveliness  returns 200.
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
    echo "usage: $0 UPSTREAM_BASE_URL PORT [VENV_DIR]" >&2
    exit 2
fi

upstream=$1
port=$2
script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd -- "$script_dir/../.." && pwd)
venv=${3:-$repo_root/.venv-litellm}

if [[ ! "$port" =~ ^[0-9]+$ ]]; then
    echo "serve.sh: PORT must be a number, got '$port'" >&2
    exit 2
fi
if [[ ! -x "$venv/bin/litellm" ]]; then
    echo "serve.sh: no litellm in $venv; install with:" >&2
    echo "  python3 -m venv $venv && $venv/bin/pip install -r $script_dir/requirements.txt" >&2
    exit 1
fi
venv=$(cd -- "$venv" && pwd)

# Random master key; LiteLLM refuses to start the proxy without one and
# expects virtual/master keys to start with "sk-".
master_key="sk-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"

workdir=$(mktemp -d "${TMPDIR:-/tmp}/rollcall-litellm.XXXXXX")
config=$workdir/config.yaml

# JSON strings are valid YAML scalars: quote the upstream URL safely.
upstream_q=$(printf '%s' "$upstream" | sed 's/\\/\\\\/g; s/"/\\"/g')

cat >"$config" <<EOF
model_list:
  # Wildcard route: any requested model name is sent as openai/<name>
  # to the upstream; the model field reaches the upstream unchanged.
  - model_name: "*"
    litellm_params:
      model: "openai/*"
      api_base: "$upstream_q"
      api_key: "sk-dummy-upstream-key"

litellm_settings:
  callbacks: []
  success_callback: []
  failure_callback: []
  service_callback: []
  turn_off_message_logging: true
  request_timeout: 600
  num_retries: 0

router_settings:
  num_retries: 0

general_settings:
  master_key: "$master_key"
  disable_spend_logs: true
  disable_error_logs: true
  disable_adding_master_key_hash_to_db: true
  store_model_in_db: false
  background_health_checks: false
EOF

# No database, no telemetry, no network fetches at startup or later.
unset DATABASE_URL DIRECT_URL REDIS_HOST REDIS_URL REDIS_PORT REDIS_PASSWORD
export LITELLM_MASTER_KEY=$master_key
export LITELLM_TELEMETRY_DISABLED=true
export LITELLM_LOCAL_MODEL_COST_MAP=True
export LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS=True
export LITELLM_LOCAL_AUTOROUTER_PRESETS=True
export LITELLM_LOCAL_POLICY_TEMPLATES=True
export LITELLM_LOCAL_BLOG_POSTS=True
export LITELLM_DONT_SHOW_FEEDBACK_BOX=True
export DISABLE_ADMIN_UI=True
export LITELLM_LOG=${LITELLM_LOG:-ERROR}
export PYTHONUNBUFFERED=1
# Keep any proxy settings of the caller's shell from hijacking loopback calls.
export NO_PROXY="127.0.0.1,localhost,::1${NO_PROXY:+,$NO_PROXY}"
export no_proxy=$NO_PROXY

echo "LITELLM_MASTER_KEY=$master_key"
echo "LITELLM_CONFIG_DIR=$workdir"

# Run from the temp dir: litellm puts its cwd on sys.path and reads ./.env.
cd "$workdir"
exec "$venv/bin/litellm" --config "$config" --host 127.0.0.1 --port "$port" --num_workers 1
