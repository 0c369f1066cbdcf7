// Package sockowner finds which process listens on a TCP address, from
// /proc: the listening socket's inode in /proc/net/tcp or tcp6, then the
// process whose descriptors name it. Tests use it to tell a port their job
// left open from one the kernel has since handed to another process.
package sockowner

import (
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Listener is the process whose socket listens on addr (an IPv4 or
// IPv6 host:port): the one whose descriptors name the listening socket's
// inode in /proc/net/tcp or tcp6. 0: none this process can see (a port
// another user's process holds, or that nobody holds any more).
func Listener(addr string) (int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	ip := net.ParseIP(host)
	p, err := strconv.ParseUint(port, 10, 16)
	if ip == nil || err != nil {
		return 0, fmt.Errorf("sockowner: %q is not an IP address and port", addr)
	}
	inode := ""
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			if lip, lport, ok := procNetAddr(f[1]); ok && lport == uint16(p) && (lip.Equal(ip) || lip.IsUnspecified()) {
				inode = f[9]
			}
		}
	}
	if inode == "" || inode == "0" {
		return 0, nil
	}
	want := "socket:[" + inode + "]"
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		if err != nil {
			continue // gone meanwhile, or not ours to read
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name())); err == nil && l == want {
				return pid, nil
			}
		}
	}
	return 0, nil
}

// procNetAddr reads a /proc/net/tcp address: the IP as 32-bit words in
// host (little-endian) order, then the port, in hexadecimal.
func procNetAddr(s string) (net.IP, uint16, bool) {
	h, pt, ok := strings.Cut(s, ":")
	if !ok || (len(h) != 8 && len(h) != 32) {
		return nil, 0, false
	}
	raw, err := hex.DecodeString(h)
	port, perr := strconv.ParseUint(pt, 16, 16)
	if err != nil || perr != nil {
		return nil, 0, false
	}
	for i := 0; i < len(raw); i += 4 { // each word's bytes back in network order
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	return net.IP(raw), uint16(port), true
}

// Listening are the addresses process pid listens on (host:port, from
// /proc/net/tcp and tcp6 and its descriptors).
func Listening(pid int) ([]string, error) {
	fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return nil, err
	}
	mine := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
			mine[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []string
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !mine[f[9]] {
				continue
			}
			if ip, port, ok := procNetAddr(f[1]); ok {
				out = append(out, net.JoinHostPort(ip.String(), strconv.Itoa(int(port))))
			}
		}
	}
	return out, nil
}
