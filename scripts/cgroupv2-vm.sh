#!/usr/bin/env bash
# A QEMU (TCG) Debian guest booted with cgroup v2 only, for the
# cgroup-v2-only round trip (test/cgroupv2). This host mounts cgroups
# hybrid (v1 controllers beside an empty v2 tree), so the code's v2-only
# path runs only in such a guest.
#
#   scripts/cgroupv2-vm.sh build   build the guest once into the cache, print its dir
#   scripts/cgroupv2-vm.sh built   exit 0 when the cache is complete
#   scripts/cgroupv2-vm.sh boot BIN_DIR CTRL_PORT DATA_PORT CONSOLE_LOG [CTL_SOCK]
#                                  boot it (foreground) with BIN_DIR's space and
#                                  space-agent (static builds: CGO_ENABLED=0);
#                                  a line "restart" written to the unix socket
#                                  CTL_SOCK restarts the guest's server
#   scripts/cgroupv2-vm.sh test    build, then run the Go test (go test ./test/cgroupv2)
#
# The guest: Debian trixie (13; SPACE_CGROUPV2_SUITE=bookworm for 12), from
# mmdebstrap --variant=essential plus systemd-sysv and busybox-static, on an
# ext4 root, booted by the host's Debian kernel (vmlinux, PVH on the microvm
# machine) and an initramfs made by internal/vmimage that switches to
# systemd. The kernel command line has cgroup_no_v1=all and
# systemd.unified_cgroup_hierarchy=1. systemd starts
# deploy/systemd/space-server.service as shipped, with a drop-in running
# `space server --driver namespace --builtins minimal` from a read-only disk
# holding the host's static `space` binary; space-key.service prints an API
# key and the guest's cgroup mounts to the serial console; space-ctl.service
# restarts the server when the host asks. The host reaches the control and
# data planes through user-mode networking forwarded to 127.0.0.1 only
# (restrict=on: the guest reaches nothing).
#
# The cache (/var/cache/space/cgroupv2/<key>/, key = this script, the
# shipped unit, the initramfs builder, the kernel release and the suite)
# costs ~3 minutes once (the Debian tree, downloaded from deb.debian.org and
# kept as debian-<key>.tar) and ~20 s after a change to the rest; the root
# disk is booted with snapshot=on, so runs never change it. Needs
# scripts/vm-deps.sh's packages and mmdebstrap (scripts/deps.sh). A run
# (test/cgroupv2) takes 2-5 minutes on two loaded cores, boot to a serving
# server 1.5-3 minutes of it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
CACHE_ROOT=${SPACE_CGROUPV2_CACHE:-/var/cache/space/cgroupv2}
MIRROR=${SPACE_DEBIAN_MIRROR:-http://deb.debian.org/debian}

key() {
  local kernel
  kernel=$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -1)
  { cat scripts/cgroupv2-vm.sh deploy/systemd/space-server.service test/cgroupv2/mkguest/main.go \
      internal/vmimage/initramfs.go internal/vmimage/vmimage.go
    echo "$kernel ${SPACE_CGROUPV2_SUITE:-trixie}"; } | sha256sum | cut -c1-16
}
DIR=$CACHE_ROOT/$(key)

