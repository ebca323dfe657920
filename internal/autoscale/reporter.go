package autoscale

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/gpujob/gpujob/internal/errlog"
	"log"
	"time"

	"github.com/gpujob/gpujob/internal/backoff"
	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/servekv"
	consulapi "github.com/hashicorp/consul/api"
)

// DefaultReportInterval is how often a Reporter publishes without a Kick.
const DefaultReportInterval = time.Second

// kickSpacing is the least time between two publications: a burst of Kicks
// (every request queued while a service scales from zero calls one) makes
// one write, not a write per request.
const kickSpacing = 100 * time.Millisecond

// Reporter publishes a gateway's Load to servekv.LoadKey(gwPrefix, id),
// held under a Consul session of its own (behavior delete), so that the
// report of a gateway that dies disappears with its session instead of
// counting forever. It publishes every Interval and, at most every 100 ms,
// as soon as Kick is called.
type Reporter struct {
	// Logf receives errors (throttled) and session changes; it defaults to
	// log.Printf. Set it before Run.
	Logf func(format string, args ...any)

	client   *consulapi.Client
	key      string
	id       string
	snapshot func() servekv.Load
	interval time.Duration
	kick     chan struct{}
}

// NewReporter returns a Reporter of gateway id's load, taken by snapshot,
// every interval (DefaultReportInterval if not positive).
func NewReporter(c *consulapi.Client, gwPrefix, id string, snapshot func() servekv.Load, interval time.Duration) *Reporter {
	if interval <= 0 {
		interval = DefaultReportInterval
	}
	return &Reporter{
		Logf:   log.Printf,
		client: c, key: servekv.LoadKey(gwPrefix, id), id: id,
		snapshot: snapshot, interval: interval,
		kick: make(chan struct{}, 1),
	}
}

// Kick asks for a publication now (the load changed in a way the
// autoscaler should hear of at once, e.g. a request queued for a service
// with no replica). It never blocks; Kicks before the publication coalesce.
func (r *Reporter) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run publishes until ctx ends, then destroys its session, which deletes
// the report. It returns nil when ctx ends; before, it retries every error.
func (r *Reporter) Run(ctx context.Context) error {
	if r.client == nil || r.snapshot == nil {
		return fmt.Errorf("load reporter %s: no Consul client or snapshot", r.id)
	}
	logf := r.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	errs := errlog.New(logf, "publishing the load report "+r.key)
	bo := backoff.New(backoffBase, backoffCap)
	for ctx.Err() == nil {
		// Nothing else competes for the key: after losing a session
		// the reporter must be able to take it again at once (no
		// lock-delay).
		s, err := newSession(ctx, r.client, "gpujob-gateway-load "+r.id, consulapi.SessionBehaviorDelete, 0, logf)
		if err != nil {
			return nil // ctx ended
		}
		r.publishUnder(ctx, s, errs, bo)
		closeSession(s, logf)
		if ctx.Err() == nil {
			logf("load reporter %s: consul session lost; starting a new one", r.id)
		}
	}
	return nil
}

// publishUnder publishes under session s until ctx ends or s is lost.
func (r *Reporter) publishUnder(ctx context.Context, s *consul.Session, errs *errlog.Run, bo *backoff.Backoff) {
	var last time.Time
	wait := time.Duration(0) // publish at once
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.Done():
			t.Stop()
			return
		case <-r.kick:
			t.Stop()
			if d := kickSpacing - time.Since(last); d > 0 && !backoff.Sleep(ctx, d) {
				return
			}
		case <-t.C:
		}
		// A Kick arriving while this publication is taken is already
		// served by it.
		select {
		case <-r.kick:
		default:
		}
		if err := r.publish(ctx, s.ID()); err != nil {
			if ctx.Err() != nil {
				return
			}
			errs.Failed(err)
			s.Check()
			wait = bo.Next()
			continue
		}
		errs.OK()
		bo.Reset()
		last = time.Now()
		wait = r.interval
	}
}

// publish writes one report, acquiring the key with the session (which
// also updates it when the session already holds it).
func (r *Reporter) publish(ctx context.Context, sessionID string) error {
	l := r.snapshot()
	l.Gateway = r.id
	if l.Updated.IsZero() {
		l.Updated = time.Now()
	}
	b, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("encoding the load report: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	ok, _, err := r.client.KV().Acquire(&consulapi.KVPair{Key: r.key, Value: b, Session: sessionID},
		(&consulapi.WriteOptions{}).WithContext(wctx))
	if err != nil {
		return fmt.Errorf("writing %s: %w", r.key, err)
	}
	if !ok {
		// Another session holds it: a previous run of this gateway ID
		// whose session has not expired yet, or a second gateway with the
		// same ID. The first clears within the TTL.
		return fmt.Errorf("writing %s: the key is held by another consul session", r.key)
	}
	return nil
}
