package coordinator

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// A port chosen for the embedded etcd but taken before etcd binds it (by
// another process, between the choice and the bind): the start is tried
// again on other ports; with every choice taken, it fails after
// portAttempts, saying why.
func TestEmbeddedRetriesATakenPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, taken, _ := net.SplitHostPort(held.Addr().String())

	picks := 0
	e, err := startEmbedded(ctx, EmbeddedOptions{Dir: t.TempDir()}, func(host string) (string, error) {
		if picks++; picks == 1 {
			return taken, nil
		}
		return freePort(host)
	})
	if err != nil {
		t.Fatalf("a start whose first client port was taken: %v", err)
	}
	defer e.Close()
	if picks != 4 || strings.HasSuffix(e.Endpoints()[0], ":"+taken) {
		t.Errorf("%d ports picked, serving on %v; want two starts (4 picks), not on the taken port %s", picks, e.Endpoints(), taken)
	}

	picks = 0
	_, err = startEmbedded(ctx, EmbeddedOptions{Dir: t.TempDir()}, func(string) (string, error) {
		picks++
		return taken, nil
	})
	if err == nil || !inUse(err) || picks != 2*portAttempts {
		t.Errorf("every port taken: %v after %d picks; want the bind's error after %d starts", err, picks, portAttempts)
	}
}