write_guest_files() {
  local root=$1
  mkdir -p "$root/usr/local/sbin" "$root/etc/systemd/system/multi-user.target.wants" "$root/opt/space"
  cat >"$root/usr/local/sbin/space-vm-start" <<'SH'
#!/bin/sh
# Network (qemu user-mode: the guest is 10.0.2.15, qemu 10.0.2.2), the disk
# with serial "space" (the host's binary), then the server.
set -eu
bb=/bin/busybox
# A restart of the unit finds them set.
$bb ip link set lo up
$bb ip addr show dev eth0 | grep -q 10.0.2.15/24 || $bb ip addr add 10.0.2.15/24 dev eth0
$bb ip link set eth0 up
$bb ip route show | grep -q '^default' || $bb ip route add default via 10.0.2.2
dev=
for d in /sys/block/vd*; do [ "$(cat "$d/serial" 2>/dev/null)" = space ] && dev=/dev/${d##*/}; done
[ -n "$dev" ] || { echo "no disk with serial space" >&2; exit 1; }
mountpoint -q /opt/space || mount -t ext4 -o ro,noload "$dev" /opt/space
data_url=$(sed -n 's/.*space\.data_url=\([^ ]*\).*/\1/p' /proc/cmdline)
exec /opt/space/space server --listen 0.0.0.0:7070 --data-listen 0.0.0.0:7071 --data-url "$data_url" \
  --driver namespace --builtins minimal --data-dir /var/lib/space --run-dir /run/space
SH
  cat >"$root/usr/local/sbin/space-vm-key" <<'SH'
#!/bin/sh
# Waits for the server, then prints an API key and the guest's cgroup
# facts to the serial console for the host's test.
set -eu
for _ in $(seq 1 600); do
  /bin/busybox wget -q -O /dev/null http://127.0.0.1:7070/healthz && break
  sleep 1
done
k=$(/opt/space/space keys create --data-dir /var/lib/space --name cgroupv2 --project cgroupv2)
pid=$(systemctl show -p MainPID --value space-server.service)
{
  grep -E ' cgroup2? ' /proc/self/mounts | sed 's/^/SPACE-MOUNT /'
  sed 's/^/SPACE-SERVER-CGROUP /' "/proc/$pid/cgroup"
  echo "SPACE-UPTIME $(cut -d' ' -f1 /proc/uptime)"
  echo "SPACE-KEY $k"
} >/dev/ttyS0
SH
  cat >"$root/usr/local/sbin/space-vm-ctl" <<'SH'
#!/bin/sh
# Runs the host's requests from the virtio port "space.ctl", one fixed verb
# a line (nothing from the line reaches a shell), and reports each on the
# serial console.
set -u
port=
for p in /sys/class/virtio-ports/*; do [ "$(cat "$p/name" 2>/dev/null)" = space.ctl ] && port=/dev/${p##*/}; done
[ -n "$port" ] || { echo "SPACE-CTL none" >/dev/ttyS0; exit 0; }
# A read returns at once (EOF) while the host's end is not connected.
while :; do
  verb=
  read -r verb <"$port" || { sleep 1; continue; }
  case "$verb" in
  restart)
    # What an upgrade does: stop the server (KillMode=process leaves the
    # sandboxes running) and start it again.
    t0=$(cut -d' ' -f1 /proc/uptime)
    timeout 120 systemctl restart space-server.service
    rc=$?
    ok=down
    for _ in $(seq 1 120); do
      /bin/busybox wget -q -O /dev/null http://127.0.0.1:7070/healthz && { ok=up; break; }
      sleep 1
    done
    pid=$(systemctl show -p MainPID --value space-server.service)
    { if [ "$ok" != up ]; then
        systemctl status --no-pager -l -n 30 space-server.service 2>&1 | sed 's/^/SPACE-DIAG /'
        for f in cgroup.procs cgroup.subtree_control; do
          echo "SPACE-DIAG $f: $(cat /sys/fs/cgroup/system.slice/space-server.service/$f | tr '\n' ' ')"
        done
      fi
      sed 's/^/SPACE-SERVER-CGROUP /' "/proc/$pid/cgroup" 2>/dev/null
      echo "SPACE-CTL restart rc=$rc $ok from $t0 to $(cut -d' ' -f1 /proc/uptime)"; } >/dev/ttyS0
    ;;
  "") ;;
  *) echo "SPACE-CTL unknown" >/dev/ttyS0 ;;
  esac
done
SH
  chmod 755 "$root/usr/local/sbin/space-vm-start" "$root/usr/local/sbin/space-vm-key" "$root/usr/local/sbin/space-vm-ctl"
  # The shipped unit (Delegate=yes, KillMode=process), as docs/install-systemd.md
  # installs it; a drop-in starts this guest's binary with its addresses.
  cp deploy/systemd/space-server.service "$root/etc/systemd/system/"
  mkdir -p "$root/etc/systemd/system/space-server.service.d"
  cat >"$root/etc/systemd/system/space-server.service.d/cgroupv2-test.conf" <<'UNIT'
[Service]
ExecStart=
ExecStart=/usr/local/sbin/space-vm-start
StandardOutput=journal+console
StandardError=journal+console
UNIT
  cat >"$root/etc/systemd/system/space-key.service" <<'UNIT'
