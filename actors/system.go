package actors

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/phalanx-rt/phalanx/internal/netaddr"
)

// Options configure a System.
type Options struct {
	Logger *zap.Logger
	// Remote starts protoactor's gRPC server so actors of other processes can
	// reach this system's actors.
	Remote bool
	// Bind is the remote listen address (default 127.0.0.1:0, a free port;
	// IPv6 as [::1]:0).
	Bind string
	// Advertise is the address other processes use, when Bind is not it:
	// host:port, or a host alone, which takes the bound port. A Bind of
	// every interface (0.0.0.0, ::, or no host) needs one.
	Advertise string
	// MaxMessageBytes bounds a received gRPC batch (default 16 MiB; gRPC's own
	// 4 MiB default drops larger batches silently).
	MaxMessageBytes int
	// ServerTLS and ClientTLS, both set, make the remote mutual TLS (the
	// job's: pki): its server admits only a client whose certificate its
	// config verifies, logging a refusal at warn with the peer and the
	// reason, and its dialers present theirs; plaintext is refused both
	// ways. Both nil: plaintext.
	ServerTLS, ClientTLS *tls.Config
}

// System is a process's actor system.
type System struct {
	*actor.ActorSystem
	remote *remote.Remote
	log    *zap.Logger
	level  zap.AtomicLevel // of protoactor's own logs
}

// NewSystem starts an actor system whose own logs go to opts.Logger.
func NewSystem(opts Options) (sys *System, err error) {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	base := log.Named("protoactor").Core()
	lowest := zapcore.DebugLevel
	for lowest < zapcore.FatalLevel && !base.Enabled(lowest) {
		lowest++
	}
	level := zap.NewAtomicLevelAt(lowest)
	core := base // a logger that logs nothing needs no filter
	if base.Enabled(lowest) {
		if core, err = zapcore.NewIncreaseLevelCore(base, level); err != nil {
			return nil, fmt.Errorf("actors: logger: %w", err)
		}
	}
	as := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(protoactorHandler(core))
	}))
	s := &System{ActorSystem: as, log: log, level: level}
	if !opts.Remote {
		return s, nil
	}
	bind := opts.Bind
	if bind == "" {
		bind = "127.0.0.1:0"
	}
	host, portStr, err := net.SplitHostPort(bind)
	if err != nil {
		return nil, fmt.Errorf("actors: bind address %q: %w", bind, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("actors: bind address %q: port: %w", bind, err)
	}
	if err := netaddr.Check(bind, opts.Advertise); err != nil {
		return nil, fmt.Errorf("actors: %w", err)
	}
	if _, _, err := net.SplitHostPort(opts.Advertise); opts.Advertise != "" && err != nil && port == 0 {
		// A host alone takes the bound port, and protoactor advertises
		// what it is given before it listens: learn a free port first
		// (another process could take it in between; Start then fails,
		// named).
		l, err := net.Listen("tcp", bind)
		if err != nil {
			return nil, fmt.Errorf("actors: listen on %s: %w", bind, err)
		}
		port = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	advertise := netaddr.Advertised(opts.Advertise, port)
	if strings.Contains(host, ":") {
		host = "[" + host + "]" // protoactor joins host and port with a colon
	}
	maxBytes := opts.MaxMessageBytes
	if maxBytes <= 0 {
		maxBytes = 16 << 20
	}
	if (opts.ServerTLS == nil) != (opts.ClientTLS == nil) {
		return nil, fmt.Errorf("actors: TLS needs both a server and a client configuration")
	}
	serverOpts := []grpc.ServerOption{grpc.MaxRecvMsgSize(maxBytes)}
	cfgOpts := []remote.ConfigOption{remote.WithEndpointWriterBatchSize(64)}
	if opts.ServerTLS != nil {
		serverOpts = append(serverOpts, grpc.Creds(refusalLog{credentials.NewTLS(opts.ServerTLS), log}))
		// In place of protoactor's default, plaintext (grpc.WithInsecure).
		cfgOpts = append(cfgOpts, remote.WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(opts.ClientTLS))))
	}
	cfgOpts = append(cfgOpts, remote.WithServerOptions(serverOpts...))
	if advertise != "" {
		cfgOpts = append(cfgOpts, remote.WithAdvertisedHost(advertise))
	}
	s.remote = remote.NewRemote(as, remote.Configure(host, port, cfgOpts...))
	defer func() {
		if v := recover(); v != nil { // Start panics when it cannot listen
			as.Shutdown()
			sys, err = nil, fmt.Errorf("actors: starting remote on %s: %v", bind, v)
		}
	}()
	s.remote.Start()
	return s, nil
}

// refusalLog logs the server side's failed handshakes: gRPC closes such
// a connection without a word to the application.
type refusalLog struct {
	credentials.TransportCredentials
	log *zap.Logger
}

func (r refusalLog) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := r.TransportCredentials.ServerHandshake(c)
	if err != nil {
		r.log.Warn("actors: refused a connection: TLS", zap.String("peer", c.RemoteAddr().String()), zap.String("reason", err.Error()))
	}
	return conn, info, err
}

func (r refusalLog) Clone() credentials.TransportCredentials {
	return refusalLog{r.TransportCredentials.Clone(), r.log}
}

// Address is where other processes reach this system ("nonhost" when it is
// not remote).
func (s *System) Address() string { return s.ProcessRegistry.Address }

// Ref is the PID of actor id on the system at address.
func Ref(address, id string) *actor.PID { return actor.NewPID(address, id) }

// Quiet silences protoactor's own logs below fatal. A job calls it on every
// process before the processes agree to stop (a barrier) and shut down: the
// remote endpoints then report each peer's departure as a lost connection,
// which is not news.
func (s *System) Quiet() { s.level.SetLevel(zapcore.FatalLevel) }

// Shutdown stops the remote server and the actor system.
func (s *System) Shutdown() {
	if s.remote != nil {
		s.remote.Shutdown(false)
	}
	s.ActorSystem.Shutdown()
}

// protoactorHandler routes protoactor's log/slog lines into core: without
// stack traces (the process's logger decides those for its own lines), and
// with a peer's connection ending told at info, not as an error: a worker
// that leaves the job, gracefully or killed, ends its connections, and
// whether that is a loss is the membership layer's to say.
func protoactorHandler(core zapcore.Core) slog.Handler {
	return peerEndsAtInfo{zapslog.NewHandler(core, zapslog.AddStacktraceAt(slog.Level(math.MaxInt32)))}
}

// peerEnded reports whether msg is one of protoactor's error lines that
// only say a peer's connection ended.
func peerEnded(msg string) bool { return msg == "EndpointWriter lost connection" }

// peerEndsAtInfo logs peerEnded lines at info.
type peerEndsAtInfo struct{ slog.Handler }

func (h peerEndsAtInfo) Enabled(ctx context.Context, l slog.Level) bool {
	return h.Handler.Enabled(ctx, l) || (l >= slog.LevelError && h.Handler.Enabled(ctx, slog.LevelInfo))
}

func (h peerEndsAtInfo) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError && peerEnded(r.Message) {
		r.Level = slog.LevelInfo
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h peerEndsAtInfo) WithAttrs(as []slog.Attr) slog.Handler {
	return peerEndsAtInfo{h.Handler.WithAttrs(as)}
}

func (h peerEndsAtInfo) WithGroup(name string) slog.Handler {
	return peerEndsAtInfo{h.Handler.WithGroup(name)}
}
