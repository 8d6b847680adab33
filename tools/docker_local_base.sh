#!/usr/bin/env bash
# Build a local Debian base image from the Debian archive apt already uses, with no container
# registry: what CI's image builds start FROM (the `PYTHON_IMAGE` build argument). Needs a running
# Docker engine and mmdebstrap (`nox -s docker` sees to both). Prints the image name.
#
#   bash tools/docker_local_base.sh [IMAGE] [SUITE]    # default local/debian:bookworm bookworm
#
# - python3 (3.11 on bookworm: the CPU torch wheel's Python), venv and pip, CA certificates.
# - The host's extra CA certificates (/usr/local/share/ca-certificates) go into the image, and
#   PIP_CERT/REQUESTS_CA_BUNDLE/SSL_CERT_FILE point at the system bundle, so pip inside a build
#   trusts what pip on the host trusts.
set -euo pipefail
IMAGE=${1:-local/debian:bookworm}
SUITE=${2:-bookworm}
DOCKER=${DOCKER:-/usr/bin/docker}  # apt's client: a newer one first on PATH may want a buildx plugin
MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
TAR=$(mktemp /tmp/openengine-base.XXXXXX.tar)
trap 'rm -f "$TAR"' EXIT
mmdebstrap --quiet --variant=minbase --components=main \
  --include=python3,python3-venv,python3-pip,ca-certificates \
  --customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/" 2>/dev/null || true' \
  --customize-hook='chroot "$1" update-ca-certificates >/dev/null 2>&1' \
  --customize-hook='rm -f "$1"/var/lib/apt/lists/*_Packages "$1"/var/cache/apt/*.bin' \
  "$SUITE" "$TAR" \
  "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb ${MIRROR%/debian}/debian-security $SUITE-security main"
"$DOCKER" import -c 'CMD ["/bin/bash"]' \
  -c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  "$TAR" "$IMAGE" >/dev/null
echo "$IMAGE"
