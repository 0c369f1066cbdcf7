package phalanx_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// statusEvents keeps what a job said of its status page and workers.
type statusEvents struct {
	mu      sync.Mutex
	job     string
	etcd    []string
	addr    string
	pids    map[int]int
	saved   int
	changed chan struct{}
}

func (s *statusEvents) Emit(event string, fields ...events.Field) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	get := func(k string) any { return fieldOf(fields, k) }
	switch event {
	case "job_started":
		s.job, s.etcd = get("job").(string), strings.Split(get("etcd_endpoints").(string), ",")
	case "status_serving":
		s.addr = get("address").(string)
	case "worker_started":
		s.pids[get("worker").(int)] = get("pid").(int)
	case "checkpoint_saved":
		s.saved++
	}
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

// chromium is the headless browser of the page tests: Debian's, with the
// flags that keep it off the network and a fresh profile. Without it the
// test skips loudly, and fails under CI=true.
func chromium(t *testing.T) context.Context {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is not installed (scripts/install-chromium): the status page cannot be tested")
		}
		t.Skip("SKIPPED LOUDLY: chromium is not installed (run scripts/install-chromium); the status page is not tested")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(filepath.Join(t.TempDir(), "profile")),
		chromedp.WindowSize(1400, 1500),
	}
	// The browser lives at most as long as the test may: every action
	// under it has that deadline at the latest (waits give their own).
	actx, cancelAlloc := chromedp.NewExecAllocator(testwait.Context(t, 5*time.Minute), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	return ctx
}

// screenshot keeps the page's image in dir (default: the test's
// temporary directory; $PHALANX_SCREENSHOTS keeps it after the test).
func screenshot(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: a PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("PHALANX_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	if len(png) < 20000 {
		t.Fatalf("screenshot %s is %d bytes: an empty page?", path, len(png))
	}
	t.Logf("screenshot: %s", path)
	return path
}

// poll waits, within limit, for the page's expression to be true.
func poll(t *testing.T, ctx context.Context, limit time.Duration, what, expr string) {
	t.Helper()
	pctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	ok, err := chromedp.Run(pctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil || !ok {
		body, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("header")))
		t.Fatalf("waited %v for the page to show %s (%s): %v; its header: %q", limit, what, expr, err, body)
	}
}

// killBound is how soon after a worker's SIGKILL the page must show the
// smaller ring: the survivors see its sockets close at once, the
// coordinator decides within its probe, and the page streams each change.
const killBound = 30 * time.Second

// TestStatusPageInChromium opens a running job's status page in a real
// headless Chromium: it shows the job's world size, generation and step,
// the ring, every worker training, a checkpoint and the loss curve drawn
// with its legend; after a worker's SIGKILL it shows, within killBound,
// the ring of the two left and the lost worker. The screenshots are kept
// (PHALANX_SCREENSHOTS), and the time from the kill to the page's change
// is logged.
func TestStatusPageInChromium(t *testing.T) {
	ctx := chromium(t)
	lc := smallJob()
	lc.Workers, lc.Steps, lc.Status = 3, 1000000, "127.0.0.1:0"
	lc.Checkpoint.Location, lc.Checkpoint.EverySteps = t.TempDir(), 400
	ev := &statusEvents{pids: map[int]int{}, changed: make(chan struct{}, 1)}
	lc.Events = ev
	startRunning(t, lc)
	ev.mu.Lock()
	addr := ev.addr
	ev.mu.Unlock()
	if addr == "" {
		t.Fatal("the job said nothing of its status page (status_serving)")
	}
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+addr+"/")); err != nil {
		t.Fatalf("opening the status page: %v", err)
	}
	poll(t, ctx, time.Minute, "three ranks training, a checkpoint and the curve drawn", `(() => {
		const txt = id => document.getElementById(id).textContent;
		return txt("world") === "3" && txt("generation") === "1" && Number(txt("step")) > 0 &&
			document.querySelectorAll("#ring .rank").length === 3 &&
			[...document.querySelectorAll("#workers tr")].filter(r => r.textContent.includes("training")).length === 3 &&
			document.querySelectorAll("#checkpoints tr").length > 0 &&
			document.querySelector("#chart canvas") !== null &&
			document.querySelector("#chart .ph-legend").textContent.includes("generation 1") &&
			document.getElementById("conn").textContent.startsWith("live");
	})()`)
	screenshot(t, ctx, "status.png")

	ev.mu.Lock()
	pid := ev.pids[2]
	ev.mu.Unlock()
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, killBound, "the ring of two after the kill", `(() => {
		const txt = id => document.getElementById(id).textContent;
		return txt("world") === "2" && document.querySelectorAll("#ring .rank").length === 2;
	})()`)
	t.Logf("the page showed the ring of two %v after worker 2's SIGKILL (bound %v)", time.Since(killed).Round(time.Millisecond), killBound)
	poll(t, ctx, time.Minute, "the lost worker and its generation", `(() => {
		const w = document.querySelector('#workers tr[data-worker="2"]');
		return w !== null && /lost|exited/.test(w.textContent) &&
			document.getElementById("generations").textContent.includes("lost rank") &&
			document.querySelector("#chart .ph-legend").textContent.includes("lost");
	})()`)
	header, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("header")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(header, "training") {
		t.Errorf("the header says %q after the kill: want the job still training", header)
	}
	screenshot(t, ctx, "status-after-kill.png")

	// phalanx status reads the same from the job's etcd, where the
	// launcher publishes it.
	ev.mu.Lock()
	name, etcd := ev.job, ev.etcd
	ev.mu.Unlock()
	var st phalanx.StatusSnapshot
	testwait.Until(t, time.Minute, "the published status of the ring of two", func() bool {
		st, err = phalanx.JobStatus(testwait.Context(t, 10*time.Second), phalanx.Access{Etcd: etcd, Job: name})
		return err == nil && st.World == 2 && st.Generation == 2
	})
	var table strings.Builder
	if err := phalanx.WriteStatus(&table, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"training · generation 2 · world 2", "lost rank 2", "signal: killed", "manifest CRC32C"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("phalanx status's table lacks %q:\n%s", want, table.String())
		}
	}

	// phalanx status --serve: the same page away from the launcher, from
	// the job's etcd.
	sctx, cancel := context.WithCancel(testwait.Context(t, 2*time.Minute))
	served := make(chan string, 1)
	ended := make(chan error, 1)
	go func() {
		ended <- phalanx.ServeStatus(sctx, phalanx.Access{Etcd: etcd, Job: name}, "127.0.0.1:0", func(a string) { served <- a })
	}()
	defer func() {
		cancel()
		if err := testwait.Recv(t, ended, time.Minute, "ServeStatus's end"); err != nil {
			t.Errorf("ServeStatus: %v", err)
		}
	}()
	remote := testwait.Recv(t, served, time.Minute, "ServeStatus's address")
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+remote+"/")); err != nil {
		t.Fatalf("opening the page served from etcd: %v", err)
	}
	poll(t, ctx, time.Minute, "the ring of two, read from etcd", `(() => {
		const txt = id => document.getElementById(id).textContent;
		return txt("world") === "2" && txt("generation") === "2" && document.querySelectorAll("#ring .rank").length === 2 &&
			document.getElementById("conn").textContent.startsWith("live");
	})()`)
}
