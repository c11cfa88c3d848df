# The file-system fault tests (tests/integration/faults.rs) need a small loop-mounted ext4:
# root, a loop device and mkfs.ext4. Where this machine can mount one, they must run
# (IDEM_REQUIRE_FAULTS=1); where it cannot, CI says so loudly and they skip.

can_mount_small_fs() {
    command -v mkfs.ext4 >/dev/null 2>&1 || {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q e2fsprogs >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q e2fsprogs >/dev/null 2>&1; }
    } || return 1
    local dir
    dir=$(mktemp -d)
    truncate -s 8M "$dir/fs.img" && mkfs.ext4 -q -F "$dir/fs.img" >/dev/null 2>&1 \
        && mkdir "$dir/mnt" && mount -o loop "$dir/fs.img" "$dir/mnt" 2>/dev/null \
        && umount "$dir/mnt"
    local ok=$?
    rm -rf "$dir"
    return $ok
}

require_fault_tests() {
    if can_mount_small_fs; then
        export IDEM_REQUIRE_FAULTS=1
        echo "faults: a small file system mounts here: the fault tests must run"
    else
        echo "WARNING: faults: no loop-mounted file system here (root and a loop device needed):" \
             "the disk-full and read-only tests are SKIPPED" >&2
    fi
}
