package netns

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// Sweep deletes the namespaces a lab of a dead process left behind: those
// named phx-<pid>-... where no process <pid> exists (a test killed by SIGKILL
// never runs its cleanup). Processes still running inside them (the dead
// test's children) are killed first. It returns the names it deleted.
func Sweep(ctx context.Context) ([]string, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	ip, _ := exec.LookPath("ip")
	present, err := namespaces(ctx, ip)
	if err != nil {
		return nil, err
	}
	var deleted []string
	var errs []error
	for name := range present {
		pid, ok := ownerPid(name)
		if !ok || alive(pid) {
			continue
		}
		if err := killInside(ctx, ip, name); err != nil {
			errs = append(errs, err)
		}
		if err := runCmd(ctx, ip, "netns", "del", name); err != nil {
			errs = append(errs, fmt.Errorf("netns: sweeping: %w", err))
			continue
		}
		deleted = append(deleted, name)
	}
	return deleted, errors.Join(errs...)
}

// ownerPid parses the pid out of a lab namespace's name.
func ownerPid(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	p, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(p)
	return pid, err == nil && pid > 0
}

// killInside sends SIGKILL to every process in namespace name.
func killInside(ctx context.Context, ip, name string) error {
	out, err := exec.CommandContext(ctx, ip, "netns", "pids", name).Output()
	if err != nil {
		return fmt.Errorf("netns: %s netns pids %s: %w", ip, name, err)
	}
	var errs []error
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("netns: killing pid %d in %s: %w", pid, name, err))
		}
	}
	return errors.Join(errs...)
}

// alive reports whether a process pid exists (EPERM means it does).
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// namespaces lists the named network namespaces.
func namespaces(ctx context.Context, ip string) (map[string]bool, error) {
	out, err := exec.CommandContext(ctx, ip, "netns", "list").Output()
	if err != nil {
		return nil, fmt.Errorf("netns: %s netns list: %w", ip, err)
	}
	set := map[string]bool{}
	for line := range strings.Lines(string(out)) {
		// "name (id: 3)" or "name"
		if f := strings.Fields(line); len(f) > 0 {
			set[f[0]] = true
		}
	}
	return set, nil
}
