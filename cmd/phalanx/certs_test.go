package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/pki"
)

// TestCertsInit: phalanx certs init writes a CA and a certificate per host
// that load for the job; a directory holding any of its files is refused
// with nothing changed; --job and --hosts are required.
func TestCertsInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	var out bytes.Buffer
	if err := runCommand(t, []string{"certs", "init", dir, "--job", "j", "--hosts", "10.0.0.1,host-b", "--days", "30"}, &out, &out); err != nil {
		t.Fatalf("certs init: %v\n%s", err, out.String())
	}
	for _, h := range []string{"10.0.0.1", "host-b"} {
		f := pki.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, h+".pem"), Key: filepath.Join(dir, h+"-key.pem")}
		m, err := pki.Load(f, "j", nil)
		if err != nil {
			t.Fatalf("%s: %v", h, err)
		}
		if left := time.Until(m.Leaf().NotAfter); left < 29*24*time.Hour || left > 31*24*time.Hour {
			t.Errorf("%s's certificate ends in %v, want 30 days", h, left)
		}
		if !strings.Contains(out.String(), f.Cert) {
			t.Errorf("the output does not name %s:\n%s", f.Cert, out.String())
		}
	}
	caBefore, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	err := runCommand(t, []string{"certs", "init", dir, "--job", "j", "--hosts", "host-c"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "exists already; nothing was written") {
		t.Errorf("certs init into a directory with a CA: %v, want a refusal", err)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "ca.pem")); !bytes.Equal(now, caBefore) {
		t.Error("the refused certs init changed ca.pem")
	}
	if _, err := os.Stat(filepath.Join(dir, "host-c.pem")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused certs init wrote host-c.pem: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"certs", "init", t.TempDir(), "--hosts", "h"}, "--job is required"},
		{[]string{"certs", "init", t.TempDir(), "--job", "j"}, "--hosts is required"},
		{[]string{"certs", "init", "--job", "j", "--hosts", "h"}, "accepts 1 arg"},
	} {
		err := runCommand(t, tc.args, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}