[Unit]
Description=print an API key for the host's test
After=space-server.service
Requires=space-server.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/space-vm-key

[Install]
WantedBy=multi-user.target
UNIT
  cat >"$root/etc/systemd/system/space-ctl.service" <<'UNIT'
[Unit]
Description=run the host's requests (restart the server)
After=space-key.service

[Service]
ExecStart=/usr/local/sbin/space-vm-ctl

[Install]
WantedBy=multi-user.target
UNIT
  ln -sf /etc/systemd/system/space-ctl.service "$root/etc/systemd/system/multi-user.target.wants/space-ctl.service"
  ln -sf /etc/systemd/system/space-server.service "$root/etc/systemd/system/multi-user.target.wants/space-server.service"
  ln -sf /etc/systemd/system/space-key.service "$root/etc/systemd/system/multi-user.target.wants/space-key.service"
  ln -sf /lib/systemd/system/multi-user.target "$root/etc/systemd/system/default.target"
  # Nothing logs in, and TCG time is precious: no gettys, no logind (there
  # is no D-Bus), no units for hardware this guest lacks.
  for u in getty@tty1.service serial-getty@ttyS0.service getty.target systemd-logind.service \
    systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
    systemd-hwdb-update.service systemd-udev-trigger.service systemd-udevd.service \
    systemd-random-seed.service systemd-update-utmp.service systemd-journal-catalog-update.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$u"
  done
  echo space-cgv2 >"$root/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 space-cgv2\n' >"$root/etc/hosts"
  : >"$root/etc/machine-id"
  printf '/dev/root / ext4 rw 0 1\n' >"$root/etc/fstab"
}

# The Debian userland, cached apart from the rest (its key is only what
# mmdebstrap is asked for), so a change to the guest's files or the unit
# costs seconds instead of a new download.
SUITE=${SPACE_CGROUPV2_SUITE:-trixie}
DEBIAN_ARGS=(--variant=essential --include=systemd-sysv,busybox-static "$SUITE")
debian_tar() {
  local tar
  tar=$CACHE_ROOT/debian-$(echo "${DEBIAN_ARGS[*]}" | sha256sum | cut -c1-16).tar
  if [ ! -f "$tar" ]; then
    echo "== cgroupv2-vm: Debian $SUITE root (mmdebstrap, ~3 min)" >&2
    mkdir -p "$CACHE_ROOT"
    mmdebstrap --quiet --format=tar "${DEBIAN_ARGS[@]}" "$tar.tmp" "$MIRROR" >&2
    mv "$tar.tmp" "$tar"
  fi
  echo "$tar"
}

build() {
  if [ -f "$DIR/DONE" ]; then echo "$DIR"; return; fi
  command -v mmdebstrap >/dev/null || { echo "cgroupv2-vm.sh: mmdebstrap missing (scripts/deps.sh)" >&2; exit 1; }
  command -v qemu-system-x86_64 >/dev/null || { echo "cgroupv2-vm.sh: qemu missing (scripts/vm-deps.sh)" >&2; exit 1; }
  local t0=$SECONDS
  rm -rf "$DIR" && mkdir -p "$DIR/.work"
  local tar
  tar=$(debian_tar)
  mkdir -p "$DIR/.work/root"
  tar -C "$DIR/.work/root" -xf "$tar"
  rm -rf "$DIR/.work/root/var/cache/apt" "$DIR/.work/root/var/lib/apt/lists" "$DIR/.work/root/usr/share/doc" "$DIR/.work/root/usr/share/man"
  write_guest_files "$DIR/.work/root"
  # Room for the templates and sandboxes the test makes (the file is sparse).
  truncate -s 2G "$DIR/.work/rootfs.ext4"
  mkfs.ext4 -q -F -L space-cgv2 -E root_owner=0:0 -d "$DIR/.work/root" "$DIR/.work/rootfs.ext4"
  echo "== cgroupv2-vm: kernel and initramfs (test/cgroupv2/mkguest)" >&2
  CGO_ENABLED=0 go run ./test/cgroupv2/mkguest -out "$DIR/.work" >&2
  mv "$DIR/.work/rootfs.ext4" "$DIR/.work/vmlinux" "$DIR/.work/initramfs.cpio" "$DIR/"
  rm -rf "$DIR/.work"
  echo "built in $((SECONDS - t0)) s" >"$DIR/DONE"
  echo "$DIR"
}

