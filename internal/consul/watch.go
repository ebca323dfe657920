package consul

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/backoff"
	"github.com/gpujob/gpujob/internal/errlog"
)

// ErrStopWatch, returned by a Watch's deliver function, ends the watch
// without error.
var ErrStopWatch = errors.New("stop watching")

// Query is one blocking read of Consul: it passes q (WaitIndex, WaitTime,
// the context) to the API and returns what it read and the answer's meta.
// KeyQuery, PrefixQuery and ServiceQuery are the common ones; a Query may
// decode what it read into T.
type Query[T any] func(q *api.QueryOptions) (T, *api.QueryMeta, error)

// Defaults of WatchOptions.
const (
	DefaultWatchWait   = 5 * time.Minute
	DefaultWatchMinGap = 50 * time.Millisecond
)

// WatchOptions pace a Watch. The zero value is usable.
type WatchOptions struct {
	// WaitTime is one blocking query's longest wait (DefaultWatchWait).
	WaitTime time.Duration
	// MinGap is the least time between the starts of two queries
	// (DefaultWatchMinGap; negative: none). Consul advises it: a query
	// that returns at once (an index that went backwards, a key that
	// changes all the time) must not become a busy loop.
	MinGap time.Duration
	// BackoffBase and BackoffCap pace retries after a failed read
	// (DefaultBackoffBase, DefaultBackoffCap), with jitter.
	BackoffBase, BackoffCap time.Duration
	// FailAfter is how many failed reads in a row call OnFailing (1).
	FailAfter int
	// OnFailing is called once when reads have failed FailAfter times in a
	// row, with the last error; OnRecovered when a read works again after
	// that. Both optional; they run on the watch's goroutine.
	OnFailing   func(err error, fails int)
	OnRecovered func(fails int)
	// AllowStale lets any server answer (RequireConsistent is never set).
	AllowStale bool
	// Logf hears of failed reads (throttled, see internal/errlog), as
	// What, each with Note after the error (default " (retrying)");
	// optional.
	Logf func(format string, args ...any)
	What string
	Note string
}

// Watch runs query as a blocking-query loop until ctx ends or deliver
// returns an error, following Consul's rules for the index: it waits on the
// last answer's index, starts over (index 0) when the index goes
// backwards, and never waits on 0, which returns at once. deliver is called
// with the first answer and with every answer whose index differs from the
// last one; a query that merely timed out is not delivered again. Failed
// reads are retried with backoff and jitter; what was delivered last stands
// meanwhile.
//
// Watch returns ctx's error when ctx ends, nil when deliver returns
// ErrStopWatch, and deliver's error otherwise.
func Watch[T any](ctx context.Context, query Query[T], opts WatchOptions, deliver func(v T, index uint64) error) error {
	if opts.WaitTime <= 0 {
		opts.WaitTime = DefaultWatchWait
	}
	if opts.MinGap == 0 {
		opts.MinGap = DefaultWatchMinGap
	}
	if opts.BackoffBase <= 0 {
		opts.BackoffBase = DefaultBackoffBase
	}
	if opts.BackoffCap <= 0 {
		opts.BackoffCap = DefaultBackoffCap
	}
	opts.FailAfter = max(opts.FailAfter, 1)
	if opts.Note == "" {
		opts.Note = " (retrying)"
	}
	errs := errlog.NewNoted(opts.Logf, opts.What, opts.Note)
	bo := backoff.New(opts.BackoffBase, opts.BackoffCap)
	var (
		index     uint64 // the next query's WaitIndex
		last      uint64 // the last answer's index
		delivered bool
		fails     int
		began     time.Time
	)
	for {
		if gap := opts.MinGap - time.Since(began); !began.IsZero() && gap > 0 && !backoff.Sleep(ctx, gap) {
			return ctx.Err()
		}
		began = time.Now()
		q := (&api.QueryOptions{WaitIndex: index, WaitTime: opts.WaitTime, AllowStale: opts.AllowStale}).WithContext(ctx)
		v, meta, err := query(q)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil && meta == nil {
			err = errors.New("consul answered without an index")
		}
		if err != nil {
			fails++
			errs.Failed(err)
			if fails == opts.FailAfter && opts.OnFailing != nil {
				opts.OnFailing(err, fails)
			}
			if !bo.Wait(ctx) {
				return ctx.Err()
			}
			continue
		}
		if fails > 0 {
			errs.OK()
			if fails >= opts.FailAfter && opts.OnRecovered != nil {
				opts.OnRecovered(fails)
			}
			fails = 0
		}
		bo.Reset()
		changed := !delivered || meta.LastIndex != last
		index, last = NextIndex(last, meta.LastIndex), meta.LastIndex
		if !changed {
			continue
		}
		delivered = true
		if err := deliver(v, meta.LastIndex); err != nil {
			if errors.Is(err, ErrStopWatch) {
				return nil
			}
			return err
		}
	}
}

// WatchChan runs Watch in a goroutine and sends what it reads on the
// returned channel, which holds only the latest value: a reader that falls
// behind skips to the newest. The channel is closed when ctx ends.
func WatchChan[T any](ctx context.Context, query Query[T], opts WatchOptions) <-chan T {
	out := make(chan T, 1)
	go func() {
		defer close(out)
		_ = Watch(ctx, query, opts, func(v T, _ uint64) error {
			select {
			case <-out: // drop the unread older value
			default:
			}
			out <- v
			return nil
		})
	}()
	return out
}

// KeyQuery reads one key (nil when absent).
func KeyQuery(client *api.Client, key string) Query[*api.KVPair] {
	return func(q *api.QueryOptions) (*api.KVPair, *api.QueryMeta, error) {
		return client.KV().Get(key, q)
	}
}

// PrefixQuery reads the keys under prefix.
func PrefixQuery(client *api.Client, prefix string) Query[api.KVPairs] {
	return func(q *api.QueryOptions) (api.KVPairs, *api.QueryMeta, error) {
		return client.KV().List(prefix, q)
	}
}

// ServiceQuery reads the instances of a service with their health (only
// those passing their checks if passingOnly), filtered by tag unless "".
func ServiceQuery(client *api.Client, service, tag string, passingOnly bool) Query[[]*api.ServiceEntry] {
	return func(q *api.QueryOptions) ([]*api.ServiceEntry, *api.QueryMeta, error) {
		return client.Health().Service(service, tag, passingOnly, q)
	}
}
