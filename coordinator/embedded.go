package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/phalanx-rt/phalanx/pki"
)

// EmbeddedOptions configure an in-process etcd server.
type EmbeddedOptions struct {
	Dir    string // data directory (required)
	Name   string // member name (default "phalanx")
	Host   string // listen host (default 127.0.0.1)
	Logger *zap.Logger
	// A member of a multi-member cluster: its own client and peer ports
	// (0: chosen at start) and the initial cluster, name=http://host:peer,...
	// naming every member. Empty: a single-member cluster.
	ClientPort, PeerPort int
	InitialCluster       string
	// ReadyTimeout bounds the start (default 30s).
	ReadyTimeout time.Duration
	// TLS, when its files are named, serves clients and peers over mutual
	// TLS (https URLs; InitialCluster's too): a client or peer must present
	// a certificate signed by TLS.CA whose common name is pki.JobCN of one
	// of Jobs (default: the jobs the member's own certificate names), so
	// a certificate of another job is refused under the same CA. A
	// refused connection is logged at warn with the peer and the reason.
	TLS  pki.Files
	Jobs []string
}

// Embedded is a single-member etcd server running in this process, on
// loopback ports chosen at start.
type Embedded struct {
	etcd      *embed.Etcd
	endpoints []string
	level     zap.AtomicLevel // of etcd's own log; raised while closing
}

// freePort asks the kernel for an unused port on host. The port is free when
// returned; etcd binds it a moment later.
func freePort(host string) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", err
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	return port, err
}

// StartEmbedded starts the server and waits until it serves. Ports it
// chooses itself are free when chosen but bound a moment later, when
// another process may have taken one: a start that finds its port in use
// is tried again on others, a few times.
func StartEmbedded(ctx context.Context, opts EmbeddedOptions) (*Embedded, error) {
	return startEmbedded(ctx, opts, freePort)
}

// portAttempts bounds the starts on ports chosen by StartEmbedded.
const portAttempts = 5

func startEmbedded(ctx context.Context, opts EmbeddedOptions, pick func(host string) (string, error)) (*Embedded, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("coordinator: embedded etcd needs a data directory")
	}
	if opts.Name == "" {
		opts.Name = "phalanx"
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 30 * time.Second
	}
	if opts.TLS.Enabled() {
		m, err := pki.Load(opts.TLS, "", nil) // the files' own problems, named, before etcd's
		if err != nil {
			return nil, fmt.Errorf("coordinator: embedded etcd: %w", err)
		}
		if len(opts.Jobs) == 0 {
			opts.Jobs = m.Jobs()
		}
	}
	for attempt := 1; ; attempt++ {
		e, err := startOnce(ctx, opts, pick)
		if err == nil || !inUse(err) || opts.ClientPort != 0 && opts.PeerPort != 0 || attempt == portAttempts {
			return e, err
		}
		opts.Logger.Warn("embedded etcd: a chosen port was taken before etcd bound it; trying others", zap.Int("attempt", attempt), zap.Error(err))
	}
}

// inUse reports whether err is a listener's "address already in use".
func inUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

// startOnce starts the server once, on the ports of opts or, where those
// are 0, on ports pick chooses.
func startOnce(ctx context.Context, opts EmbeddedOptions, pick func(host string) (string, error)) (*Embedded, error) {
	clientPort, peerPort := strconv.Itoa(opts.ClientPort), strconv.Itoa(opts.PeerPort)
	var err error
	if opts.ClientPort == 0 {
		if clientPort, err = pick(opts.Host); err != nil {
			return nil, fmt.Errorf("coordinator: embedded etcd: %w", err)
		}
	}
	if opts.PeerPort == 0 {
		if peerPort, err = pick(opts.Host); err != nil {
			return nil, fmt.Errorf("coordinator: embedded etcd: %w", err)
		}
	}
	scheme := "http"
	cfg := embed.NewConfig()
	if opts.TLS.Enabled() {
		scheme = "https"
		cns := make([]string, len(opts.Jobs))
		for i, j := range opts.Jobs {
			cns[i] = pki.JobCN(j)
		}
		// etcd logs its refusals itself (its HandshakeFailure is its own):
		// refusals below turns them into this package's.
		info := transport.TLSInfo{CertFile: opts.TLS.Cert, KeyFile: opts.TLS.Key, TrustedCAFile: opts.TLS.CA, ClientCertAuth: true,
			AllowedCNs: cns, MinVersion: tls.VersionTLS13, Logger: opts.Logger.Named("etcd-tls")}
		cfg.ClientTLSInfo, cfg.PeerTLSInfo = info, info
	}
	cu := url.URL{Scheme: scheme, Host: net.JoinHostPort(opts.Host, clientPort)}
	pu := url.URL{Scheme: scheme, Host: net.JoinHostPort(opts.Host, peerPort)}
	cfg.Name = opts.Name
	cfg.Dir = opts.Dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if opts.InitialCluster != "" {
		cfg.InitialCluster = opts.InitialCluster
		cfg.InitialClusterToken = "phalanx"
	}
	cfg.ListenMetricsUrls = nil
	// A job that runs for weeks rewrites its status and pace keys: keep an
	// hour of history (watches reread after a compaction), not all of it.
	cfg.AutoCompactionMode, cfg.AutoCompactionRetention = "periodic", "1h"
	cfg.Logger = "zap"
	level := zap.NewAtomicLevelAt(zap.ErrorLevel) // its warnings (single port, simple token) are expected here
	etcdLog := opts.Logger.Named("etcd").WithOptions(zap.IncreaseLevel(level), zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewTee(c, refusals{opts.Logger})
	}))
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdLog)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("coordinator: starting embedded etcd in %s: %w", opts.Dir, err)
	}
	timer := time.NewTimer(opts.ReadyTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("coordinator: embedded etcd: %w", err)
	case <-timer.C:
		e.Close()
		return nil, fmt.Errorf("coordinator: embedded etcd not ready within %s", opts.ReadyTimeout)
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	}
	return &Embedded{etcd: e, endpoints: []string{cu.String()}, level: level}, nil
}

// refusals passes etcd's own log of a refused TLS connection, whatever
// the level kept of etcd's other lines, to out as "etcd refused a
// connection: TLS" with the peer's address and the reason.
type refusals struct{ out *zap.Logger }

func (r refusals) Enabled(zapcore.Level) bool        { return true }
func (r refusals) With([]zapcore.Field) zapcore.Core { return r }
func (r refusals) Sync() error                       { return nil }

func (r refusals) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if strings.HasPrefix(e.Message, "rejected connection on ") {
		return ce.AddCore(e, r)
	}
	return ce
}

func (r refusals) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	peer, _ := enc.Fields["remote-addr"].(string)
	reason, _ := enc.Fields["error"].(string)
	r.out.Warn("etcd refused a connection: TLS", zap.String("peer", peer), zap.String("reason", reason),
		zap.String("endpoint", strings.TrimPrefix(e.Message, "rejected connection on ")))
	return nil
}

// Endpoints are the client URLs.
func (e *Embedded) Endpoints() []string { return e.endpoints }

// Close stops the server. etcd's complaints about its own listeners closing
// are not logged.
func (e *Embedded) Close() {
	e.level.SetLevel(zap.FatalLevel)
	e.etcd.Close()
}
