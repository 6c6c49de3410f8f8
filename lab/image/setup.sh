#!/bin/sh
# Runs inside the debootstrapped root (chroot) after rootfs/ has been copied over it.
set -eu

# Units that have no job in a container, or that need capabilities a container lacks.
systemctl mask \
  getty.target console-getty.service getty@tty1.service serial-getty@.service \
  systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
  systemd-timesyncd.service systemd-networkd-wait-online.service \
  systemd-remount-fs.service sys-kernel-config.mount sys-kernel-debug.mount \
  apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
  e2scrub_reap.service fstrim.timer
systemctl enable ssh.service
# The monitoring packages are preloaded in the image (packages.txt) but run only where a
# monitoring role enables them.
systemctl disable prometheus.service prometheus-alertmanager.service \
  prometheus-node-exporter.service
systemctl set-default multi-user.target

# pam_loginuid cannot write /proc/self/loginuid without CAP_AUDIT_CONTROL; make it optional
# so SSH sessions open in a container exactly as they do on a host.
sed -i 's/^session\s\+required\s\+pam_loginuid.so/session optional pam_loginuid.so/' /etc/pam.d/sshd

# A container cannot raise its hard rlimits (no CAP_SYS_RESOURCE), so the memlock/nofile limits
# the base and rdma roles write for RDMA would make a required pam_limits refuse every login.
# Optional here: the limits are still applied up to the container's ceiling, and the validators
# still see (and report) what a session really gets.
sed -i 's/^session\s\+required\s\+pam_limits.so/session optional pam_limits.so/' /etc/pam.d/sshd

# No per-login systemd user manager: under podman, stopping user@0.service can hang for its
# 25 s timeout and every SSH login waits on it. Logins need no user manager on a node.
sed -i '/pam_systemd.so/d' /etc/pam.d/common-session

# Host keys and the machine id are per container, created on first boot.
rm -f /etc/ssh/ssh_host_*
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id

install -d -m 0700 /root/.ssh
# Do not install recommends on lab nodes either; roles declare what they need.
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
  > /etc/apt/apt.conf.d/90gpuforge-lab
printf 'deb http://deb.debian.org/debian bookworm main\ndeb http://deb.debian.org/debian bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n' \
  > /etc/apt/sources.list

apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log /tmp/* /var/tmp/*
