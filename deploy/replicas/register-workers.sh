#!/usr/bin/env bash
# Registers the same worker catalog on every kvselect replica (replica sync
# drops events for workers a replica does not know, as in Dynamo: replica
# traffic never creates workers). Usage:
#   deploy/replicas/register-workers.sh workers.json [namespace]
# where workers.json is a JSON array of POST /workers bodies. It port-forwards
# to each pod in turn; run it again after scaling or a restart.
set -euo pipefail
file=${1:?usage: register-workers.sh workers.json [namespace]}
ns=${2:-default}
for pod in $(kubectl -n "$ns" get pods -l app.kubernetes.io/name=kvselect -o jsonpath='{.items[*].metadata.name}'); do
  kubectl -n "$ns" port-forward "pod/$pod" 18092:8092 >/dev/null &
  pf=$!
  trap 'kill $pf 2>/dev/null || true' EXIT
  for _ in $(seq 1 50); do curl -fs localhost:18092/health >/dev/null && break; sleep 0.1; done
  n=$(jq length "$file")
  for i in $(seq 0 $((n - 1))); do
    jq -c ".[$i]" "$file" | curl -fsS -XPOST localhost:18092/workers -H 'content-type: application/json' -d @- >/dev/null
  done
  echo "$pod: $n workers registered; /ready: $(curl -s -o /dev/null -w '%{http_code}' localhost:18092/ready)"
  kill $pf; wait $pf 2>/dev/null || true
done
