package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// The job-wide records every worker reads or writes: the configuration
// hash, the done mark, a stop request and the final-checkpoint claim; and
// the watch of the generation record.

// Job is one job's records on one etcd cluster: the client and the job's
// key layout, which every read and write of the job's records takes
// together. Its methods are the job's operations; a Job is safe for
// concurrent use, as its client is.
type Job struct {
	cli  *clientv3.Client
	keys Keys
}

// NewJob is the handle of the job laid out by keys on cli's cluster. It
// does not own cli: closing the client is the caller's.
func NewJob(cli *clientv3.Client, keys Keys) *Job {
	return &Job{cli: cli, keys: keys}
}

// Client is the job's etcd client, for what the job's methods do not do
// (RegisterAt under another key, a session of one's own).
func (j *Job) Client() *clientv3.Client { return j.cli }

// Keys is the job's key layout.
func (j *Job) Keys() Keys { return j.keys }

// Connect is a client of the etcd cluster at endpoints; its own logs go to
// log (named "etcd-client"). With tlsCfg (the job's client side of mutual
// TLS) it speaks TLS: a bare host:port endpoint is taken as https, and
// an http:// one is refused, as is an https:// one without tlsCfg.
func Connect(endpoints []string, tlsCfg *tls.Config, log *zap.Logger) (*clientv3.Client, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("coordinator: no etcd endpoints")
	}
	if log == nil {
		log = zap.NewNop()
	}
	endpoints, err := Endpoints(endpoints, tlsCfg != nil)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: log.Named("etcd-client"), TLS: tlsCfg})
	if err != nil {
		return nil, fmt.Errorf("coordinator: etcd %v: %w", endpoints, err)
	}
	return cli, nil
}

// Endpoints are endpoints as a client with TLS (secure) or without it
// dials them: a bare host:port gets the scheme; a scheme that disagrees
// is an error naming the endpoint.
func Endpoints(endpoints []string, secure bool) ([]string, error) {
	out := make([]string, len(endpoints))
	for i, e := range endpoints {
		switch {
		case strings.HasPrefix(e, "https://") && !secure:
			return nil, fmt.Errorf("coordinator: etcd endpoint %q is https: it needs the job's TLS material (a CA, a certificate and a key)", e)
		case strings.HasPrefix(e, "http://") && secure:
			return nil, fmt.Errorf("coordinator: etcd endpoint %q is plain http, and TLS is configured: with TLS every endpoint is https://", e)
		case strings.Contains(e, "://"):
			out[i] = e
		case secure:
			out[i] = "https://" + e
		default:
			out[i] = e
		}
	}
	return out, nil
}

// DialOptions says how long Dial waits for etcd and how it says so.
type DialOptions struct {
	Logger *zap.Logger
	// TLS is the job's client side of mutual TLS (nil: plaintext).
	TLS *tls.Config
	// Wait bounds the wait for the cluster's first answer (default 30s).
	Wait time.Duration
	// Say is called every Every (default 5s) of the wait with a line that
	// says what is awaited ("waiting for etcd at 127.0.0.1:2379 (10s)");
	// nil: the line is logged at warn.
	Say   func(line string)
	Every time.Duration
}

// Dial connects to the etcd cluster at endpoints and returns once it
// answers a read. Until then it says every o.Every what it waits for; past
// o.Wait it gives up with an error naming the endpoints and the last
// failure; ctx ending ends the wait at once.
func Dial(ctx context.Context, endpoints []string, o DialOptions) (*clientv3.Client, error) {
	if o.Wait <= 0 {
		o.Wait = 30 * time.Second
	}
	if o.Every <= 0 {
		o.Every = 5 * time.Second
	}
	cli, err := Connect(endpoints, o.TLS, o.Logger)
	if err != nil {
		return nil, err
	}
	at := strings.Join(endpoints, ",")
	for _, e := range endpoints { // a URL's scheme says nothing to an operator
		at = strings.Replace(at, e, strings.TrimPrefix(strings.TrimPrefix(e, "http://"), "https://"), 1)
	}
	say := o.Say
	if say == nil {
		log := o.Logger
		if log == nil {
			log = zap.NewNop()
		}
		say = func(line string) { log.Warn(line) }
	}
	start := time.Now()
	deadline := start.Add(o.Wait)
	next := start.Add(o.Every)
	for {
		// A refused dial waits for its try's deadline: no try outlasts the
		// next line to say, nor the wait.
		try := time.Now().Add(2 * time.Second)
		for _, t := range []time.Time{next, deadline} {
			if try.After(t) {
				try = t
			}
		}
		tctx, cancel := context.WithDeadline(ctx, try)
		_, err = cli.Get(tctx, "/phalanx/", clientv3.WithCountOnly())
		cancel()
		switch {
		case err == nil:
			return cli, nil
		case ctx.Err() != nil:
			cli.Close()
			return nil, fmt.Errorf("coordinator: waiting for etcd at %s: %w", at, context.Cause(ctx))
		case !time.Now().Before(deadline):
			cli.Close()
			return nil, fmt.Errorf("coordinator: etcd at %s did not answer within %v%s: %w", at, o.Wait, dialErrors(cli.Endpoints(), o.TLS), err)
		}
		if now := time.Now(); !now.Before(next) {
			say(fmt.Sprintf("waiting for etcd at %s (%s)", at, now.Sub(start).Round(time.Second)))
			next = now.Add(o.Every)
		}
		select { // a refused connection may fail at once: pace the tries
		case <-ctx.Done():
		case <-time.After(max(0, min(200*time.Millisecond, time.Until(deadline), time.Until(next)))):
		}
	}
}

