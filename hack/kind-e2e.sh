#!/usr/bin/env bash
# End-to-end run of Lading on a local kind cluster, for people with Docker.
# NOT run by CI (CI has no Docker engine); the chart and CRDs are checked offline by
# tests/integration/chart and tests/unit/crds instead.
#
# What it does: creates a kind cluster, builds the Lading image and loads it into the cluster,
# installs PostgreSQL and RabbitMQ (plain single-replica manifests, for testing only), installs
# the Helm chart (CRDs included) with the reference receiver and the workers allowed to reach the
# cluster's Service range, applies README's cluster path (examples/cluster/: tenant, builtin pool,
# endpoint at the in-cluster receiver, batch, in that order) and waits for the batch's Complete
# and then Delivered conditions: every result extracted and accepted by the receiver.
#
# Needs: docker, kind, kubectl; helm (.venv/tools/helm is used when present, see `make test`).
# Environment: KIND_CLUSTER (default lading-e2e), IMAGE (default ghcr.io/lading-dev/lading:e2e),
# TIMEOUT (kubectl wait timeout, default 15m), SERVICE_RANGE (the cluster's Service CIDR, default
# kind's 10.96.0.0/12), DELETE_CLUSTER=1 to delete the cluster at the end.
set -euo pipefail

cd "$(dirname "$0")/.."

CLUSTER="${KIND_CLUSTER:-lading-e2e}"
IMAGE="${IMAGE:-ghcr.io/lading-dev/lading:e2e}"
TIMEOUT="${TIMEOUT:-15m}"
SERVICE_RANGE="${SERVICE_RANGE:-10.96.0.0/12}"
NAMESPACE=lading-system
HELM="${LADING_HELM:-.venv/tools/helm}"
[[ -x "$HELM" ]] || HELM="$(command -v helm || true)"

for tool in docker kind kubectl; do
    command -v "$tool" >/dev/null || { echo "kind-e2e: $tool is required" >&2; exit 2; }
done
[[ -n "$HELM" ]] || { echo "kind-e2e: helm is required (make test installs .venv/tools/helm)" >&2; exit 2; }

CONTEXT="kind-$CLUSTER"
k() { kubectl --context "$CONTEXT" "$@"; }

cleanup() {
    if [[ "${DELETE_CLUSTER:-0}" == "1" ]]; then
        kind delete cluster --name "$CLUSTER"
    else
        echo "kind-e2e: cluster $CLUSTER kept (DELETE_CLUSTER=1 deletes it); kubectl --context $CONTEXT get lading -A"
    fi
}
trap cleanup EXIT

echo "==> cluster $CLUSTER"
if ! kind get clusters | grep -qx "$CLUSTER"; then
    kind create cluster --name "$CLUSTER" --wait 120s
fi

echo "==> image $IMAGE"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

echo "==> PostgreSQL and RabbitMQ in $NAMESPACE (test-only, no persistence)"
k create namespace "$NAMESPACE" --dry-run=client -o yaml | k apply -f -
k create namespace acme --dry-run=client -o yaml | k apply -f -
k apply -n "$NAMESPACE" -f - <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: postgres}
spec:
  replicas: 1
  selector: {matchLabels: {app: postgres}}
  template:
    metadata: {labels: {app: postgres}}
    spec:
      containers:
        - name: postgres
          image: postgres:16
          env:
            - {name: POSTGRES_USER, value: lading}
            - {name: POSTGRES_PASSWORD, value: lading-e2e}
            - {name: POSTGRES_DB, value: lading}
          ports: [{containerPort: 5432}]
          readinessProbe:
            exec: {command: [pg_isready, -U, lading]}
            periodSeconds: 2
---
apiVersion: v1
kind: Service
metadata: {name: postgres}
spec:
  selector: {app: postgres}
  ports: [{port: 5432, targetPort: 5432}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: rabbitmq}
spec:
  replicas: 1
  selector: {matchLabels: {app: rabbitmq}}
  template:
    metadata: {labels: {app: rabbitmq}}
    spec:
      containers:
        - name: rabbitmq
          image: rabbitmq:3.13
          env:
            - {name: RABBITMQ_DEFAULT_USER, value: lading}
            - {name: RABBITMQ_DEFAULT_PASS, value: lading-e2e}
          ports: [{containerPort: 5672}]
          readinessProbe:
            exec: {command: [rabbitmq-diagnostics, -q, check_port_connectivity]}
            periodSeconds: 5
            timeoutSeconds: 10
---
apiVersion: v1
kind: Service
metadata: {name: rabbitmq}
spec:
  selector: {app: rabbitmq}
  ports: [{port: 5672, targetPort: 5672}]
YAML
k create secret generic lading-amqp -n "$NAMESPACE" \
    --from-literal=url="amqp://lading:lading-e2e@rabbitmq.$NAMESPACE.svc:5672/" --dry-run=client -o yaml | k apply -f -
k rollout status -n "$NAMESPACE" deployment/postgres --timeout=180s
k rollout status -n "$NAMESPACE" deployment/rabbitmq --timeout=300s
# The reference receiver keeps its inbox in a database of its own.
k exec -n "$NAMESPACE" deployment/postgres -- sh -c 'psql -U lading -tAc "SELECT 1 FROM pg_database WHERE datname = '"'"'erp'"'"'" | grep -q 1 || createdb -U lading erp'
k create secret generic erp-database -n "$NAMESPACE" \
    --from-literal=url="postgresql://lading:lading-e2e@postgres.$NAMESPACE.svc:5432/erp" --dry-run=client -o yaml | k apply -f -
k create secret generic erp-signing -n "$NAMESPACE" \
    --from-literal=secrets=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw --dry-run=client -o yaml | k apply -f -

echo "==> Helm chart"
"$HELM" upgrade --install lading charts/lading \
    --kube-context "$CONTEXT" --namespace "$NAMESPACE" \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
    --set database.create=true \
    --set database.url="postgresql://lading:lading-e2e@postgres.$NAMESPACE.svc:5432/lading" \
    --set amqp.secretName=lading-amqp \
    --set relay.enabled=true \
    --set receiver.enabled=true --set receiver.database.secretName=erp-database \
    --set receiver.signingSecret.secretName=erp-signing \
    --set "workers.egressAllow={$SERVICE_RANGE}" \
    --wait --timeout 5m
k get crd -l app.kubernetes.io/part-of=lading

echo "==> README's cluster path: tenant acme, builtin pool, endpoint at the receiver, 3 invoices"
k apply -f examples/cluster/1-tenantquota.yaml
k apply -f examples/cluster/2-inferencepool.yaml
k apply -f examples/cluster/3-deliveryendpoint.yaml
# Server-side apply: client-side `kubectl apply` copies the whole object into an annotation,
# limited to 256 KiB, which a batch with inline documents can exceed.
k apply --server-side -f examples/cluster/4-extractionbatch.yaml
k wait --for=condition=Complete extractionbatch/first-invoices -n acme --timeout="$TIMEOUT"
k wait --for=condition=Delivered extractionbatch/first-invoices -n acme --timeout="$TIMEOUT"

echo "==> result"
k get lading -A
k get extractionbatches.lading.dev -n acme first-invoices -o jsonpath='{.status.succeeded} succeeded, {.status.reviewRequired} for review, {.status.failed} failed, {.status.delivered} delivered{"\n"}'
