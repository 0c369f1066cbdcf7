//go:build phalanx_plant

package plant

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// Enabled says whether this build can plant bugs.
const Enabled = true

// On says whether bug b is planted in this process.
func On(b Bug) bool {
	for _, s := range strings.Split(os.Getenv(Env), ",") {
		if Bug(strings.TrimSpace(s)) == b {
			return true
		}
	}
	return false
}

// Orphan starts a process that outlives the caller: sleep(1) in a session
// of its own, with the caller's environment, holding files open. It is
// what a forgotten helper process looks like.
func Orphan(files ...*os.File) error {
	cmd := exec.Command("sleep", "3600")
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err := cmd.Start()
	for _, f := range files {
		// Handing f over made the file description blocking (os.File.Fd),
		// and the caller's copy shares it: a listener of the caller's
		// must stay non-blocking for its poller.
		syscall.SetNonblock(int(f.Fd()), true)
	}
	if err != nil {
		return err
	}
	return cmd.Process.Release()
}
