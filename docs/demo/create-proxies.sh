#!/usr/bin/env bash
# Bulk-create N demo Proxies on one provider and apply them with kubectl.
#
#   docs/demo/create-proxies.sh N PROVIDER [NAMESPACE]
#
#   N          how many Proxies (1..500)
#   PROVIDER   a provider name from the providers config (e.g. k8s-local, gcp-eu, kvm-lab)
#   NAMESPACE  where the Proxies go (default: default; must exist)
#
# Optional environment:
#   ZONES=a,b,c              spread the Proxies round-robin over these placement zones
#                            (gcp: zones, kvm: host names; kubernetes: ignored by the provider)
#   IMAGE=...                placement.image (gcp image, kvm image key or URL, container image);
#                            only what the provider's config allows (README, "Configuration")
#   MACHINE_TYPE=...         placement.machineType (gcp machine type, kvm profile key; allowed ones only)
#   CLOUD_INIT_SECRET=name[/key]  spec.cloudInit.secretRef for VM providers (key default user-data);
#                            create it first, e.g. from deploy/samples/proxy_gcp.yaml
#   MAX_LEASES=5             spec.maxLeases (0 = never lease)
#   PREFIX=demo              names are <PREFIX>-<PROVIDER>-001, -002, ...
#   DRY_RUN=1                print the manifests instead of applying them
#   KUBECTL=kubectl          the kubectl to use
#
# Every Proxy carries the label app.kubernetes.io/part-of=proxy-operator-demo, so
#   kubectl -n NAMESPACE delete px -l app.kubernetes.io/part-of=proxy-operator-demo
# removes them all (the operator deletes their instances first).
set -euo pipefail

DEMO_LABEL="app.kubernetes.io/part-of"
DEMO_VALUE="proxy-operator-demo"
NAME_RE='^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

die() {
  echo "create-proxies.sh: $*" >&2
  exit 2
}

[ $# -ge 2 ] && [ $# -le 3 ] || usage
count="$1"
provider="$2"
namespace="${3:-default}"
prefix="${PREFIX:-demo}"
max_leases="${MAX_LEASES:-5}"
kubectl="${KUBECTL:-kubectl}"

[[ "$count" =~ ^[0-9]+$ ]] && (( 10#$count >= 1 && 10#$count <= 500 )) \
  || die "N: want a whole number from 1 to 500, got '$count'"
count=$((10#$count))
[[ "$provider" =~ $NAME_RE ]] || die "PROVIDER: '$provider' is not a provider name ([a-z0-9-], as in the providers config)"
[[ "$namespace" =~ $NAME_RE ]] && (( ${#namespace} <= 63 )) || die "NAMESPACE: '$namespace' is not a namespace name"
[[ "$prefix" =~ $NAME_RE ]] || die "PREFIX: '$prefix' must be lowercase letters, digits and '-'"
[[ "$max_leases" =~ ^[0-9]+$ ]] || die "MAX_LEASES: want a whole number >= 0, got '$max_leases'"
(( ${#prefix} + ${#provider} + 5 <= 253 )) || die "PREFIX and PROVIDER make names longer than 253 characters"

zones=()
if [ -n "${ZONES:-}" ]; then
  IFS=',' read -r -a zones <<< "$ZONES"
  for z in "${zones[@]}"; do
    [[ "$z" =~ ^[A-Za-z0-9]([-A-Za-z0-9._]*[A-Za-z0-9])?$ ]] || die "ZONES: '$z' is not a zone or host name"
  done
fi
for var in IMAGE MACHINE_TYPE; do
  value="${!var:-}"
  [[ "$value" != *[\"\\$'\n']* ]] || die "$var: quotes, backslashes and newlines are not allowed"
done
secret_name="" secret_key=""
if [ -n "${CLOUD_INIT_SECRET:-}" ]; then
  secret_name="${CLOUD_INIT_SECRET%%/*}"
  secret_key="user-data"
  [[ "$CLOUD_INIT_SECRET" == */* ]] && secret_key="${CLOUD_INIT_SECRET#*/}"
  [[ "$secret_name" =~ $NAME_RE ]] || die "CLOUD_INIT_SECRET: '$secret_name' is not a Secret name"
  [[ "$secret_key" =~ ^[-._a-zA-Z0-9]+$ ]] || die "CLOUD_INIT_SECRET: '$secret_key' is not a Secret key"
fi

# Print the N Proxy manifests as one YAML stream (documents separated by ---).
render() {
  local i name zone
  for ((i = 1; i <= count; i++)); do
    name="$(printf '%s-%s-%03d' "$prefix" "$provider" "$i")"
    zone=""
    if (( ${#zones[@]} )); then
      zone="${zones[$(((i - 1) % ${#zones[@]}))]}"
    fi
    echo "---"
    echo "apiVersion: crawl.example.com/v1alpha1"
    echo "kind: Proxy"
    echo "metadata:"
    echo "  name: $name"
    echo "  namespace: $namespace"
    echo "  labels:"
    echo "    $DEMO_LABEL: $DEMO_VALUE"
    echo "spec:"
    echo "  provider: $provider"
    if [ -n "$zone" ] || [ -n "${IMAGE:-}" ] || [ -n "${MACHINE_TYPE:-}" ]; then
      echo "  placement:"
      [ -z "$zone" ] || echo "    zone: \"$zone\""
      [ -z "${IMAGE:-}" ] || echo "    image: \"$IMAGE\""
      [ -z "${MACHINE_TYPE:-}" ] || echo "    machineType: \"$MACHINE_TYPE\""
    fi
    if [ -n "$secret_name" ]; then
      echo "  cloudInit:"
      echo "    secretRef: {name: $secret_name, key: \"$secret_key\"}"
    fi
    echo "  maxLeases: $((10#$max_leases))"
  done
}

if [ "${DRY_RUN:-0}" = 1 ]; then
  render
  exit 0
fi

command -v "$kubectl" > /dev/null || die "kubectl not found (set KUBECTL=/path/to/kubectl)"
render | "$kubectl" apply -f -
echo
echo "Created or updated $count Proxies on provider $provider in namespace $namespace. Watch them:"
echo "  $kubectl -n $namespace get px -l $DEMO_LABEL=$DEMO_VALUE -w"
echo "Remove them:"
echo "  $kubectl -n $namespace delete px -l $DEMO_LABEL=$DEMO_VALUE"
