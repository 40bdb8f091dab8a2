#!/usr/bin/env bash
# Registers the same worker catalog on every kvselect replica (replica sync
# drops events for workers a replica does not know, as in Dynamo: replica
# traffic never creates workers). Usage:
#   KVSELECT_TOKEN=<token with the admin scope> deploy/replicas/register-workers.sh workers.json [namespace]
# where workers.json is a JSON array of POST /workers bodies. POST /workers
# needs the admin scope: KVSELECT_TOKEN is a token of the kvselect-auth-tokens
# Secret's token file (README.md). It port-forwards to each pod in turn
# (local port KVSELECT_LOCAL_PORT, default 18092); run it again after scaling
# or a restart.
set -euo pipefail
file=${1:?usage: KVSELECT_TOKEN=<admin token> register-workers.sh workers.json [namespace]}
ns=${2:-default}
: "${KVSELECT_TOKEN:?set KVSELECT_TOKEN to a token with the admin scope (deploy/replicas/README.md)}"
port=${KVSELECT_LOCAL_PORT:-18092}

# The Authorization header goes to curl from a private file (curl -H @file),
# not on its command line, where any local user could read it in ps.
hdr=$(mktemp)
chmod 600 "$hdr"
printf 'Authorization: Bearer %s\n' "$KVSELECT_TOKEN" >"$hdr"
pf=""
cleanup() {
  [ -z "$pf" ] || kill "$pf" 2>/dev/null || true
  rm -f "$hdr"
}
trap cleanup EXIT

n=$(jq length "$file")
for pod in $(kubectl -n "$ns" get pods -l app.kubernetes.io/name=kvselect -o jsonpath='{.items[*].metadata.name}'); do
  kubectl -n "$ns" port-forward "pod/$pod" "$port:8092" >/dev/null &
  pf=$!
  # /health and /ready need no token.
  for _ in $(seq 1 50); do curl -fs "localhost:$port/health" >/dev/null && break; sleep 0.1; done
  for i in $(seq 0 $((n - 1))); do
    jq -c ".[$i]" "$file" | curl -fsS -XPOST "localhost:$port/workers" -H @"$hdr" -H 'content-type: application/json' -d @- >/dev/null
  done
  echo "$pod: $n workers registered; /ready: $(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/ready")"
  kill "$pf"; wait "$pf" 2>/dev/null || true
  pf=""
done
