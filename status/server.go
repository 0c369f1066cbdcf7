package status

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/phalanx-rt/phalanx/webui"
)

// A Source gives a job's status: a Model in the launcher, or a job's
// published snapshots read from etcd (Remote).
type Source interface {
	// Snapshot is the status now and its version.
	Snapshot() (Snapshot, uint64)
	// Changed closes at the first change after version v.
	Changed(v uint64) <-chan struct{}
}

//go:embed page.html
var page string

// Server serves a job's status page (/), its snapshot as JSON
// (/api/status), a stream of snapshots as server-sent events
// (/api/stream: one at once, then one at each change, at most every
// half second), and the page's assets (/assets/), which are embedded:
// the page needs no network beyond this server.
type Server struct {
	ln     net.Listener
	srv    *http.Server
	done   chan error
	cancel context.CancelFunc // ends every request's context: the streams
}

// Handler is the status page and its API over src.
func Handler(src Source) http.Handler {
	mux := http.NewServeMux()
	html := strings.Replace(page, "<!--assets-->", webui.Head("/assets/"), 1)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprint(w, html)
	})
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", webui.Handler()))
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
		s, _ := src.Snapshot()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s)
	})
	mux.HandleFunc("GET /api/stream", func(w http.ResponseWriter, r *http.Request) { stream(w, r, src) })
	return mux
}

// stream sends snapshots as server-sent events until the client goes.
func stream(w http.ResponseWriter, r *http.Request, src Source) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	tick := time.NewTicker(15 * time.Second) // a comment keeps proxies from closing an idle stream
	defer tick.Stop()
	var last uint64
	first := true
	for {
		s, v := src.Snapshot()
		if first || v != last {
			b, err := json.Marshal(s)
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
				return
			}
			fl.Flush()
			first, last = false, v
		}
		pace := time.NewTimer(500 * time.Millisecond)
		select {
		case <-r.Context().Done():
			pace.Stop()
			return
		case <-pace.C:
		}
		select {
		case <-r.Context().Done():
			return
		case <-src.Changed(last):
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			fl.Flush()
		}
	}
}

// Serve serves src's status page on addr (host:port; port 0 picks one).
func Serve(addr string, src Source) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("status: listening on %s: %w", addr, err)
	}
	base, cancel := context.WithCancel(context.Background())
	s := &Server{ln: ln, done: make(chan error, 1), cancel: cancel, srv: &http.Server{Handler: Handler(src), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return base }}}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address served.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops serving; streams under way end within ctx.
func (s *Server) Close(ctx context.Context) error {
	s.cancel()
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		err = s.srv.Close() // open streams
	}
	if e := <-s.done; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}
