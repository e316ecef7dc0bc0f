#!/usr/bin/env bash
# Installs those of the Debian packages named that are missing (`make system-deps`, `make
# local-deps`), starting no service they ship: etcd-server's postinst would start and enable a
# system etcd on 2379 (kafscale local and the tests run etcds of their own, on free ports), and
# prometheus's and postgresql's would start servers the tests do not use. A policy-rc.d that
# refuses every start is in place while apt runs (unless the machine has one already, as
# containers do), and the etcd unit is disabled so that it does not start at the next boot.
set -euo pipefail

missing=()
for package in "$@"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
echo "installing system packages: ${missing[*]}"

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# kafscale (.ci/apt-install.sh): no service starts while it installs\nexit 101\n' |
    $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  trap '$SUDO rm -f "$policy"' EXIT
fi
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if [[ " ${missing[*]} " == *" etcd-server "* ]] && command -v systemctl >/dev/null; then
  $SUDO systemctl disable etcd.service >/dev/null 2>&1 || true
fi
