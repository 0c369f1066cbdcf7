package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Server serves a process's metrics on /metrics, its liveness on /healthz
// and its readiness on /readyz (503 with the reason when not ready).
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan error
}

// Serve listens on addr (host:port; port 0 picks one) and serves g, with
// readiness from notReady (the reason the process is not ready, "" when
// it is). More handlers may be given by path.
func Serve(addr string, g prometheus.Gatherer, notReady func() string, more map[string]http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listening on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if why := notReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	for p, h := range more {
		mux.Handle(p, h)
	}
	s := &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, done: make(chan error, 1)}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address served.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops serving, within ctx for the requests under way.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if e := <-s.done; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

// Scraper gathers the phalanx_* metrics of other processes (a launcher's
// workers) from their /metrics, for one endpoint of the whole job. A
// process that does not answer within its timeout is left out of that
// gathering.
type Scraper struct {
	client  *http.Client
	mu      sync.Mutex
	targets map[string]string // by name: host:port
}

// NewScraper gives each scrape timeout.
func NewScraper(timeout time.Duration) *Scraper {
	return &Scraper{client: &http.Client{Timeout: timeout}, targets: map[string]string{}}
}

// Set scrapes addr as name from now on ("" : no longer).
func (s *Scraper) Set(name, addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if addr == "" {
		delete(s.targets, name)
		return
	}
	s.targets[name] = addr
}

// drop stops scraping name if it is still at addr.
func (s *Scraper) drop(name, addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.targets[name] == addr {
		delete(s.targets, name)
	}
}

// Targets are the addresses scraped, by name.
func (s *Scraper) Targets() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]string, len(s.targets))
	for k, v := range s.targets {
		m[k] = v
	}
	return m
}

// Gather scrapes every target at once and merges their phalanx_*
// families.
func (s *Scraper) Gather() ([]*dto.MetricFamily, error) {
	targets := s.Targets()
	type result struct {
		fams map[string]*dto.MetricFamily
		err  error
	}
	res := make(chan result, len(targets))
	for name, addr := range targets {
		go func() {
			f, err := s.scrape(addr)
			if errors.Is(err, syscall.ECONNREFUSED) {
				s.drop(name, addr) // nothing listens there any more: the process ended
			}
			if err != nil {
				err = fmt.Errorf("metrics: scraping %s at %s: %w", name, addr, err)
			}
			res <- result{f, err}
		}()
	}
	byName := map[string]*dto.MetricFamily{}
	var errs []error
	for range targets {
		r := <-res
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		for name, f := range r.fams {
			if !strings.HasPrefix(name, "phalanx_") {
				continue
			}
			if have, ok := byName[name]; ok {
				have.Metric = append(have.Metric, f.Metric...)
				continue
			}
			byName[name] = f
		}
	}
	out := make([]*dto.MetricFamily, 0, len(byName))
	for _, f := range byName {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, errors.Join(errs...)
}

func (s *Scraper) scrape(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := s.client.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}
