package consul

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// ErrNoLeader is Leader's answer when nobody holds the election's key.
var ErrNoLeader = errors.New("no leader elected")

// ErrNotLeader is Resign's answer when this Election does not lead.
var ErrNotLeader = errors.New("not the leader")

// Leader is who holds an election's key: the value the leader campaigned
// with and its session. An empty Session means nobody leads.
type Leader struct {
	Value   []byte
	Session string
}

// Election is a leader election on one key, like etcd's
// concurrency.Election: the leader holds the key as a Mutex under its
// session, with its value in the key. While it leads, Lost closes as soon
// as it no longer does: its session ended, the key was released or deleted
// from outside, or the key could not be read for longer than the session's
// TTL (by then Consul may have invalidated the session without our
// hearing).
type Election struct {
	s    *Session
	key  string
	opts MutexOptions

	mu     sync.Mutex
	m      *Mutex
	lost   chan struct{}
	cancel context.CancelFunc // ends the current term's watch
	done   chan struct{}      // closed when that watch has returned
}

// NewElection is the election on key for session s. opts' Value is
// ignored (Campaign says it); its Flags are written with the key.
func NewElection(s *Session, key string, opts MutexOptions) *Election {
	closed := make(chan struct{})
	close(closed)
	return &Election{s: s, key: key, opts: opts, lost: closed}
}

// Key is the election's key.
func (e *Election) Key() string { return e.key }

// Campaign waits until this session holds the key with value, or ctx ends,
// or the session is lost. On success it leads until Resign or Lost.
func (e *Election) Campaign(ctx context.Context, value []byte) error {
	opts := e.opts
	opts.Value = value
	m := NewMutex(e.s, e.key, opts)
	if err := m.Lock(ctx); err != nil {
		return fmt.Errorf("campaign: %w", err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	lost, done := make(chan struct{}), make(chan struct{})
	e.mu.Lock()
	e.m, e.lost, e.cancel, e.done = m, lost, cancel, done
	e.mu.Unlock()
	go e.watchTerm(wctx, lost, done)
	return nil
}

// watchTerm closes lost when this session no longer holds the key.
func (e *Election) watchTerm(ctx context.Context, lost, done chan struct{}) {
	defer close(done)
	defer close(lost)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-e.s.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	// Reads failing for longer than the TTL end the term: by then Consul
	// may have invalidated the session without our hearing.
	var stepDown *time.Timer
	defer func() {
		if stepDown != nil {
			stepDown.Stop()
		}
	}()
	_ = Watch(ctx, KeyQuery(e.s.client, e.key), WatchOptions{
		Logf: e.opts.Logf, What: "watching election key " + e.key,
		OnFailing: func(error, int) { stepDown = time.AfterFunc(e.s.opts.TTL, cancel) },
		OnRecovered: func(int) {
			stepDown.Stop()
			stepDown = nil
		},
	}, func(p *api.KVPair, _ uint64) error {
		if p == nil || p.Session != e.s.ID() {
			return ErrStopWatch
		}
		return nil
	})
}

// Lost closes when the current term ends (see Election); it is closed
// when this Election does not lead.
func (e *Election) Lost() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lost
}

// IsLeader reports whether this Election leads now.
func (e *Election) IsLeader() bool {
	select {
	case <-e.Lost():
		return false
	default:
		return true
	}
}

// Resign ends the term and releases the key, so that another campaigner
// takes it at once (a release has no lock-delay). It returns ErrNotLeader
// if there was no term.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	m, cancel, done := e.m, e.cancel, e.done
	e.m, e.cancel, e.done = nil, nil, nil
	e.mu.Unlock()
	if m == nil {
		return ErrNotLeader
	}
	cancel()
	<-done
	if err := m.Unlock(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
		return fmt.Errorf("resign: %w", err)
	}
	return nil
}

// Leader reads who leads now; ErrNoLeader when nobody does.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	// Consistent: a restarted server answers default reads before it has
	// applied its log again, and would say nobody leads.
	p, _, err := e.s.client.KV().Get(e.key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return Leader{}, fmt.Errorf("read leader %s: %w", e.key, err)
	}
	if p == nil || p.Session == "" {
		return Leader{}, ErrNoLeader
	}
	return Leader{Value: p.Value, Session: p.Session}, nil
}

// Observe sends who leads each time that changes (an empty Session when
// nobody does), starting with who leads now, until ctx ends; the channel
// holds only the latest news.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	out := make(chan Leader, 1)
	go func() {
		defer close(out)
		var last *Leader
		_ = Watch(ctx, KeyQuery(e.s.client, e.key), WatchOptions{Logf: e.opts.Logf, What: "observing election " + e.key},
			func(p *api.KVPair, _ uint64) error {
				var l Leader
				if p != nil && p.Session != "" {
					l = Leader{Value: p.Value, Session: p.Session}
				}
				if last != nil && last.Session == l.Session && string(last.Value) == string(l.Value) {
					return nil
				}
				last = &l
				select {
				case <-out:
				default:
				}
				out <- l
				return nil
			})
	}()
	return out
}