boot() {
  [ "$#" -eq 4 ] || [ "$#" -eq 5 ] || { echo "usage: cgroupv2-vm.sh boot BIN_DIR CTRL_PORT DATA_PORT CONSOLE_LOG [CTL_SOCK]" >&2; exit 2; }
  local bin=$1 ctrl=$2 data=$3 console=$4 ctl=${5:-}
  [ -f "$DIR/DONE" ] || { echo "cgroupv2-vm.sh: not built (run: scripts/cgroupv2-vm.sh build)" >&2; exit 1; }
  # Globals: the EXIT trap runs after this function's locals are gone.
  BOOT_TMP=$(mktemp -d)
  QEMU_PID=
  trap 'if [ -n "$QEMU_PID" ]; then kill "$QEMU_PID" 2>/dev/null || true; fi; rm -rf "$BOOT_TMP"' EXIT
  local tmp=$BOOT_TMP
  mkdir "$tmp/d"
  # The server runs space-agent as each sandbox's PID 1 when it finds it
  # next to itself, as in an installed bin/.
  cp "$bin/space" "$bin/space-agent" "$tmp/d/"
  truncate -s $(( $(du -sb "$tmp/d" | cut -f1) * 5 / 4 + (16 << 20) )) "$tmp/space.ext4"
  mkfs.ext4 -q -F -O ^has_journal -E root_owner=0:0 -d "$tmp/d" "$tmp/space.ext4"
  local ctlargs=()
  if [ -n "$ctl" ]; then
    ctlargs=(-device virtio-serial-device -chardev "socket,id=ctl,path=$ctl,server=on,wait=off"
      -device virtserialport,chardev=ctl,name=space.ctl)
  fi
  # Not exec: the trap removes the binary's disk when QEMU ends, and QEMU
  # ends with whoever started this script (a test killed at its timeout
  # runs no cleanup): a watcher polls the caller.
  local caller=$PPID
  qemu-system-x86_64 -M microvm,x-option-roms=off,isa-serial=on -accel tcg,tb-size=256 \
    -m "${SPACE_CGROUPV2_MEM_MIB:-1536}" -smp "${SPACE_CGROUPV2_CPUS:-2}" \
    -nodefaults -no-user-config -display none -no-reboot \
    -serial "file:$console" \
    -kernel "$DIR/vmlinux" -initrd "$DIR/initramfs.cpio" \
    -append "console=ttyS0 panic=-1 reboot=t tsc_early_khz=2000000 no_timer_check systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all systemd.show_status=1 space.data_url=http://127.0.0.1:$data" \
    -drive "id=root,if=none,format=raw,snapshot=on,file=$DIR/rootfs.ext4" \
    -device virtio-blk-device,drive=root,serial=root \
    -drive "id=space,if=none,format=raw,readonly=on,file=$tmp/space.ext4" \
    -device virtio-blk-device,drive=space,serial=space \
    -netdev "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:$ctrl-:7070,hostfwd=tcp:127.0.0.1:$data-:7071" \
    -device virtio-net-device,netdev=n0 "${ctlargs[@]}" &
  QEMU_PID=$!
  ( while kill -0 "$caller" 2>/dev/null && kill -0 "$QEMU_PID" 2>/dev/null; do sleep 5; done
    kill "$QEMU_PID" 2>/dev/null ) &
  wait "$QEMU_PID"
}

case "${1:-}" in
build) build ;;
built) [ -f "$DIR/DONE" ] ;;
boot) shift; boot "$@" ;;
test)
  build >/dev/null
  SPACE_TEST_CGROUPV2=1 CGO_ENABLED=0 go test -count=1 -v -timeout 30m ./test/cgroupv2/
  ;;
*)
  echo "usage: scripts/cgroupv2-vm.sh build|built|boot BIN_DIR CTRL_PORT DATA_PORT CONSOLE_LOG [CTL_SOCK]|test" >&2
  exit 2
  ;;
esac