// dialErrors says why a connection to each endpoint fails, if it does:
// the client's own error after a wait only says that the wait ended. With
// tlsCfg it is a TLS handshake and a read, where TLS 1.3 hears a server's
// refusal of this client's certificate.
func dialErrors(endpoints []string, tlsCfg *tls.Config) string {
	var out []string
	for _, e := range endpoints {
		u, err := url.Parse(e)
		if err != nil || u.Host == "" {
			continue
		}
		c, err := net.DialTimeout("tcp", u.Host, time.Second)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		if tlsCfg != nil {
			cfg := tlsCfg.Clone()
			cfg.NextProtos = []string{"h2"}
			tc := tls.Client(c, cfg)
			tc.SetDeadline(time.Now().Add(time.Second))
			err = tc.Handshake()
			if err == nil {
				_, err = tc.Read(make([]byte, 1))
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				err = nil // it took the certificate and waits for the client's request
			}
			if err != nil {
				out = append(out, fmt.Sprintf("TLS with %s: %v", u.Host, err))
			}
		}
		c.Close()
	}
	if len(out) == 0 {
		return ""
	}
	return " (" + strings.Join(out, "; ") + ")"
}

// ClaimConfig records hash as the job's configuration when none is, and
// returns the recorded one: the caller compares.
func (j *Job) ClaimConfig(ctx context.Context, hash string) (recorded string, err error) {
	key := j.keys.Config()
	resp, err := j.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, hash)).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return "", fmt.Errorf("coordinator: recording the job configuration: %w", err)
	}
	if resp.Succeeded {
		return hash, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) != 1 {
		return "", fmt.Errorf("coordinator: %s vanished while read", key)
	}
	return string(kvs[0].Value), nil
}

// PublishStatus records the job's status (a launcher's snapshot, JSON),
// for `phalanx status` anywhere.
func (j *Job) PublishStatus(ctx context.Context, b []byte) error {
	if _, err := j.cli.Put(ctx, j.keys.Status(), string(b)); err != nil {
		return fmt.Errorf("coordinator: publishing the job's status: %w", err)
	}
	return nil
}

// ReadStatus is the job's last published status (nil: none) and its
// revision.
func (j *Job) ReadStatus(ctx context.Context) ([]byte, int64, error) {
	resp, err := j.cli.Get(ctx, j.keys.Status())
	if err != nil {
		return nil, 0, fmt.Errorf("coordinator: reading the job's status: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, nil
	}
	return resp.Kvs[0].Value, resp.Kvs[0].ModRevision, nil
}

// MarkDone records that the job finished in generation gen: the
// coordinator stops deciding and waiting workers exit.
func (j *Job) MarkDone(ctx context.Context, gen uint64) error {
	if _, err := j.cli.Put(ctx, j.keys.Done(), fmt.Sprintf("generation %d", gen)); err != nil {
		return fmt.Errorf("coordinator: recording that the job is done: %w", err)
	}
	return nil
}

// ClaimFinalCheckpoint: of the survivors of a stopped job, the one whose
// claim is first writes the final checkpoint. It reports whether owner won
// (a claim already recorded for owner is its own, retried after its answer
// was lost).
func (j *Job) ClaimFinalCheckpoint(ctx context.Context, owner string) (bool, error) {
	key := j.keys.FinalCheckpoint()
	resp, err := j.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, owner)).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return false, fmt.Errorf("coordinator: claiming the final checkpoint: %w", err)
	}
	return resp.Succeeded || string(valueOf(resp)) == owner, nil
}

