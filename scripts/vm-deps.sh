#!/usr/bin/env bash
# Installs what the VM drivers (qemu, and the image builder shared with
# firecracker) need: qemu-system-x86 (microvm machine, TCG or KVM), a Debian
# kernel (linux-image-amd64: vmlinuz plus the virtio modules the initramfs
# carries), e2fsprogs (mkfs.ext4 -d builds template disks) and busybox-static
# (the guest init's shell) and xz-utils (the kernel's payload is XZ).
# Idempotent: installed packages are not fetched
# again, so a second run costs a few dpkg-query calls.
# linux-image-amd64 pulls in a ~100 MB kernel package; expect ~3 min once.
set -euo pipefail
pkgs=(qemu-system-x86 linux-image-amd64 e2fsprogs busybox-static xz-utils)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends keeps out firmware and initramfs-tools hooks we do
  # not use; the image builder makes its own initramfs.
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v qemu-system-x86_64 >/dev/null || { echo "vm-deps.sh: qemu-system-x86_64 not found after install" >&2; exit 1; }
ls /boot/vmlinuz-* >/dev/null 2>&1 || { echo "vm-deps.sh: no /boot/vmlinuz-* after install" >&2; exit 1; }
