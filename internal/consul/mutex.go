package consul

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/backoff"
	"github.com/gpujob/gpujob/internal/errlog"
)

// ErrLocked is TryLock's answer when another session holds the key.
var ErrLocked = errors.New("consul lock held by another session")

// ErrNotHeld is Unlock's answer when this Mutex does not hold the key.
var ErrNotHeld = errors.New("consul lock not held")

// lockWaitTime is one blocking query's longest wait for the key to change;
// the context ends it sooner.
const lockWaitTime = 5 * time.Minute

// MutexOptions shape the key a Mutex writes, so that a key another
// implementation writes keeps its exact format (see Mutex).
type MutexOptions struct {
	// Value is the key's value while held (nil: empty).
	Value []byte
	// Flags are the key's flags while held. A key that consulapi.Lock
	// also takes must carry api.LockFlagValue: consulapi.Lock refuses a
	// key with other flags (ErrLockConflict).
	Flags uint64
	// LockDelay bounds the wait for a key that is free but refused to us
	// because Consul's lock-delay of its last holder still runs (Consul
	// does not say for how long; nothing in Consul changes when it ends, so
	// no blocking query wakes). The Mutex retries with backoff up to it;
	// 0 means Consul's default lock-delay, 15 s.
	LockDelay time.Duration
	// OnWait, if set, is called when Lock finds the key held by another
	// session, once per holder (say, to log who it waits for, or to end
	// a session of its own predecessor). It runs on Lock's goroutine.
	OnWait func(ctx context.Context, holder *api.KVPair)
	// Logf hears of failed requests (throttled); optional.
	Logf func(format string, args ...any)
}

// Mutex is a Consul KV lock on one key held under a Session, like etcd's
// concurrency.Mutex: the key is acquired with the session, so it is
// released (or deleted, per the session's Behavior) when the session ends,
// and no two live sessions hold it at once. A Mutex is safe for concurrent
// use; it is one lock, not a re-entrant one.
type Mutex struct {
	s    *Session
	key  string
	opts MutexOptions
	errs *errlog.Run

	mu   sync.Mutex
	held bool
}

// NewMutex is the lock on key under s.
func NewMutex(s *Session, key string, opts MutexOptions) *Mutex {
	if opts.LockDelay == 0 {
		opts.LockDelay = 15 * time.Second
	}
	return &Mutex{s: s, key: key, opts: opts, errs: errlog.NewRetrying(opts.Logf, "lock "+key)}
}

// Key is the locked key.
func (m *Mutex) Key() string { return m.key }

// Session is the session the lock is held under.
func (m *Mutex) Session() *Session { return m.s }

// Held reports whether this Mutex took the lock and has not unlocked it,
// and its session lives. Losing the key otherwise (deleted from outside)
// shows in a read of the key, not here; Election watches for that.
func (m *Mutex) Held() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held && m.s.Err() == nil
}

// TryLock makes one attempt to take the lock. It returns ErrLocked when
// another session holds it, and an error wrapping ErrLocked too when the
// key is free but Consul refused it (lock-delay).
func (m *Mutex) TryLock(ctx context.Context) error {
	got, err := m.acquire(ctx)
	if err != nil {
		return err
	}
	if !got {
		return ErrLocked
	}
	return nil
}

func (m *Mutex) acquire(ctx context.Context) (bool, error) {
	if err := m.s.Err(); err != nil {
		return false, fmt.Errorf("lock %s: %w", m.key, err)
	}
	got, _, err := m.s.client.KV().Acquire(&api.KVPair{Key: m.key, Value: m.opts.Value, Flags: m.opts.Flags, Session: m.s.ID()}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		if IsInvalidSession(err) {
			m.s.Check()
		}
		return false, fmt.Errorf("lock %s: %w", m.key, err)
	}
	if got {
		m.mu.Lock()
		m.held = true
		m.mu.Unlock()
	}
	return got, nil
}

// Lock takes the lock, waiting while another session holds it, until ctx
// ends or the session is lost. It waits in blocking queries on the key,
// never polling at a fixed interval: while the key is held it tries again
// when the key changes. A key that is free but refused (the lock-delay of
// a holder whose session was invalidated) is retried with backoff, the
// delay being at most MutexOptions.LockDelay. Transient Consul errors are
// retried with backoff.
func (m *Mutex) Lock(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.s.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	errBo := backoff.New(DefaultBackoffBase, DefaultBackoffCap)
	delayBo := backoff.New(25*time.Millisecond, min(time.Second, m.opts.LockDelay))
	var index, last uint64 // the next query's WaitIndex, the last answer's index
	waitingFor := ""       // the holder OnWait was last called for
	for {
		if err := m.s.Err(); err != nil {
			return fmt.Errorf("lock %s: %w", m.key, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("lock %s: %w", m.key, ctx.Err())
		}
		pair, meta, err := m.s.client.KV().Get(m.key, (&api.QueryOptions{WaitIndex: index, WaitTime: lockWaitTime}).WithContext(ctx))
		if err == nil {
			index, last = NextIndex(last, meta.LastIndex), meta.LastIndex
			if pair != nil && pair.Session == m.s.ID() {
				// Ours already (an acquire whose answer was lost).
				m.mu.Lock()
				m.held = true
				m.mu.Unlock()
				m.errs.OK()
				return nil
			}
			if pair != nil && pair.Session != "" {
				m.errs.OK()
				if m.opts.OnWait != nil && pair.Session != waitingFor {
					waitingFor = pair.Session
					m.opts.OnWait(ctx, pair)
				}
				continue // held: wait for the key to change
			}
			var got bool
			got, err = m.acquire(ctx)
			if err == nil && got {
				m.errs.OK()
				return nil
			}
			if err == nil {
				// Free but refused: a holder's lock-delay, or a race
				// lost to another session (the next read shows it).
				backoff.Sleep(ctx, delayBo.Next())
				index = 0 // read at once, not waiting for a change
				continue
			}
		}
		if ctx.Err() != nil || m.s.Err() != nil {
			continue
		}
		if !Transient(err) && !IsInvalidSession(err) {
			return fmt.Errorf("lock %s: %w", m.key, err)
		}
		m.errs.Failed(err)
		backoff.Sleep(ctx, errBo.Next())
		index = 0
	}
}

// Unlock releases the lock, keeping the key (with Value and Flags) as a
// release does. It returns ErrNotHeld if this Mutex does not hold it.
func (m *Mutex) Unlock(ctx context.Context) error {
	m.mu.Lock()
	held := m.held
	m.held = false
	m.mu.Unlock()
	if !held {
		return ErrNotHeld
	}
	if m.s.Err() != nil {
		return nil // the session's end released it already
	}
	_, _, err := m.s.client.KV().Release(&api.KVPair{Key: m.key, Value: m.opts.Value, Flags: m.opts.Flags, Session: m.s.ID()}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("unlock %s: %w", m.key, err)
	}
	return nil
}

// nextIndex applies Consul's rules for a blocking query's next WaitIndex,
// given the previous answer's index and this one's: start over (0) when
// the index went backwards (a restored snapshot, a new cluster), and never
// wait on 0, which returns at once.
func NextIndex(prev, last uint64) uint64 {
	if last < prev {
		return 0
	}
	return max(last, 1)
}