// RequestStop asks every worker of the job to stop at the next step
// boundary after a final checkpoint.
func (j *Job) RequestStop(ctx context.Context, reason string) error {
	if err := idempotent(ctx, func(ctx context.Context) error {
		_, err := j.cli.Put(ctx, j.keys.Stop(), reason)
		return err
	}); err != nil {
		return fmt.Errorf("coordinator: requesting a stop: %w", err)
	}
	return nil
}

// WaitStop returns the reason of the job's stop request once there is one.
func (j *Job) WaitStop(ctx context.Context) (string, error) {
	for {
		resp, err := j.cli.Get(ctx, j.keys.Stop())
		if err != nil {
			return "", fmt.Errorf("coordinator: reading %s: %w", j.keys.Stop(), err)
		}
		if len(resp.Kvs) == 1 {
			return string(resp.Kvs[0].Value), nil
		}
		if err := awaitPut(ctx, j.cli, j.keys.Stop(), resp.Header.Revision); err != nil {
			return "", err
		}
	}
}

// WatchJob calls f with the job's generation record (nil before the first)
// and whether the job is done: first as they are, then at every change (g
// nil: unchanged),
// until f returns false or ctx ends. etcd trouble is retried (and logged);
// a corrupt generation record ends the watch with its error.
func (j *Job) WatchJob(ctx context.Context, log *zap.Logger, f func(g *phalanxpb.Generation, done bool) bool) error {
	for ctx.Err() == nil {
		resp, err := j.cli.Txn(ctx).Then(clientv3.OpGet(j.keys.Generation()), clientv3.OpGet(j.keys.Done(), clientv3.WithCountOnly())).Commit()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("reading the generation", zap.Error(err))
			}
			pause(ctx, 200*time.Millisecond)
			continue
		}
		g, err := decodeKV(j.keys, first(resp.Responses[0].GetResponseRange().Kvs))
		if err != nil {
			return err
		}
		if !f(g, resp.Responses[1].GetResponseRange().Count > 0) {
			return nil
		}
		switch err := watchJobFrom(ctx, j.cli, j.keys, log, resp.Header.Revision, f); {
		case errors.Is(err, errStopWatch):
			return nil
		case err != nil:
			return err
		}
	}
	return ctx.Err()
}

// errStopWatch ends watchJobFrom when f returns false.
var errStopWatch = errors.New("stop")

// watchJobFrom follows the job's keys after rev, the revision of the read
// f was last called with, until the watch breaks (nil: read again), f
// returns false or a record is corrupt.
func watchJobFrom(ctx context.Context, cli *clientv3.Client, keys Keys, log *zap.Logger, rev int64, f func(*phalanxpb.Generation, bool) bool) error {
	wch, stop := watchAfterRead(ctx, cli, rev, keys.Prefix(), clientv3.WithPrefix())
	defer stop()
	for wr := range wch {
		if err := wr.Err(); err != nil {
			if ctx.Err() == nil {
				log.Warn("watching the generation", zap.Error(err))
			}
			return nil
		}
		for _, ev := range wr.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			var g *phalanxpb.Generation
			done := false
			switch string(ev.Kv.Key) {
			case keys.Generation():
				var err error
				if g, err = decodeKV(keys, ev.Kv); err != nil {
					return err
				}
			case keys.Done():
				done = true
			default:
				continue
			}
			if !f(g, done) {
				return errStopWatch
			}
		}
	}
	return nil
}

func decodeKV(keys Keys, kv *mvccpb.KeyValue) (*phalanxpb.Generation, error) {
	if kv == nil {
		return nil, nil
	}
	return DecodeGeneration(keys.Generation(), kv.Value)
}

func first(kvs []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Leave records that worker id leaves the job on request (reason says
// why): when its registration goes, the coordinator names it as left, not
// lost. The worker withdraws its registration itself.
func (j *Job) Leave(ctx context.Context, id, reason string) error {
	if err := idempotent(ctx, func(ctx context.Context) error {
		_, err := j.cli.Put(ctx, j.keys.Departure(id), reason)
		return err
	}); err != nil {
		return fmt.Errorf("coordinator: recording that %s leaves: %w", id, err)
	}
	return nil
}

// ClearEnd removes a previous run's end of the job (its done mark, stop
// request and final-checkpoint claim), so that a job started again under
// the same name on the same etcd trains instead of ending at once.
func (j *Job) ClearEnd(ctx context.Context) error {
	_, err := j.cli.Txn(ctx).Then(clientv3.OpDelete(j.keys.Done()), clientv3.OpDelete(j.keys.Stop()), clientv3.OpDelete(j.keys.FinalCheckpoint())).Commit()
	if err != nil {
		return fmt.Errorf("coordinator: clearing the job's previous end: %w", err)
	}
	return nil
}
