package collective

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// HostIdentity names the host this process runs on, as far as the data plane
// is concerned: two processes with the same identity can reach each other
// through shared memory. It combines the kernel's boot id, the device and
// inode of /dev/shm (which tmpfs instance is shared, whatever the mount
// namespace) and the network namespace's inode, so ranks in different network
// namespaces — the hierarchical tests' "hosts" — count as different hosts.
func HostIdentity() (string, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("collective: host identity: %w", err)
	}
	shm, err := statID("/dev/shm")
	if err != nil {
		return "", fmt.Errorf("collective: host identity: %w", err)
	}
	netns, err := statID("/proc/self/ns/net")
	if err != nil {
		return "", fmt.Errorf("collective: host identity: %w", err)
	}
	return fmt.Sprintf("%s/shm:%s/net:%s", strings.TrimSpace(string(boot)), shm, netns), nil
}

func statID(path string) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	return fmt.Sprintf("%x:%x", st.Dev, st.Ino), nil
}
